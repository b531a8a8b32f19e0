"""The delivery loop behind ``Outbox.arun`` and ``manage.py outbox_worker`` (DESIGN sections 6, 12).

Work is found through the due index, never by scanning keys: every tick a
worker reads the workspaces whose earliest due time has passed, then the due
sessions of each (cost follows due sessions, not stored ones). An accept
pushes ``"<ws> <ses>"`` onto a wake list that idle workers wait on with BLPOP,
so delivery starts at once rather than at the next tick. Each due session gets
one task that steps it (``adeliver_once``) until nothing is due; at most
``concurrency`` such tasks run at once. Staged entries whose lease is gone are
recovered by the claim that next looks at their session (their session is
indexed at the lease's expiry), so recovery is continuous, not only at start.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import OutboxUnavailable
from .reads import HEARTBEAT_INTERVAL, HEARTBEAT_TTL, WorkerHeartbeat

if TYPE_CHECKING:
    from .service import Outbox

logger = logging.getLogger("django_outbox.worker")

SCAN_LIMIT = 1000  # workspaces, and sessions per workspace, read per scan
WAKE_WAIT_MAX = 2.0  # seconds one BLPOP may block
WAKE_BATCH = 100  # wake items taken at once after a BLPOP returns (LPOP count)
SCAN_AGAIN_AFTER = 0.05  # seconds before the next scan when one returned a full page
STARTUP_PATIENCE = 30.0  # seconds start-up retries while Valkey is unavailable
REPAIR_INTERVAL = 10.0  # seconds between passes of the cluster index repair
REPAIR_BATCH = 100  # workspaces per shard per repair pass (SSCAN COUNT hint)


@dataclass
class WorkerStats:
    """Counters of one worker run (also exported as metrics by the management command)."""

    steps: int = 0
    idle_claims: int = 0
    wakes: int = 0
    scans: int = 0
    errors: int = 0


class Worker:
    """Runs deliveries until ``stop`` is set (or, with ``once``, until nothing is due).

    ``concurrency`` bounds sessions delivered at once; ``tick`` (seconds) is the
    safety-net scan interval and the BLPOP timeout; ``grace`` (seconds) is how
    long in-flight deliveries may finish after ``stop`` before they are
    cancelled (a cancelled delivery is recorded as ambiguous and verified
    later). ``heartbeat`` publishes a liveness record readable by the admin.
    """

    def __init__(
        self,
        outbox: Outbox,
        deliverer: Callable[..., Any] | None,
        *,
        concurrency: int,
        tick: float,
        stop: asyncio.Event,
        grace: float = 30.0,
        once: bool = False,
        heartbeat: bool = True,
        worker_id: str | None = None,
    ) -> None:
        self.outbox = outbox
        self.deliverer = deliverer or outbox.deliverer
        if self.deliverer is None:
            raise ValueError("no deliverer: pass one or configure DELIVERER")
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if tick <= 0:
            raise ValueError("tick must be positive")
        self.concurrency = concurrency
        self.tick = tick
        self.stop = stop
        self.grace = grace
        self.once = once
        self.heartbeat = heartbeat
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        outbox.owner = self.id
        self.started = time.time()
        self.stats = WorkerStats()
        self._ready: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._slots = asyncio.Semaphore(concurrency)
        self._changed = asyncio.Event()
        #: Sessions the last scan offered that were neither queued nor running.
        self.fresh = 0

    # -- finding work ----------------------------------------------------------------

    def _offer(self, ws: str, ses: str) -> bool:
        """Queue a session for delivery; True if it was neither queued nor running."""
        key = (ws, ses)
        if key in self._running:
            self._dirty.add(key)  # look again when the running task is done
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)
            self._changed.set()
            return True
        return False

    async def scan(self) -> int:
        """Offer every session due now; return how many were found.

        Reads the workspaces-due index (every shard of it on a cluster), then the
        due sessions of each due workspace. On a cluster a shard's score may be
        early (see index.lua); a workspace found with nothing due gets its true
        earliest time back with :meth:`_raise_scores`.
        """
        outbox = self.outbox
        now_ms = outbox._now_us() // 1000
        client = outbox._aclient()
        pipe = client.pipeline(transaction=False)
        for key in outbox.keys.index_keys("wsdue"):
            pipe.zrangebyscore(key, "-inf", now_ms, start=0, num=SCAN_LIMIT, withscores=True)
        workspaces = {
            ws.decode(): int(score) for shard in await pipe.execute() for ws, score in shard
        }
        self.stats.scans += 1
        self.fresh = 0
        if not workspaces:
            return 0
        found = 0
        idle: dict[str, int] = {}
        pipe = client.pipeline(transaction=False)
        for ws in workspaces:
            pipe.zrangebyscore(outbox.keys.due(ws), "-inf", now_ms, start=0, num=SCAN_LIMIT)
        for ws, sessions in zip(workspaces, await pipe.execute(), strict=True):
            if not sessions:
                idle[ws] = workspaces[ws]
            for ses in sessions:
                self.fresh += self._offer(ws, ses.decode())
                found += 1
        if idle and outbox.cluster:
            await self._raise_scores(idle)
        return found

    async def _raise_scores(self, idle: dict[str, int]) -> None:
        """Cluster only: move workspaces whose shard score was early to their true
        earliest due time. Remove-then-recheck: drop the score only if it is still
        the one read (index.lua 'drop'), then read the workspace's own due index and
        add its earliest time back with ZADD LT, so a hint that arrived meanwhile
        is never overwritten by a later time."""
        outbox = self.outbox
        client = outbox._aclient()
        keys = outbox.keys

        async def one(ws: str, score: int) -> None:
            shard = keys.shard_keys(keys.shard_of(ws))
            await outbox._aevalsha(client, "index", shard, ["drop", ws, score])
            first = await client.zrange(keys.due(ws), 0, 0, withscores=True)
            if first:
                await client.zadd(shard[0], {ws: int(first[0][1])}, lt=True)

        await asyncio.gather(*(one(ws, score) for ws, score in idle.items()))

    async def _wake_loop(self, key: str) -> None:
        """Wait on one wake list; BLPOP hands each item to exactly one worker. (A
        cluster has one wake list per shard and every worker waits on each.)"""
        client = self.outbox._aclient()
        # Block for less than the client's socket timeout (5 s), whatever the tick:
        # a longer BLPOP would time out on the socket and count as an error.
        timeout = min(max(self.tick, 0.01), WAKE_WAIT_MAX)
        while not self.stop.is_set():
            try:
                item = await client.blpop([key], timeout=timeout)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.errors += 1
                logger.warning("outbox worker %s: wake wait failed: %s", self.id, exc)
                await self._sleep(self.tick)
                continue
            if item is None:
                continue
            items = [item[1]]
            try:  # a burst of accepts: take what else is waiting in one round trip
                items += await client.lpop(key, WAKE_BATCH) or []
            except Exception as exc:  # the items already taken are still offered
                logger.warning("outbox worker %s: wake read failed: %s", self.id, exc)
            for raw in items:
                ws, _, ses = raw.decode().partition(" ")
                if ws and ses:
                    self.stats.wakes += 1
                    self._offer(ws, ses)

    async def _tick_loop(self) -> None:
        while not self.stop.is_set():
            try:
                found = await self.scan()
            except Exception as exc:
                self.stats.errors += 1
                logger.warning("outbox worker %s: scan failed: %s", self.id, exc)
                found = 0
            if found >= SCAN_LIMIT and self.fresh >= SCAN_LIMIT // 2:
                # Mostly new work in a full page: more may be due behind it (a start
                # after a burst of accepts). Look again as soon as the sessions just
                # offered are claimed (their scores then move on). A backlog that only
                # waits for free slots finds few new sessions and keeps the tick.
                await self._sleep(SCAN_AGAIN_AFTER)
                continue
            await self._sleep(self.tick)

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self.stop.wait(), seconds)
        except TimeoutError:
            pass

    # -- delivering ------------------------------------------------------------------

    async def _work(self, ws: str, ses: str) -> None:
        key = (ws, ses)
        carry = None
        try:
            while not self.stop.is_set():
                took, carry = await self.outbox._astep(ws, ses, self.deliverer, carry)
                if took:
                    self.stats.steps += 1
                    continue
                self.stats.idle_claims += 1
                if key in self._dirty:
                    self._dirty.discard(key)
                    continue
                break
        except OutboxUnavailable as exc:
            self.stats.errors += 1
            logger.warning("outbox worker %s: %s/%s: %s", self.id, ws, ses, exc)
        except Exception:
            self.stats.errors += 1
            logger.exception("outbox worker %s: %s/%s failed", self.id, ws, ses)
        finally:
            if carry is not None:  # a delivered entry's lease, still ours: hand it back
                try:
                    await self.outbox._arun(self.outbox._release_plan(ws, ses, *carry))
                except Exception as exc:
                    logger.warning("outbox worker %s: release failed: %s", self.id, exc)
            self._running.pop(key, None)
            self._slots.release()
            self._changed.set()
            if key in self._dirty and not self.stop.is_set():
                self._dirty.discard(key)
                self._offer(ws, ses)

    async def _dispatch(self) -> None:
        while not self.stop.is_set():
            if self._ready.empty():
                if self.once and not self._running:
                    return
                self._changed.clear()
                waiter = asyncio.ensure_future(self._changed.wait())
                stopper = asyncio.ensure_future(self.stop.wait())
                try:
                    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                    stopper.cancel()
                continue
            await self._slots.acquire()
            if self.stop.is_set():
                self._slots.release()
                return
            ws, ses = self._ready.get_nowait()
            self._queued.discard((ws, ses))
            self._running[(ws, ses)] = asyncio.create_task(
                self._work(ws, ses), name=f"outbox:{ws}/{ses}"
            )

    # -- liveness ------------------------------------------------------------------------

    def heartbeat_record(self) -> WorkerHeartbeat:
        """What this worker publishes now (read back by ``Outbox.workers``)."""
        return WorkerHeartbeat(
            id=self.id,
            last_seen=time.time(),
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self.started,
            in_flight=len(self._running),
            concurrency=self.concurrency,
        )

    async def beat(self) -> None:
        outbox = self.outbox
        client = outbox._aclient()
        record = self.heartbeat_record()
        pipe = client.pipeline(transaction=False)
        pipe.set(outbox.keys.heartbeat(self.id), record.to_json(), px=int(HEARTBEAT_TTL * 1000))
        pipe.zadd(outbox.keys.workers, {self.id: int(record.last_seen * 1000)})
        pipe.zremrangebyscore(
            outbox.keys.workers, "-inf", int((time.time() - 10 * HEARTBEAT_TTL) * 1000)
        )
        await pipe.execute()

    async def _heartbeat_loop(self) -> None:
        while not self.stop.is_set():
            try:
                await self.beat()
            except Exception as exc:
                logger.warning("outbox worker %s: heartbeat failed: %s", self.id, exc)
            await self._sleep(HEARTBEAT_INTERVAL)

    async def _forget(self) -> None:
        client = self.outbox._aclient()
        try:
            await client.delete(self.outbox.keys.heartbeat(self.id))
            await client.zrem(self.outbox.keys.workers, self.id)
        except Exception:
            pass

    async def repair_indices(self, cursors: dict[int, int] | None = None) -> int:
        """Cluster only: one paced pass of the index repair; returns workspaces checked.

        A shard's workspaces-due score is written by the client *after* the
        script (the hint). A client that dies between the two (and whose caller
        never retries) leaves a workspace due in its own index but not in the
        shard's. This walks each shard's workspaces SET with SSCAN, at most
        ``REPAIR_BATCH`` workspaces per shard per pass, and adds each one's
        earliest due time with ZADD LT (never later than it is). ``cursors``
        carries the SSCAN positions from pass to pass.
        """
        outbox = self.outbox
        client = outbox._aclient()
        keys = outbox.keys
        cursors = {} if cursors is None else cursors
        checked = 0
        for shard in range(keys.shards):
            shard_keys = keys.shard_keys(shard)
            cursor, members = await client.sscan(
                shard_keys[1], cursors.get(shard, 0), count=REPAIR_BATCH
            )
            cursors[shard] = cursor
            workspaces = [m.decode() for m in members]
            if not workspaces:
                continue
            pipe = client.pipeline(transaction=False)
            for ws in workspaces:
                pipe.zrange(keys.due(ws), 0, 0, withscores=True)
            earliest = {
                ws: int(first[0][1])
                for ws, first in zip(workspaces, await pipe.execute(), strict=True)
                if first
            }
            if earliest:
                await client.zadd(shard_keys[0], earliest, lt=True)
            checked += len(workspaces)
        return checked

    async def _repair_loop(self) -> None:
        cursors: dict[int, int] = {}
        while not self.stop.is_set():
            await self._sleep(REPAIR_INTERVAL)
            if self.stop.is_set():
                return
            try:
                await self.repair_indices(cursors)
            except Exception as exc:
                logger.warning("outbox worker %s: index repair failed: %s", self.id, exc)

    async def _parked_sweep_loop(self) -> None:
        outbox = self.outbox
        interval = outbox.config.parked_sweep_interval
        while not self.stop.is_set():
            await self._sleep(interval)
            if self.stop.is_set():
                return
            try:
                for ws in await outbox.aworkspaces():
                    swept = await outbox.asweep_workspace_parked_errors(ws)
                    if swept:
                        logger.info("outbox worker %s: ledger sweep of %s: %d", self.id, ws, swept)
            except Exception as exc:
                logger.warning("outbox worker %s: ledger sweep failed: %s", self.id, exc)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Recover, then deliver until stopped; every task is joined before returning."""
        outbox = self.outbox
        recovered = await self._patiently(self._start)
        if recovered:
            logger.info("outbox worker %s: recovered %d staged entries", self.id, recovered)
        helpers: list[asyncio.Task[None]] = []
        if self.heartbeat:
            helpers.append(asyncio.create_task(self._heartbeat_loop()))
        if self.once:
            await self._patiently(self.scan)
        else:
            for key in outbox.keys.index_keys("wake"):
                helpers.append(asyncio.create_task(self._wake_loop(key)))
            if outbox.cluster:
                helpers.append(asyncio.create_task(self._repair_loop()))
            helpers.append(asyncio.create_task(self._tick_loop()))
            if outbox.ledger_probe is not None:
                helpers.append(asyncio.create_task(self._parked_sweep_loop()))
        logger.info(
            "outbox worker %s started (concurrency %d, tick %ss)",
            self.id,
            self.concurrency,
            self.tick,
        )
        try:
            await self._dispatch()
        finally:
            self.stop.set()
            await self._drain()
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
            if self.heartbeat:
                await self._forget()
            logger.info("outbox worker %s stopped: %s", self.id, self.stats)
        return self.stats

    async def _start(self) -> int:
        await self.outbox.aload_scripts()
        return await self.outbox.arecover()

    async def _patiently(self, step: Callable[[], Any]) -> Any:
        """Run a start-up step, retrying while Valkey is briefly unavailable (a restart,
        a cut connection) for up to ``STARTUP_PATIENCE`` seconds."""
        from .service import retry_unavailable

        return await retry_unavailable(
            step,
            patience=STARTUP_PATIENCE,
            first_delay=0.1,
            max_delay=2.0,
            what=f"worker {self.id} start-up",
            sleep=self._sleep,
            give_up=self.stop.is_set,
        )

    async def _drain(self) -> None:
        """Let in-flight deliveries finish for ``grace`` seconds, then cancel them."""
        tasks = list(self._running.values())
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=self.grace)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning(
                "outbox worker %s: cancelled %d deliveries after %ss grace; they will be verified",
                self.id,
                len(pending),
                self.grace,
            )
            await asyncio.gather(*pending, return_exceptions=True)
