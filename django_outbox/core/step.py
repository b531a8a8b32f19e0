"""The delivery step: claim a session's lease, deliver or verify its head, settle.

:class:`DeliveryStep` adds to :class:`~django_outbox.core.base.OutboxBase`
the step a worker takes for one session (docs/explanation/lifecycle.md):

1. ``claim.lua`` takes the session's lease (``LOCK_TTL``) and stages its head
   entry, or answers that the session is busy, has nothing due, or owes an
   ``entry_delivered`` that a dead holder could not acknowledge;
2. the deliverer (or, for an entry whose last outcome is unknown, the
   verifier) is called while the
   :class:`~django_outbox.core.leases.LeaseKeeper` renews the lease every third
   of ``LOCK_TTL``; its ending is classified into an outcome
   (:class:`~django_outbox.core.calling.AgentCalls`);
3. ``settle.lua`` records the outcome and releases the lease in one script; a
   delivered entry stays staged until ``entry_delivered`` ran, and is
   acknowledged by the release (or by the next claim, which reuses the lease:
   the *carry*). If an emit hook raises
   :class:`~django_outbox.core.errors.SignalOwed` it is not acknowledged: the
   lease is left to expire and the next claim fires the owed signal again.

:meth:`DeliveryStep.arecover` returns staged entries whose lease is gone to
their queue as verifying. Deliverers answer by returning or by raising one of
the three outcome errors of :mod:`~django_outbox.core.errors`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .agents import current_agent
from .calling import AgentCalls
from .entry import Entry, OutboxEvent
from .history import HistoryReads
from .keys import SessionKeys
from .leases import LeaseKeeper
from .owed import OwedSignals
from .plans import Emit, Eval, Pipe, Plan, iter_once
from .replies import ClaimReply, OperatorReply, SettleNextReply, SettleReply
from .rules import MAX_ERROR_CHARS, clean_text
from .scripts import (
    claim_argv,
    due_argv,
    hold_argv,
    release_argv,
    settle_argv,
    settle_next_argv,
)
from .tracing import record, settle_span, step_span
from .transport import as_text
from .unavailable import retry_unavailable

logger = logging.getLogger("django_outbox")

#: Sessions recovered per pipeline by recover().
RECOVER_PAGE = 500
#: How long a settle receipt is kept so a replayed settle recognises its own write (ms).
RECEIPT_TTL_MS = 10 * 60 * 1000

#: ``(lease token, entry IDs)``: a lease still held after a delivery whose
#: ``entry_delivered`` already fired, and the entries its release (or the next
#: claim) must acknowledge.
Carry = tuple[str, list[str]]


@dataclass(frozen=True, slots=True)
class Claimed:
    """The other carry: the session's next claim, made under the same lease by the
    settle of the delivery before it (``settle_next.lua``, when nobody listens to
    ``entry_delivered``). ``token`` is the lease's, ``answer`` the claim's answer as
    the claim plan returns it: ``(kind, entry or owed entries, recovered count)``. The
    next step works on it without a claim of its own; released, its staged entry (if
    any) is recovered as verifying, as a dead holder's would be."""

    token: str
    answer: tuple[str, Any, int]


class DeliveryStep(AgentCalls, OwedSignals):
    """The delivery step and recovery (see the module docstring); constructed like
    :class:`~django_outbox.core.base.OutboxBase`. The agent's calls come from
    :class:`~django_outbox.core.calling.AgentCalls`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LeaseKeeper] = (
            weakref.WeakKeyDictionary()
        )
        self._last_keeper: LeaseKeeper | None = None
        #: Names this process in lease tokens ("<owner>.<random>"), so the admin
        #: can tell who holds a lease. A worker names itself instead (``astep(owner=...)``).
        self.owner = f"{socket.gethostname()}-{os.getpid()}"
        #: Callables ``(step, outcome, result, seconds)`` told about every delivery
        #: step: ``step`` is "deliver" or "verify", ``outcome`` the classified
        #: ending (delivered, failed, ambiguous, ...), ``result`` what the settle
        #: script answered (removed, updated, lost, ...). A claim that recovered
        #: a dead holder's staging reports ("recover", "recovered", count, 0).
        self.step_listeners: list[Callable[[str, str, str, float], None]] = []
        #: Callables ``(agent, step, outcome, result, seconds)``: the deliver and verify
        #: steps of :attr:`step_listeners`, with the name of the agent that served them
        #: (:meth:`~django_outbox.core.agents.AgentRouting.agent_for`; ``"?"`` when the
        #: session's agent could not be resolved). The worker's per-agent metrics.
        self.agent_step_listeners: list[Callable[[str, str, str, str, float], None]] = []

    # -- one step ---------------------------------------------------------------------------

    async def adeliver_once(
        self,
        workspace_id: str,
        session_id: str,
        deliverer: Callable[..., Any] | None = None,
    ) -> bool:
        """Take one step for one session: claim its lease, then deliver or verify its next entry.

        Returns True if a step was taken (an entry was delivered, verified or
        failed), False if the session was busy (another holder's lease) or had
        nothing due. The lease is renewed every ``LOCK_TTL / 3`` while the
        deliverer runs; the deliverer is bounded by ``DELIVERY_TIMEOUT`` (a
        timeout is an ambiguous outcome). The outcome is recorded by one script
        that also releases the lease; if the lease was lost meanwhile nothing is
        recorded and the entry is left to verification. Cancelling this coroutine
        mid-delivery records the attempt as ambiguous.

        ``deliverer`` overrides the session's agent's
        (:meth:`~django_outbox.core.agents.AgentRouting.agent_for`); raises
        ``ValueError`` if neither is set, :class:`OutboxUnavailable` if Valkey cannot
        be reached.
        Its outcome reaches the per-minute history before it returns (docs/howto/observe.md).
        """
        if deliverer is None and self.deliverer is None and not self.agents:
            raise ValueError("no deliverer: pass one or configure DELIVERER or AGENTS")
        counter = self.history_counter
        if counter.enabled and counter.offset_us is None and isinstance(self, HistoryReads):
            # Valkey's clock measured before the first count (the host's may be off).
            await self.aflush_own_history(counter)
        took, carry = await self.astep(workspace_id, session_id, deliverer)
        if carry is not None:
            await self.arelease(workspace_id, session_id, carry)
        if self.history_counter.pending and isinstance(self, HistoryReads):  # the Outbox is
            await self.aflush_own_history(self.history_counter)  # both; no worker writes it
        return took

    async def astep(
        self,
        ws: str,
        ses: str,
        deliverer: Callable[..., Any] | None,
        carry: Carry | Claimed | None = None,
        *,
        more: Callable[[], bool] | None = None,
        owner: str | None = None,
    ) -> tuple[bool, Carry | Claimed | None]:
        """One step (see :meth:`adeliver_once`); returns ``(step taken, carry)``.

        The entry's agent is resolved once, after the claim
        (:meth:`~django_outbox.core.agents.AgentRouting.agent_for`): its deliverer
        (``deliverer``, when not None, instead) or its verifier is called with
        :data:`~django_outbox.core.agents.current_agent` set to it. A session whose
        agent cannot be resolved is not sent anything: a delivery is recorded as
        ``transient`` and a verification as ``inconclusive``, the router's complaint as
        the entry's ``lastError`` (docs/howto/agents.md#routing).

        ``carry`` (a :data:`Carry` or a :class:`Claimed`) is what the previous step of
        the same session returned: the next claim acknowledges its entries and reuses
        its lease (a :class:`Claimed` is that claim already made), which saves a round
        trip per message in the worker loop. ``more`` (None: never) is asked once this
        step has delivered whether the caller will step again; True lets a delivery
        that nobody's ``entry_delivered`` listens to be settled together with the next
        claim (a :class:`Claimed` carry: the caller must then step again, or release
        it). Whoever ends the loop must hand a carry back with :meth:`arelease`.
        ``owner`` names the lease's holder in a new lease token (None: :attr:`owner`).
        Raises :class:`~django_outbox.core.errors.OutboxUnavailable`.
        """
        keys = self.keys.session(ws, ses)
        if isinstance(carry, Claimed):
            token, answer = carry.token, carry.answer
        else:
            token, ack = carry if carry is not None else (self._new_token(owner), [])
            answer = await self._arun(self._claim_plan(ws, ses, token, ack))
        kind, claimed, recovered = answer
        if recovered:
            self._tell_listeners("recover", "recovered", str(recovered), 0.0)
        if kind == "owed":
            await self._afire_owed(ws, ses, keys, token, claimed)
            return True, None
        if kind == "unreplicated":
            # The claim is not known to the replicas: do not call the agent. The
            # entry goes back as a failure in which nothing was attempted.
            error = (
                "transient: replicas did not acknowledge the claim within "
                f"{self.config.wait_timeout}s"
            )
            result = await self._asettle(ws, ses, token, claimed, "transient", error)
            self._tell_listeners("deliver", "transient", result, 0.0)
            return True, None
        if kind not in ("deliver", "verify"):
            return False, None
        entry: Entry = claimed
        agent, unrouted = self._route(ws, ses, deliverer)
        keeper = self._keeper()
        keeper.hold(token, keys, ws, ses)
        started = time.monotonic()
        step = "deliver" if kind == "deliver" else "verify"
        hold, ref = 0.0, ""
        with step_span(step, entry.traceparent, ws, ses, entry.id, entry.attempts + 1) as span:
            serving = current_agent.set(agent)
            try:
                if agent is None:
                    outcome, error = (
                        ("transient", f"transient: {unrouted}")
                        if kind == "deliver"
                        else ("inconclusive", f"verifier: {unrouted}")
                    )
                elif kind == "deliver":
                    outcome, error, hold, ref = await self._deliver(agent, entry, ws, ses)
                else:
                    outcome, error, ref = await self._verify(entry, ws, ses, agent.verifier)
            except asyncio.CancelledError:
                keeper.drop(token)
                if kind == "deliver":
                    await asyncio.shield(
                        self._arun(
                            self._settle_plan(ws, ses, token, entry, "ambiguous", "cancelled")
                        )
                    )
                else:
                    await asyncio.shield(self._arun(self._release_plan(ws, ses, token)))
                raise
            finally:
                current_agent.reset(serving)
            following: tuple[str, Any, int] | None = None
            try:
                with settle_span(outcome):
                    if outcome == "delivered" and more and more() and self._settles_with_next():
                        result, following = await self._asettle_next(ws, ses, token, entry, ref)
                    else:
                        result = await self._asettle(
                            ws, ses, token, entry, outcome, error or ref, hold
                        )
            finally:
                if keeper.drop(token):
                    logger.warning(
                        "outbox: lease lost while delivering %s/%s %s", ws, ses, entry.id
                    )
            record(span, outcome=outcome, result=result)
        seconds = time.monotonic() - started
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "outbox %s ws=%s ses=%s entry=%s attempt=%d outcome=%s result=%s duration=%.3fs%s",
                step,
                ws,
                ses,
                entry.id,
                entry.attempts + 1,
                outcome,
                result,
                seconds,
                f" error={error!r}" if error else "",
            )
        self._tell_listeners(step, outcome, result, seconds)
        self._tell_agent_listeners(agent.name if agent else "?", step, outcome, result, seconds)
        if result == "owed":
            await self._acount_owed_failures(ws, ses, [entry.id])
            self._log_owed(ws, ses, [entry])
        if following is not None:
            return True, Claimed(token, following)
        delivered = result == "removed"
        return True, ((token, [entry.id]) if delivered else None)

    async def arelease(self, workspace_id: str, session_id: str, carry: Carry | Claimed) -> None:
        """Hand back the lease of a ``carry`` and acknowledge its delivered entries
        (their ``entry_delivered`` has fired); a :class:`Claimed` carry's staged entry
        stays staged and is recovered as verifying by the next claim. Raises
        :class:`~django_outbox.core.errors.OutboxUnavailable`; a carry that is not
        released expires with its lease and its entries' signals are fired again
        by the next claimer (at-least-once, never lost)."""
        token, ack = (carry.token, []) if isinstance(carry, Claimed) else carry
        await self._arun(self._release_plan(workspace_id, session_id, token, ack))

    def _new_token(self, owner: str | None = None) -> str:
        return f"{owner or self.owner}.{secrets.token_hex(8)}"

    def _keeper(self) -> LeaseKeeper:
        return self._loop_local("_last_keeper", self._keepers, lambda loop: LeaseKeeper(self, loop))

    # -- the claim, the call and the settle ------------------------------------------------

    def _claim_plan(
        self, ws: str, ses: str, token: str, acknowledge: Iterable[str] = ()
    ) -> Plan[Any]:
        call = self._session_eval(
            "claim", ws, ses, extra_args=claim_argv(token, self._lock_ttl_ms, acknowledge)
        )
        # With WAIT_REPLICAS / WAIT_AOF the claim must be durable before the agent
        # is called: a claim lost in a failover would make the entry look never
        # tried, and it would be sent again without verification.
        answer, unacknowledged = yield from self._durably(call)
        reply = ClaimReply.parse(answer)
        return (yield from self._claimed(ws, ses, reply, unacknowledged is not None))

    def _claimed(
        self, ws: str, ses: str, reply: ClaimReply, unreplicated: bool = False
    ) -> Plan[Any]:
        """``(kind, entry or owed entries, recovered count)`` of a claim's reply; emits
        the events of the entries it staged or recovered."""
        kind = reply.kind
        if unreplicated and kind == "deliver":  # (a verification sends nothing)
            kind = "unreplicated"
        if kind == "busy":
            return ("busy", None, 0)
        if kind == "owed":
            return ("owed", [Entry.from_json(raw) for raw in reply.owed], 0)
        version, watched = reply.version, reply.watched
        recovered = reply.recovered
        events = self._events("updated", reply.changed, ws, ses, version, None, watched)
        entry, members = reply.delivery()
        if kind == "unreplicated":
            return (kind, entry, len(recovered))
        if kind == "deliver" and entry is not None:
            for event_kind in ("staged", "updated"):
                if self.listening(event_kind, watched):
                    for staged in (entry, *members):
                        events.append(
                            OutboxEvent(event_kind, "delivering", staged, ws, ses, version, watched)
                        )
        if events:
            yield Emit(events)
        return (kind, entry, len(recovered))

    async def _asettle(
        self,
        ws: str,
        ses: str,
        token: str,
        entry: Entry,
        outcome: str,
        error: str,
        hold: float = 0.0,
    ) -> str:
        """Record an outcome, retrying while Valkey is briefly unavailable. For
        ``delivered``, ``error`` is the agent's reference (compact JSON, ``""`` none).

        The outcome is known here; losing it to a hiccup would leave the entry to
        verification. The lease keeper goes on renewing meanwhile; after half a
        lease of failures the error propagates (the entry is then recovered as
        verifying once the lease expires — safe, only slower).
        """
        return await retry_unavailable(
            lambda: self._arun(self._settle_plan(ws, ses, token, entry, outcome, error, hold)),
            patience=self.config.lock_ttl / 2,
            first_delay=0.05,
            max_delay=1.0,
            what=f"recording {outcome} for {entry.id}",
        )

    def _settle_plan(
        self,
        ws: str,
        ses: str,
        token: str,
        entry: Entry,
        outcome: str,
        error: str,
        hold: float = 0.0,
    ) -> Plan[str]:
        # Durable before entry_delivered fires: a delivered-settle lost in a
        # failover would be verified again and fire the signal a second time.
        answer, unacknowledged = yield from self._durably(
            self._session_eval(
                "settle_delivered" if outcome == "delivered" else "settle",
                ws,
                ses,
                extra_args=settle_argv(
                    token,
                    entry.id,
                    outcome,
                    # delivered: the agent's reference, checked already (agent_ref_json)
                    error if outcome == "delivered" else clean_text(error, MAX_ERROR_CHARS),
                    self.config,
                    RECEIPT_TTL_MS,
                )
                + (hold_argv(hold, self.config) if outcome == "held" else []),
            )
        )
        if unacknowledged is not None:
            logger.warning("outbox: settle of %s: %s", entry.id, unacknowledged)
        reply = SettleReply.parse(answer)
        kind = reply.kind
        self.history_counter.settled(ws, entry, outcome, kind, reply.entry, reply.members)
        if reply.delivered:
            # Delivered. The lease is still ours and the entry stays staged as
            # delivered until its receivers ran: acknowledge it afterwards, so a
            # crash in between leaves the signal owed to the next claimer.
            watched = True if kind != "removed" else reply.watched
            kinds = [k for k in ("delivered", "updated") if self.listening(k, watched)]
            if kinds:
                done: Entry | None
                members: tuple[Any, ...] = ()
                if kind == "removed" and reply.entry is not None:
                    version, done = reply.version, Entry.from_json(reply.entry)
                    members = reply.members
                else:  # our settle ran but its reply was lost
                    version, done = yield from self._staged_delivered_plan(ws, ses, entry.id)
                if done is not None:
                    events = [
                        OutboxEvent(k, "sent", done, ws, ses, version, watched) for k in kinds
                    ]
                    # The other prompts of a merged message went out in it: watchers see
                    # them sent too (their entry_delivered follows at the release or the
                    # next claim, as the settle leaves it owed).
                    events += self._events("updated", members, ws, ses, version, "sent", watched)
                    if any(e.kind == "delivered" for e in (yield Emit(events))):
                        return "owed"  # a receiver asked for it again: not acknowledged
            kind = "removed"  # the caller acknowledges (release, or the next claim)
        elif kind in ("updated", "cancelled") and reply.entry is not None:
            state = "cancelled" if kind == "cancelled" else None  # cancelled: a cut, never sent
            yield Emit(
                self._events("updated", reply.changed, ws, ses, reply.version, state, reply.watched)
            )
        elif kind == "lost":
            logger.warning(
                "outbox: %s/%s %s: lease lost, outcome %s left to verification",
                ws,
                ses,
                entry.id,
                outcome,
            )
        return kind

    def _settles_with_next(self) -> bool:
        """Whether a delivery may be settled together with the next claim: nobody
        listens to ``entry_delivered`` (so no signal has to fire, and be acknowledged,
        in between) and no replica or AOF wait applies (those follow each write)."""
        return not self.listening("delivered", False) and not self._durability_waits()

    async def _asettle_next(
        self, ws: str, ses: str, token: str, entry: Entry, ref: str = ""
    ) -> tuple[str, tuple[str, Any, int] | None]:
        """Record a delivery and claim the next entry under the same lease, retrying
        while Valkey is briefly unavailable (as :meth:`_asettle`; the script is
        replay-safe). Returns ``(settle result, the next claim's answer or None)``."""
        return await retry_unavailable(
            lambda: self._arun(self._settle_next_plan(ws, ses, token, entry, ref)),
            patience=self.config.lock_ttl / 2,
            first_delay=0.05,
            max_delay=1.0,
            what=f"recording delivered for {entry.id}",
        )

    def _settle_next_plan(
        self, ws: str, ses: str, token: str, entry: Entry, ref: str = ""
    ) -> Plan[tuple[str, tuple[str, Any, int] | None]]:
        argv = settle_next_argv(
            token, entry.id, self.config, RECEIPT_TTL_MS, self._lock_ttl_ms, [entry.id], ref
        )
        reply = SettleNextReply.parse(
            (yield self._session_eval("settle_next", ws, ses, extra_args=argv))
        )
        settled, claim = reply.settled, reply.claim
        self.history_counter.settled(ws, entry, "delivered", settled.kind, settled.entry)
        self.history_counter.settled_members(ws, "delivered", settled.kind, settled.members)
        if claim is None:
            kind = settled.kind
            if kind == "lost":
                logger.warning(
                    "outbox: %s/%s %s: lease lost, outcome delivered left to verification",
                    ws,
                    ses,
                    entry.id,
                )
            return kind, None
        if settled.kind == "removed" and settled.entry is not None:
            # Only watchers can be told now (nobody listens to entry_delivered, and the
            # entry is acknowledged already): its events follow the settle's version.
            watched = settled.watched
            kinds = [k for k in ("delivered", "updated") if self.listening(k, watched)]
            if kinds:
                version, done = settled.version, Entry.from_json(settled.entry)
                events = [OutboxEvent(k, "sent", done, ws, ses, version, watched) for k in kinds]
                events += self._events(
                    "updated", settled.members, ws, ses, version, "sent", watched
                )
                if any(e.kind == "delivered" for e in (yield Emit(events))):
                    logger.warning(
                        "outbox: %s/%s: entry_delivered of %s asked to be fired again, but "
                        "it was acknowledged with the settle (a receiver connected meanwhile)",
                        ws,
                        ses,
                        entry.id,
                    )
        following = yield from self._claimed(ws, ses, claim)
        return "removed", following

    def _release_plan(
        self, ws: str, ses: str, token: str, acknowledge: Iterable[str] = ()
    ) -> Plan[Any]:
        return (
            yield self._session_eval(
                "release", ws, ses, extra_args=release_argv(token, acknowledge)
            )
        )

    async def _afire_owed(
        self, ws: str, ses: str, keys: SessionKeys, token: str, owed: list[Entry]
    ) -> None:
        """Fire the entry_delivered a dead holder (or a failed receiver) owed, then
        acknowledge it. If a hook raises SignalOwed nothing is acknowledged and the lease
        is left to expire: the next claim after ``LOCK_TTL`` fires them again."""
        ids = [e.id for e in owed]
        failures = await self.aowed_failures(ws, ses)
        if self._held_for_staff(ws, ses, ids, failures):
            return  # bounded: it waits for staff; the lease is left to expire
        keeper = self._keeper()
        keeper.hold(token, keys, ws, ses)
        try:
            version = (await self.asnapshot(ws, ses)).version
            failed = await self._arun(
                iter_once(
                    Emit([OutboxEvent("delivered", "sent", e, ws, ses, version) for e in owed])
                )
            )
            if failed:
                await self._acount_owed_failures(ws, ses, [event.entry.id for event in failed])
                self._log_owed(ws, ses, owed)
                return
            await self._arun(self._release_plan(ws, ses, token, ids))
            if any(i in failures for i in ids):
                await self._aforget_owed_failures(ws, ses, ids)
        finally:
            keeper.drop(token)
        logger.info("outbox: %s/%s fired %d owed entry_delivered", ws, ses, len(owed))

    def _log_owed(self, ws: str, ses: str, owed: list[Entry]) -> None:
        logger.warning(
            "outbox: %s/%s: entry_delivered of %s stays owed (a receiver asked for it again); "
            "the session's lease is left to expire and the next claim fires it again in %ss",
            ws,
            ses,
            ", ".join(e.id for e in owed),
            self.config.lock_ttl,
        )

    def _tell_listeners(self, step: str, outcome: str, result: str, seconds: float) -> None:
        for listener in self.step_listeners:
            try:
                listener(step, outcome, result, seconds)
            except Exception:
                logger.exception("outbox: step listener failed")

    def _tell_agent_listeners(
        self, agent: str, step: str, outcome: str, result: str, seconds: float
    ) -> None:
        # The dashboard's split by agent, counted as the settles are (core/history.py).
        self.history_counter.agent_step(agent, step, outcome, result, seconds)
        for listener in self.agent_step_listeners:
            try:
                listener(agent, step, outcome, result, seconds)
            except Exception:
                logger.exception("outbox: agent step listener failed")

    # -- recovery ---------------------------------------------------------------------------

    def _recover_plan(self) -> Plan[int]:
        recovered = 0
        now_us = self._now_us()  # 0: the server's clock decides what is due (due.lua)
        for workspace_id in (yield from self._workspaces_plan()):
            due = yield Eval("due", [self.keys.due(workspace_id)], due_argv(now_us, -1))
            sessions = sorted(as_text(s) for s in due)
            # One pipeline per page of sessions (each script still atomic on its own):
            # a worker starting on a backlog must not spend a round trip per session.
            for start in range(0, len(sessions), RECOVER_PAGE):
                page = sessions[start : start + RECOVER_PAGE]
                answers = yield Pipe(
                    [self._session_eval("recover", workspace_id, ses) for ses in page]
                )
                events: list[OutboxEvent] = []
                for session_id, answer in zip(page, answers, strict=True):
                    if isinstance(answer, Exception):
                        raise answer
                    reply = OperatorReply.parse(answer)
                    recovered += reply.count
                    events += self._events(
                        "updated",
                        reply.changed,
                        workspace_id,
                        session_id,
                        reply.version,
                        None,
                        reply.watched,
                    )
                if events:
                    yield Emit(events)
        return recovered

    def recover(self) -> int:
        """Return staged entries whose lease is gone (a crashed or cut-off worker) to their
        queue as ``verifying`` — the interrupted attempt's outcome is unknown.
        Looks only at sessions the due index says are due (a staged session is
        indexed at its lease's expiry), so the cost follows the work, not the
        keyspace. Live leases are never taken. Returns the number recovered.
        Workers also recover continuously: a claim on a session with a dead
        holder's staging recovers it first.
        """
        return self._run(self._recover_plan())

    async def arecover(self) -> int:
        """Async :meth:`recover`."""
        return await self._arun(self._recover_plan())
