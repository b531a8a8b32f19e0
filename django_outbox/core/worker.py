"""The delivery loop behind ``Outbox.arun`` and ``manage.py outbox_worker``
(docs/reference/commands.md).

Work is found through the due index, never by scanning keys: every tick a
worker reads the workspaces whose earliest due time has passed, then the due
sessions of each (cost follows due sessions, not stored ones). An accept
pushes ``"<ws> <ses>"`` onto a wake list that idle workers wait on with BLMPOP,
so delivery starts at once rather than at the next tick. Each due session gets
one task that steps it (``adeliver_once``) until nothing is due; at most
``concurrency`` such tasks run at once. Staged entries whose lease is gone are
recovered by the claim that next looks at their session (their session is
indexed at the lease's expiry), so recovery is continuous, not only at start.

The reads behind the tick and the wake are :mod:`~django_outbox.core.finding`.
Beside the loop a worker runs its periodic duties, each the same way
(:mod:`~django_outbox.core.duties`): its heartbeat, the key space watch (with a
key space owner: another project's claim stops the worker at once), the per-minute
history, the ledger sweep (with a ledger probe), the cluster's index repair (on a
cluster), then the duties registered in the outbox's ``duties`` list.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

from . import server
from .agents import DEFAULT_AGENT, Agent, probe_agents
from .config import Config
from .duties import Duty
from .duties.heartbeat import HeartbeatOutbox, heartbeat
from .duties.history import HistoryOutbox, history
from .duties.key_space import KeySpaceOutbox, key_space_watch
from .duties.parked_sweep import SweepOutbox, parked_sweep
from .duties.repair import index_repair
from .errors import KeySpaceClaimed, KeySpaceTakenOver, OutboxUnavailable, ServerUnsupported
from .finding import IndexTransport, due_sessions, wait_wake
from .heartbeats import HEARTBEAT_TTL, WorkerHeartbeat
from .step import Claimed
from .unavailable import retry_unavailable

logger = logging.getLogger("django_outbox.worker")

SCAN_LIMIT = 1000  # workspaces, and sessions per workspace, read per scan
WAKE_WAIT_MAX = 2.0  # seconds one BLMPOP may block
WAKE_BATCH = 100  # more wake items one BLMPOP may take at once (a burst of accepts)
SCAN_AGAIN_AFTER = 0.05  # seconds before the next scan when one returned a full page
STARTUP_PATIENCE = 30.0  # seconds start-up retries while Valkey is unavailable


@dataclass
class WorkerStats:
    """Counters of one worker run (also exported as metrics by the management command).

    ``errors`` are the loop's own (a failed scan, wake wait or step); ``receiver_failures``
    are calls of the outbox's event receivers that raised while the run delivered (a Django
    outbox counts them, docs/reference/signals.md, through :data:`running_stats`).
    """

    steps: int = 0
    idle_claims: int = 0
    wakes: int = 0
    scans: int = 0
    errors: int = 0
    receiver_failures: int = 0

    def summary(self) -> str:
        """The run in one line: ``"N steps, M errors"``, where M counts the loop's errors
        and the failed receiver calls, and says how many of them were receivers (each was
        logged with the receiver's name): ``"4 steps, 1 error (1 receiver call failed,
        logged with its name)"``."""
        errors = self.errors + self.receiver_failures
        line = f"{self.steps} steps, {errors} {'error' if errors == 1 else 'errors'}"
        if self.receiver_failures:
            calls = self.receiver_failures
            line += (
                f" ({calls} receiver {'call' if calls == 1 else 'calls'} failed, "
                "logged with the receiver's name)"
            )
        return line


#: The :class:`WorkerStats` of the worker run the current task belongs to (``None`` outside
#: one). The outbox's event hooks run in the run's tasks: through this they know they run
#: in a worker (no request cycle around them) and tell the run about failed receivers.
running_stats: ContextVar[WorkerStats | None] = ContextVar("outbox_worker_stats", default=None)


class WorkerOutbox(
    IndexTransport, HeartbeatOutbox, SweepOutbox, HistoryOutbox, KeySpaceOutbox, Protocol
):
    """What a :class:`Worker` needs of the outbox (the core
    :class:`~django_outbox.core.service.Outbox` provides it): the public members
    below for the loop, the transport the due and wake reads run on
    (:class:`~django_outbox.core.finding.IndexTransport`), and what its duties use
    (each duty module's protocol)."""

    config: Config
    deliverer: Callable[..., Any] | None
    agents: Mapping[str, Any]
    ledger_probe: Callable[..., Any] | None
    duties: list[Duty]
    key_space_owner: Any

    @property
    def read_timeout(self) -> float | None: ...

    async def astep(
        self,
        workspace_id: str,
        session_id: str,
        deliverer: Callable[..., Any] | None,
        carry: Any = None,
        *,
        more: Callable[[], bool] | None = None,
        owner: str | None = None,
    ) -> tuple[bool, Any]: ...
    async def arelease(self, workspace_id: str, session_id: str, carry: Any) -> None: ...
    async def abeat(self, record: WorkerHeartbeat, ttl: float) -> None: ...
    async def aload_scripts(self) -> None: ...
    async def arecover(self) -> int: ...
    async def aclaim_key_space(self, *, force: bool = False) -> Any: ...
    async def aserver_capabilities(self) -> list[server.ServerCapabilities]: ...


class Worker:
    """Runs deliveries until ``stop`` is set (or, with ``once``, until nothing is due).

    ``concurrency`` bounds sessions delivered at once; ``tick`` (seconds) is the
    safety-net scan interval and the BLMPOP timeout; ``grace`` (seconds) is how
    long in-flight deliveries may finish after ``stop`` before they are
    cancelled (a cancelled delivery is recorded as ambiguous and verified
    later). ``heartbeat`` publishes a liveness record readable by the admin.
    ``duties`` are run beside the worker's own (:mod:`~django_outbox.core.duties`);
    None: the outbox's ``duties``. ``worker_id`` names the worker in its heartbeat,
    its logs and its lease tokens (default ``<host>-<pid>-<random>``).

    With the outbox's ``key_space_owner`` set, the worker confirms the key space's claim
    every ``claim_recheck`` seconds (2 s) while it runs; finding another project's claim
    it stops at once: no further claim, its in-flight deliveries cancelled without
    grace (each recorded as ambiguous, or left staged under its lease, so the new owner's
    workers verify it before anything is sent again: nothing is lost), and :meth:`run`
    raises :class:`~django_outbox.core.errors.KeySpaceTakenOver`
    (docs/howto/valkey.md#taking-a-key-space-over).
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
        duties: Iterable[Duty] | None = None,
    ) -> None:
        self.outbox = outbox
        if deliverer is None and outbox.deliverer is None and not outbox.agents:
            raise ValueError("no deliverer: pass one or configure DELIVERER or AGENTS")
        #: The deliverer every step uses instead of the session's agent's; None (the
        #: usual case): each session's agent's (docs/howto/agents.md).
        self.deliverer: Callable[..., Any] | None = deliverer
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
        #: What the worker runs beside the loop, in this order (stopping: reversed).
        self.duties: list[Duty] = [
            *self._own_duties(),
            *(outbox.duties if duties is None else duties),
        ]
        self._ready: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._queued: set[tuple[str, str]] = set()
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._slots = asyncio.Semaphore(concurrency)
        self._changed = asyncio.Event()
        self._freed = asyncio.Event()  # set when a delivery task ends (a slot is free)
        #: Sessions the last scan offered that were neither queued nor running.
        self.fresh = 0
        #: Set when another project took the key space over: the worker stops at once
        #: and :meth:`run` raises it.
        self.taken_over: KeySpaceTakenOver | None = None

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
        workspace (:func:`~django_outbox.core.finding.due_sessions`).
        """
        due = await due_sessions(self.outbox, SCAN_LIMIT)
        self.stats.scans += 1
        self.fresh = 0
        for ws, ses in due:
            self.fresh += self._offer(ws, ses)
        return len(due)

    async def _wake_loop(self, key: str) -> None:
        """Wait on one wake list; BLMPOP hands each item to exactly one worker. (A
        cluster has one wake list per shard and every worker waits on each.)"""
        # Block for less than the client's socket timeout (5 s unless the URL or the
        # client options say otherwise), whatever the tick: a longer BLMPOP would time
        # out on the socket, be retried, and count as an error.
        block = min(max(self.tick, 0.01), WAKE_WAIT_MAX)
        read_timeout = self.outbox.read_timeout
        if read_timeout:
            block = min(block, read_timeout / 2)
        while not self.stop.is_set():
            # Take only what a free slot can start: an item left in the list goes to
            # a worker with room (several workers share one backlog evenly).
            self._freed.clear()
            room = self.concurrency - len(self._running) - self._ready.qsize()
            if room <= 0:
                await self._freed.wait()
                continue
            try:
                pairs = await wait_wake(self.outbox, key, block, min(WAKE_BATCH, room - 1))
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

    # -- duties ----------------------------------------------------------------------------

    def _own_duties(self) -> list[Duty]:
        """The duties of the worker itself, as far as its outbox calls for them."""
        outbox = self.outbox
        own = []
        if self.heartbeat:
            own.append(heartbeat(outbox, self.id, self.beat))
        if outbox.key_space_owner is not None:
            own.append(key_space_watch(outbox, self._lose_key_space))
        if outbox.cluster:
            own.append(index_repair(outbox))
        if outbox.ledger_probe is not None:
            own.append(parked_sweep(outbox, self.id))
        if outbox.history_counter.enabled:
            own.append(history(outbox, self.id))
        return own

    def _lose_key_space(self, claimed: KeySpaceClaimed) -> None:
        """Another project holds the key space now: stop at once. Nothing more is claimed
        (``stop`` is set before the loop runs again) and the running deliveries are
        cancelled now, not after ``grace``: a delivery cancelled mid-call is recorded as
        ambiguous, as at the end of a grace, or stays staged under its lease until it
        expires; either way the new owner's workers verify it (docs/howto/valkey.md)."""
        if self.taken_over is not None:
            return
        self.taken_over = KeySpaceTakenOver(claimed.prefix, claimed.claimed_by)
        logger.error(
            "outbox worker %s: %s; %d in-flight deliveries cancelled",
            self.id,
            self.taken_over,
            len(self._running),
        )
        self.stop.set()
        for task in self._running.values():
            task.cancel()

    async def _keep(self, duty: Duty) -> None:
        """Run ``duty``'s passes until the worker stops (the timing is :class:`Duty`'s)."""
        wait = duty.interval if duty.first_after is None else duty.first_after
        while True:
            if wait > 0:
                await self._sleep(wait)
            if self.stop.is_set():
                return
            try:
                await duty.run()
            except Exception as exc:
                logger.warning("outbox worker %s: %s failed: %s", self.id, duty.name, exc)
            wait = duty.interval

    async def _begin(self) -> None:
        """The duties' first words before anything is delivered, in the duties' order."""
        await self._each_hook((duty.name, duty.start) for duty in self.duties)

    async def _finish(self) -> None:
        """The duties' last words once the worker has stopped, last duty first."""
        await self._each_hook((duty.name, duty.finish) for duty in reversed(self.duties))

    async def _each_hook(
        self, hooks: Iterable[tuple[str, Callable[[], Awaitable[object]] | None]]
    ) -> None:
        """Await each ``(duty name, hook)`` set in turn; a failure is logged as a pass's is."""
        for name, hook in hooks:
            if hook is None:
                continue
            try:
                await hook()
            except Exception as exc:
                logger.warning("outbox worker %s: %s failed: %s", self.id, name, exc)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Claim the key space, recover, then deliver until stopped; every task is joined
        before returning. Raises :class:`~django_outbox.core.errors.AgentMisconfigured`
        before anything else when an agent's start-up probe says it refuses the settings
        (docs/howto/agents.md#the-start-up-probe),
        :class:`~django_outbox.core.errors.KeySpaceClaimed` at
        once when another project holds the key space,
        :class:`~django_outbox.core.errors.KeySpaceTakenOver` once stopped because another
        project claimed it while the worker ran, and
        :class:`~django_outbox.core.errors.ServerUnsupported` when the server cannot do
        what the settings ask (docs/howto/valkey.md)."""
        # Every task made below copies the context, and with it the run's stats.
        running = running_stats.set(self.stats)
        try:
            return await self._run()
        finally:
            running_stats.reset(running)

    async def _run(self) -> WorkerStats:
        outbox = self.outbox
        await self._probe_agents()
        recovered = await self._patiently(self._start)
        if recovered:
            logger.info("outbox worker %s: recovered %d staged entries", self.id, recovered)
        await self._begin()
        helpers: list[asyncio.Task[None]] = [asyncio.create_task(self._relay_stop())]
        helpers += [
            asyncio.create_task(self._keep(duty), name=f"outbox duty {duty.name}")
            for duty in self.duties
            if duty.burst or not self.once
        ]
        if self.once:
            await self._patiently(self.scan)
        else:
            for key in outbox.keys.index_keys("wake"):
                helpers.append(asyncio.create_task(self._wake_loop(key)))
            helpers.append(asyncio.create_task(self._tick_loop()))
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
            await self._finish()
            logger.info("outbox worker %s stopped: %s", self.id, self.stats)
        if self.taken_over is not None:
            raise self.taken_over
        return self.stats

    async def _probe_agents(self) -> None:
        """Ask each agent with a start-up probe whether it takes what the settings name
        (:func:`~django_outbox.core.agents.probe_agents`): raises
        :class:`~django_outbox.core.errors.AgentMisconfigured` when one says no; a probe
        that could not tell is logged, and the worker starts
        (docs/howto/agents.md#the-start-up-probe)."""
        agents = list(self.outbox.agents.values())
        if self.outbox.deliverer is not None:
            agents.append(Agent(DEFAULT_AGENT, self.outbox.deliverer))
        for warning in await probe_agents(agents):
            logger.warning("outbox worker %s: %s", self.id, warning)

    async def _start(self) -> int:
        # Nothing is recovered or delivered on a server that cannot do what the settings
        # ask, nor in a key space another project claimed (ServerUnsupported and
        # KeySpaceClaimed propagate: neither is an outage to wait out).
        unmet = server.unmet(
            await self.outbox.aserver_capabilities(), wait_aof=self.outbox.config.wait_aof
        )
        if unmet:
            raise ServerUnsupported(unmet)
        await self.outbox.aclaim_key_space()
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
        # After a takeover the tasks are cancelled already: this waits for their
        # cancellation's own bookkeeping (the ambiguous settle) only.
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
