"""The delivery loop behind ``Outbox.arun`` and ``manage.py outbox_worker`` (README "The worker").

Work is found through the due index, never by scanning keys: every tick a
worker reads the workspaces whose earliest due time has passed, then the due
sessions of each (cost follows due sessions, not stored ones). An accept
pushes ``"<ws> <ses>"`` onto a wake list that idle workers wait on with BLMPOP,
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
from typing import Any, Protocol

from .config import Config
from .delivery import Claimed
from .errors import OutboxUnavailable
from .history import FLUSH_EVERY
from .keys import KeySpace
from .reads import HEARTBEAT_INTERVAL, HEARTBEAT_TTL, WorkerHeartbeat
from .unavailable import retry_unavailable

logger = logging.getLogger("django_outbox.worker")

SCAN_LIMIT = 1000  # workspaces, and sessions per workspace, read per scan
WAKE_WAIT_MAX = 2.0  # seconds one BLMPOP may block
WAKE_BATCH = 100  # more wake items one BLMPOP may take at once (a burst of accepts)
SCAN_AGAIN_AFTER = 0.05  # seconds before the next scan when one returned a full page
STARTUP_PATIENCE = 30.0  # seconds start-up retries while Valkey is unavailable
REPAIR_INTERVAL = 10.0  # seconds between passes of the cluster index repair
REPAIR_BATCH = 100  # workspaces per shard per repair pass (SSCAN COUNT hint)
SAMPLE_EVERY = 20.0  # seconds between tries to sample the minute's depth (one worker wins)
FIRST_SAMPLE_AFTER = 5.0  # seconds from start to a worker's first try


@dataclass
class WorkerStats:
    """Counters of one worker run (also exported as metrics by the management command)."""

    steps: int = 0
    idle_claims: int = 0
    wakes: int = 0
    scans: int = 0
    errors: int = 0


class WorkerOutbox(Protocol):
    """What a :class:`Worker` needs of the outbox: public members only (the core
    :class:`~django_outbox.core.service.Outbox` provides them)."""

    config: Config
    keys: KeySpace
    cluster: bool
    deliverer: Callable[..., Any] | None
    ledger_probe: Callable[..., Any] | None
    history_counter: Any

    async def astep(
        self,
        workspace_id: str,
        session_id: str,
        deliverer: Callable[..., Any],
        carry: Any = None,
        *,
        more: Callable[[], bool] | None = None,
        owner: str | None = None,
    ) -> tuple[bool, Any]: ...
    async def arelease(self, workspace_id: str, session_id: str, carry: Any) -> None: ...
    async def adue_sessions(self, limit: int) -> list[tuple[str, str]]: ...
    async def await_wake(self, key: str, block: float, batch: int) -> list[tuple[str, str]]: ...
    async def arepair_indices(self, cursors: dict[int, int], batch: int) -> int: ...
    async def abeat(self, record: WorkerHeartbeat, ttl: float) -> None: ...
    async def aforget_worker(self, worker_id: str) -> None: ...
    async def aworkspaces(self) -> list[str]: ...
    async def asweep_workspace_parked_errors(self, workspace_id: str) -> int: ...
    async def aload_scripts(self) -> None: ...
    async def arecover(self) -> int: ...
    async def aflush_history(self, counter: Any) -> int: ...
    async def asample_history(self, worker_id: str) -> bool: ...


class Worker:
    """Runs deliveries until ``stop`` is set (or, with ``once``, until nothing is due).

    ``concurrency`` bounds sessions delivered at once; ``tick`` (seconds) is the
    safety-net scan interval and the BLMPOP timeout; ``grace`` (seconds) is how
    long in-flight deliveries may finish after ``stop`` before they are
    cancelled (a cancelled delivery is recorded as ambiguous and verified
    later). ``heartbeat`` publishes a liveness record readable by the admin.
    """

    def __init__(
        self,
        outbox: WorkerOutbox,
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
        chosen = deliverer or outbox.deliverer
        if chosen is None:
            raise ValueError("no deliverer: pass one or configure DELIVERER")
        self.deliverer: Callable[..., Any] = chosen
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
        self.started = time.time()
        self.stats = WorkerStats()
        self._ready: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._slots = asyncio.Semaphore(concurrency)
        self._changed = asyncio.Event()
        self._freed = asyncio.Event()  # set when a delivery task ends (a slot is free)
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

        Reads the workspaces-due index, then the due sessions of each due
        workspace (:meth:`~django_outbox.core.base.OutboxBase.adue_sessions`).
        """
        due = await self.outbox.adue_sessions(SCAN_LIMIT)
        self.stats.scans += 1
        self.fresh = 0
        for ws, ses in due:
            self.fresh += self._offer(ws, ses)
        return len(due)

    async def _wake_loop(self, key: str) -> None:
        """Wait on one wake list; BLMPOP hands each item to exactly one worker. (A
        cluster has one wake list per shard and every worker waits on each.)"""
        # Block for less than the client's socket timeout (5 s), whatever the tick:
        # a longer BLMPOP would time out on the socket and count as an error.
        block = min(max(self.tick, 0.01), WAKE_WAIT_MAX)
        while not self.stop.is_set():
            # Take only what a free slot can start: an item left in the list goes to
            # a worker with room (several workers share one backlog evenly).
            self._freed.clear()
            room = self.concurrency - len(self._running) - self._ready.qsize()
            if room <= 0:
                await self._freed.wait()
                continue
            try:
                pairs = await self.outbox.await_wake(key, block, min(WAKE_BATCH, room - 1))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.stats.errors += 1
                logger.warning("outbox worker %s: wake wait failed: %s", self.id, exc)
                await self._sleep(self.tick)
                continue
            for ws, ses in pairs:
                self.stats.wakes += 1
                self._offer(ws, ses)

    def _running_on(self) -> bool:
        """Whether the worker goes on (not stopping): asked after each delivery."""
        return not self.stop.is_set()

    async def _relay_stop(self) -> None:
        """Set the events the loops wait on once the worker stops: each loop waits on its
        one event and looks at ``stop`` when it wakes, rather than making a task per wait
        to watch ``stop`` as well (the dispatcher waits once per burst of work)."""
        await self.stop.wait()
        self._changed.set()
        self._freed.set()

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
            # A carry that holds the next claim (delivery.Claimed) is stepped even after
            # stop: its entry is staged under our lease, and delivering it within the
            # grace beats leaving it to be verified. No further claim is made then.
            while not self.stop.is_set() or isinstance(carry, Claimed):
                took, carry = await self.outbox.astep(
                    ws, ses, self.deliverer, carry, more=self._running_on, owner=self.id
                )
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
                    await self._release(ws, ses, carry)
                except Exception as exc:
                    logger.warning("outbox worker %s: release failed: %s", self.id, exc)
            self._running.pop(key, None)
            self._slots.release()
            self._changed.set()
            self._freed.set()
            if key in self._dirty and not self.stop.is_set():
                self._dirty.discard(key)
                self._offer(ws, ses)

    async def _release(self, ws: str, ses: str, carry: Any) -> None:
        """Hand back the lease a step left us (:meth:`Outbox.arelease`), waiting out a
        short outage for up to half a lease, as a settle does. A release lost to a
        failover or a cut connection would otherwise leave the session waiting for the
        lease to expire (``LOCK_TTL``, 30 s by default). Raises
        :class:`OutboxUnavailable` after that, or after one failure once stopping."""
        await retry_unavailable(
            lambda: self.outbox.arelease(ws, ses, carry),
            patience=self.outbox.config.lock_ttl / 2,
            first_delay=0.05,
            max_delay=1.0,
            what=f"releasing the lease of {ws}/{ses}",
            give_up=self.stop.is_set,
        )

    async def _dispatch(self) -> None:
        while not self.stop.is_set():
            if self._ready.empty():
                if self.once and not self._running:
                    return
                self._changed.clear()
                await self._changed.wait()
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
            steps=self.stats.steps,
        )

    async def beat(self) -> None:
        """Publish this worker's heartbeat (read by the admin and ``outbox_worker --check``)."""
        await self.outbox.abeat(self.heartbeat_record(), HEARTBEAT_TTL)

    async def _heartbeat_loop(self) -> None:
        while not self.stop.is_set():
            try:
                await self.beat()
            except Exception as exc:
                logger.warning("outbox worker %s: heartbeat failed: %s", self.id, exc)
            await self._sleep(HEARTBEAT_INTERVAL)

    async def _forget(self) -> None:
        try:
            await self.outbox.aforget_worker(self.id)
        except Exception:
            pass

    async def repair_indices(self, cursors: dict[int, int] | None = None) -> int:
        """Cluster only: one paced pass of the index repair (at most ``REPAIR_BATCH``
        workspaces per shard); returns workspaces checked. ``cursors`` carries the
        scan positions from pass to pass."""
        return await self.outbox.arepair_indices({} if cursors is None else cursors, REPAIR_BATCH)

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

    async def write_history(self, *, sample: bool = False) -> None:
        """Write the settles counted since the last write into the per-minute history
        and, with ``sample``, sample the minute's depth unless another worker did
        (README "Dashboard"). Failures are logged; the counts wait for the next write."""
        outbox = self.outbox
        try:
            if outbox.history_counter.pending or outbox.history_counter.offset_us is None:
                await outbox.aflush_history(outbox.history_counter)
            if sample:
                await outbox.asample_history(self.id)
        except Exception as exc:
            logger.warning("outbox worker %s: writing history failed: %s", self.id, exc)

    async def _history_loop(self) -> None:
        # The first sample FIRST_SAMPLE_AFTER seconds in, not at start: the sample reads
        # every session's statuses, which a short run would pay for per message.
        sampled_at = time.monotonic() - SAMPLE_EVERY + FIRST_SAMPLE_AFTER
        while not self.stop.is_set():
            due = time.monotonic() - sampled_at >= SAMPLE_EVERY
            if due:
                sampled_at = time.monotonic()
            await self.write_history(sample=due)
            await self._sleep(FLUSH_EVERY)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Recover, then deliver until stopped; every task is joined before returning."""
        outbox = self.outbox
        recovered = await self._patiently(self._start)
        if recovered:
            logger.info("outbox worker %s: recovered %d staged entries", self.id, recovered)
        helpers: list[asyncio.Task[None]] = [asyncio.create_task(self._relay_stop())]
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
            if outbox.history_counter.enabled:
                helpers.append(asyncio.create_task(self._history_loop()))
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
            if outbox.history_counter.enabled:
                await self.write_history()
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
