"""The outbox service: accept, list, operate, sweep, clean up, run a worker.

:class:`Outbox` is the public face of the core (docs/reference/python.md). Every
operation is written once, as a *plan* (:mod:`~django_outbox.core.plans`) run
by a sync and an async driver, so ``accept`` and ``aaccept`` share everything
but the I/O. State transitions happen in the Lua scripts of ``core/lua``; this
module picks them, passes the tunables, and turns their answers into entries,
results and errors. The rooms below it: :mod:`~django_outbox.core.step`
(the delivery step and recovery), :mod:`~django_outbox.core.base` (script
arguments, durability, events, snapshots, the due index) and
:mod:`~django_outbox.core.transport` (clients and drivers).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from .agents import CAPABILITY_MERGE
from .cutting import TurnCuts
from .entry import (
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_FAILED,
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_STALLED,
    LEDGER_STATE_TURN_ENDED,
    REASON_UNVERIFIABLE,
    DismissResult,
    Entry,
    Lease,
    OutboxEvent,
    RetryResult,
    Snapshot,
    Status,
    fingerprint,
    format_time,
    fresh_entry_json,
    new_entry_id,
    parse_time,
)
from .errors import (
    Duplicate,
    IdempotencyConflict,
    MergeNotSupported,
    OutboxFull,
    RateLimited,
    SessionBusy,
)
from .history import HistoryReads
from .keys import dedupe_marker, user_digest
from .owner import OwnedKeySpace
from .plans import Call, Cmd, Emit, Eval, Pipe, Plan, iter_once
from .reads import QueueReads
from .replies import AcceptReply, CleanupReply, OperatorReply, SeedReply
from .rules import (
    check_accept_options,
    check_identifier,
    check_model_allowed,
    check_printable_reason,
    check_reason,
    check_user_id,
    validate_content,
)
from .scripts import (
    accept_argv,
    dismiss_argv,
    ledger_argv,
    rearm_unverifiable_argv,
    reason_argv,
    retry_argv,
    seed_argv,
    unpause_argv,
)
from .steering import QueueSteering
from .tracing import accept_span, current_traceparent, record
from .transport import as_text
from .worker import Worker, WorkerStats

__all__ = ["Lease", "Outbox", "OutboxEvent", "Snapshot", "WorkerStats"]

logger = logging.getLogger("django_outbox")

#: Passes unpark_workspace makes over the sessions before it gives up ending the pause.
UNPAUSE_PASSES = 10
#: Seconds a session's watcher count outlives its last change (see Outbox.awatch).
WATCH_TTL = 24 * 3600


def parked_fields(reason: str) -> dict[str, Any]:
    """The fields of an entry accept stored parked with ``reason`` (its workspace is
    parked: docs/explanation/lifecycle.md, "Parking a workspace")."""
    return {"status": Status.PARKED, "parked_from": "pending", "reason": reason}


class Outbox(QueueReads, HistoryReads, OwnedKeySpace, TurnCuts, QueueSteering):
    """The outbox service: one per process, safe for concurrent use.

    ``Outbox(url="redis://127.0.0.1:6379/0", deliverer=..., verifier=..., ledger_probe=...,
    **tunables)`` where tunables are the snake_case names of
    :class:`~django_outbox.core.config.Config` (durations in seconds). ``clock`` (None:
    Valkey's clock, the default and the only right choice in production)
    returns seconds since the epoch (injectable for tests). ``cluster=True`` uses
    Valkey Cluster clients. ``key_space_owner`` (a
    :class:`~django_outbox.core.owner.KeySpaceOwner`; ``get_outbox`` passes this project's)
    makes accept, cleanup and the worker refuse a key space another project claimed
    (:class:`KeySpaceClaimed`; docs/howto/valkey.md#one-project-per-key-space); None,
    the default, claims nothing. Sync methods use one thread-safe client; async
    methods (``a``-prefixed) use one client per running event loop.

    Subclasses may override :meth:`emit` / :meth:`aemit` to observe
    :class:`OutboxEvent`s (the Django layer turns them into signals).
    """

    # -- accept --------------------------------------------------------------------------------

    def _accept_plan(
        self,
        workspace_id: str,
        session_id: str,
        user_id: Any,
        client_message_id: Any,
        text: Any,
        model: Any = None,
        if_busy: Any = "queue",
        expires_after: Any = None,
    ) -> Plan[Entry]:
        keys = self.keys.session(workspace_id, session_id)
        validate_content(text, model, client_message_id, self.config.max_text_bytes)
        check_model_allowed(model, self.config.models)
        mode, expires_us = check_accept_options(if_busy, expires_after)
        user_id = check_user_id(user_id)
        if mode == "merge" and not self.carries(workspace_id, session_id, CAPABILITY_MERGE):
            raise MergeNotSupported(
                "the session's agent does not declare that it delivers merged prompts "
                "(outbox_capabilities without 'merge'): send it without if_busy='merge'"
            )
        if self.key_space_owner is not None and self._key_space_due():
            yield from self._key_space_plan()  # claim, then confirm every CLAIM_RECHECK
        user = user_digest(user_id)
        marker = dedupe_marker(user_id, client_message_id)
        now_us = self._now_us()  # 0: the script stamps acceptedAt on the server's clock
        entry_id = new_entry_id(now_us // 1000 if now_us else None)
        accepted_at = format_time(now_us)
        script_keys, args = self._session_args(keys, workspace_id, session_id, now_us)
        traceparent = current_traceparent()
        call = Eval(
            "accept",
            [*script_keys, self.keys.dedupe(workspace_id, session_id, marker)],
            [
                *args,
                *accept_argv(
                    fresh_entry_json(
                        entry_id, accepted_at, client_message_id, user_id, text, model, traceparent
                    ),
                    entry_id,
                    fingerprint(text, model),
                    self.config.cap,
                    self._dedupe_ttl_ms,
                    marker,
                    user,
                    self.config.user_max_queued,
                    self.config.user_accepts_per_minute,
                    self._history_ttl_ms,
                    expires_us,
                    mode,
                ),
            ],
        )
        answer, unacknowledged = yield from self._durably(call)
        reply = AcceptReply.parse(answer)
        if reply.status in ("ok", "own"):
            stamped = reply.accepted_at or accepted_at
            entry = Entry(
                id=entry_id,
                client_message_id=client_message_id,
                user_id=user_id,
                text=text,
                model=model,
                accepted_at=stamped,
                seq=reply.seq,
                traceparent=traceparent,
                expires_at=format_time(parse_time(stamped) + expires_us) if expires_us else None,
                mode=mode,
                # Stored parked (its workspace is parked): say so, not "pending".
                **(parked_fields(reply.held) if reply.held else {}),
            )
            if unacknowledged is not None:
                raise unacknowledged
            if self.listening("updated", reply.watched):
                event = OutboxEvent(
                    "updated",
                    "parked" if reply.held else "queued",
                    entry,
                    workspace_id,
                    session_id,
                    reply.version,
                    reply.watched,
                )
                yield Emit([event])
            return entry
        if reply.status == "duplicate":
            raise Duplicate(reply.existing_id)
        if reply.status == "conflict":
            raise IdempotencyConflict(reply.existing_id)
        if reply.status == "session_busy":
            raise SessionBusy()
        if reply.status == "full":
            raise OutboxFull(self.config.cap)
        if reply.status == "user_full":
            raise OutboxFull(self.config.user_max_queued, scope="user")
        if reply.status == "rate_limited":
            raise RateLimited(reply.retry_after, self.config.user_accepts_per_minute)
        raise AssertionError(f"unexpected accept reply {reply!r}")  # pragma: no cover

    def accept(
        self,
        workspace_id: str,
        session_id: str,
        *,
        user_id: str,
        client_message_id: str,
        text: str,
        model: dict[str, Any] | None = None,
        if_busy: str = "queue",
        expires_after: float | None = None,
    ) -> Entry:
        """Accept a prompt into the session's queue; return the stored entry (status pending).

        Options (docs/howto/steering.md): ``if_busy`` ``"queue"`` (the default),
        ``"reject"`` (raise :class:`SessionBusy`, storing nothing and writing no marker,
        while the session has something pending, in flight or being verified; decided in
        the accept script, atomically), ``"merge"`` or ``"interrupt"`` (the prompt becomes
        the session's next and the running turn is cut: :meth:`accept_interrupting`, whose
        ``SendNowResult`` this drops; raises :class:`CutNotSupported` without an aborter,
        nothing stored, docs/howto/cutting.md); ``expires_after`` seconds (None:
        never): a prompt not handed to the agent by then, on Valkey's clock, is never sent
        and ends ``expired`` (``expires_at`` on the entry).

        Immediate: the entry is stored when this returns, whatever database transaction the
        caller is in, and stays if that transaction rolls back. For a prompt that must enter
        the outbox only if the caller's transaction commits, the Django outbox has
        ``accept_on_commit`` (docs/howto/transactions.md says when to use which).

        One atomic script checks the dedupe marker and the cap, appends the entry,
        writes the marker (value: entry ID and a digest of text and model, TTL
        ``DEDUPE_TTL`` seconds) and updates the indices: a refused or failed call
        writes nothing. Raises :class:`Duplicate` (same key, same content; carries
        ``accepted_id``), :class:`IdempotencyConflict` (same key, other content),
        :class:`OutboxFull` (``CAP`` reached; ``scope`` ``"user"``: the user already has
        ``USER_MAX_QUEUED`` entries queued in the workspace), :class:`RateLimited` (the
        user's ``USER_ACCEPTS_PER_MINUTE`` are used up; ``retry_after`` seconds;
        docs/explanation/idempotency.md), :class:`InvalidIdentifier`,
        :class:`InvalidContent` (text, model, key or user ID breaks a rule of
        :mod:`~django_outbox.core.rules`; :class:`ContentTooLarge` for sizes; both
        are ``ValueError`` subclasses) and
        :class:`OutboxUnavailable` (Valkey unreachable, out of memory, or a
        ``WAIT_REPLICAS``/``WAIT_AOF`` wait timed out — then ``accepted`` is True).
        With a ``key_space_owner``, the first accept claims the key space and later ones
        confirm it every ``CLAIM_RECHECK`` (2 s), raising :class:`KeySpaceClaimed`
        (nothing stored) while another project holds it (docs/howto/valkey.md).
        """
        options: dict[str, Any] = {"user_id": user_id, "client_message_id": client_message_id}
        options.update(text=text, model=model, expires_after=expires_after)
        if if_busy == "interrupt":
            return self.accept_interrupting(workspace_id, session_id, **options)[0]
        return self._accept_stored(workspace_id, session_id, if_busy=if_busy, **options)

    def _accept_stored(self, workspace_id: str, session_id: str, **accept: Any) -> Entry:
        """Store the prompt (``accept``: :meth:`accept`'s keyword arguments); no cut."""
        with accept_span(workspace_id, session_id) as span:
            entry = self._run(self._accept_plan(workspace_id, session_id, **accept))
            record(span, entry_id=entry.id)
            return entry

    async def aaccept(
        self,
        workspace_id: str,
        session_id: str,
        *,
        user_id: str,
        client_message_id: str,
        text: str,
        model: dict[str, Any] | None = None,
        if_busy: str = "queue",
        expires_after: float | None = None,
    ) -> Entry:
        """Async :meth:`accept`. The write is one script, so a cancelled caller cannot split it."""
        options: dict[str, Any] = {"user_id": user_id, "client_message_id": client_message_id}
        options.update(text=text, model=model, expires_after=expires_after)
        if if_busy == "interrupt":
            return (await self.aaccept_interrupting(workspace_id, session_id, **options))[0]
        return await self._aaccept_stored(workspace_id, session_id, if_busy=if_busy, **options)

    async def _aaccept_stored(self, workspace_id: str, session_id: str, **accept: Any) -> Entry:
        """Async :meth:`_accept_stored`."""
        with accept_span(workspace_id, session_id) as span:
            entry = await self._arun(self._accept_plan(workspace_id, session_id, **accept))
            record(span, entry_id=entry.id)
            return entry

    # -- operator actions ---------------------------------------------------------------------

    def _transition_plan(
        self,
        script: str,
        workspace_id: str,
        session_id: str,
        argv: list[Any],
        removed_state: str = "dismissed",
    ) -> Plan[OperatorReply]:
        """Run one operator transition (``retry``, ``dismiss``, ``park``, ... : one script
        each, see :mod:`~django_outbox.core.scripts`) and emit the events of the entries it
        changed; a removal's are in ``removed_state``."""
        reply = OperatorReply.parse(
            (yield self._session_eval(script, workspace_id, session_id, extra_args=argv))
        )
        if reply.changed:
            state = removed_state if reply.result == "removed" else None
            yield Emit(
                self._events(
                    "updated",
                    reply.changed,
                    workspace_id,
                    session_id,
                    reply.version,
                    state,
                    reply.watched,
                )
            )
        return reply

    def _retry_plan(self, workspace_id: str, session_id: str, entry_id: str) -> Plan[RetryResult]:
        check_identifier("entry ID", entry_id)
        argv = retry_argv(entry_id, self.verifies(workspace_id, session_id), self._history_ttl_ms)
        reply = yield from self._transition_plan("retry", workspace_id, session_id, argv)
        return {"updated": RetryResult.UPDATED, "busy": RetryResult.BUSY}.get(
            reply.result, RetryResult.NOT_FOUND
        )

    def retry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """Re-arm an entry now: an error entry returns to pending (to verifying if
        it failed as ``unverifiable`` and a verifier is configured, so a message
        that may have arrived is checked before any resend); a pending or
        verifying entry loses its backoff gate. Counters of transient failures and
        verification passes restart; ``attempts`` does not, so attempt numbers
        stay unique and one retry grants one more attempt after ``MAX_ATTEMPTS``.
        Never passes through dedupe.

        Returns ``BUSY`` while the entry is being delivered or verified under a
        live lease, or is parked (only unpark moves parked entries), and
        ``NOT_FOUND`` if no such entry exists.
        """
        return self._run(self._retry_plan(workspace_id, session_id, entry_id))

    async def aretry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """Async :meth:`retry`."""
        return await self._arun(self._retry_plan(workspace_id, session_id, entry_id))

    def _dismiss_plan(
        self, workspace_id: str, session_id: str, entry_id: str
    ) -> Plan[DismissResult]:
        check_identifier("entry ID", entry_id)
        # Dismissal only frees memory: its script runs on a full server (allow-oom).
        argv = dismiss_argv(entry_id, self._history_ttl_ms)
        reply = yield from self._transition_plan("dismiss", workspace_id, session_id, argv)
        return {"removed": DismissResult.REMOVED, "busy": DismissResult.BUSY}.get(
            reply.result, DismissResult.NOT_FOUND
        )

    def dismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """Remove an entry whatever its status. Its dedupe marker stays for
        ``DEDUPE_TTL`` (a resend of its key answers Duplicate). Returns ``BUSY``
        while it is being delivered or verified under a live lease, ``NOT_FOUND``
        if absent.
        """
        return self._run(self._dismiss_plan(workspace_id, session_id, entry_id))

    async def adismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """Async :meth:`dismiss`."""
        return await self._arun(self._dismiss_plan(workspace_id, session_id, entry_id))

    def _sessions_plan(self, workspace_id: str) -> Plan[list[str]]:
        members = yield Cmd(("SMEMBERS", self.keys.sessions(workspace_id)))
        return sorted(as_text(m) for m in members)

    def _bulk_plan(self, workspace_id: str, script: str, argv: list[Any]) -> Plan[int]:
        """Run ``script`` with ``argv`` on every session of the workspace: the entries
        changed, summed."""
        check_identifier("workspace ID", workspace_id)
        total = 0
        for session_id in (yield from self._sessions_plan(workspace_id)):
            reply = yield from self._transition_plan(script, workspace_id, session_id, argv)
            total += reply.count
        return total

    def _park_plan(self, workspace_id: str, reason: str) -> Plan[int]:
        check_identifier("workspace ID", workspace_id)
        reason = check_printable_reason(reason)
        # Pause first: from here on every accept into the workspace is held, so none
        # can overtake what the loop below parks.
        pause = self.keys.pause(workspace_id)
        for answer in (yield Pipe([Cmd(("DEL", pause)), Cmd(("HSET", pause, "reason", reason))])):
            if isinstance(answer, Exception):
                raise answer
        argv = reason_argv(reason, self._history_ttl_ms)
        return (yield from self._bulk_plan(workspace_id, "park", argv))

    def _unpark_plan(self, workspace_id: str, reason: str | None) -> Plan[int]:
        check_identifier("workspace ID", workspace_id)
        arg = "" if reason is None else check_reason(reason)
        total = 0
        # Each session is unparked and released from the pause in one script, so an
        # accept into it is held until its earlier entries are back in line. The pause
        # ends when every session is released (sessions created meanwhile are held,
        # and the next pass releases them).
        for _ in range(UNPAUSE_PASSES):
            total += yield from self._bulk_plan(
                workspace_id, "unpark", reason_argv(arg, self._history_ttl_ms)
            )
            sessions = yield from self._sessions_plan(workspace_id)
            if not sessions:
                pause = self.keys.pause(workspace_id)
                held = as_text((yield Cmd(("HGET", pause, "reason"))) or "")
                if held and arg in ("", held):
                    yield Cmd(("DEL", pause))
                return total
            reply = yield from self._transition_plan(
                "unpause", workspace_id, sessions[0], unpause_argv(arg)
            )
            if reply.count:
                return total
        logger.warning(
            "outbox: %s still has sessions held by its pause after %d passes (new sessions "
            "keep appearing); unpark it again",
            workspace_id,
            UNPAUSE_PASSES,
        )
        return total

    def park_workspace(self, workspace_id: str, reason: str) -> int:
        """Pause the workspace: park every pending, verifying and delivering entry with
        ``reason`` (a machine code such as ``"mode_transition"``) and hold everything
        accepted into the workspace afterwards, in any session, old or new, as parked
        with the same reason, until :meth:`unpark_workspace`. Parked entries are inert
        until unparked or dismissed; one parked mid-delivery keeps its lease, and its
        outcome is recorded when the delivery ends (a confirmed delivery still
        completes it). Parking again replaces the reason. Returns the number parked
        now (entries held later are not counted). Raises :class:`InvalidIdentifier`,
        :class:`InvalidContent` (a reason that is blank, over 200 characters or holds a
        control or format character: :func:`~.rules.check_printable_reason`) or
        :class:`OutboxUnavailable`.
        """
        return self._run(self._park_plan(workspace_id, reason))

    async def apark_workspace(self, workspace_id: str, reason: str) -> int:
        """Async :meth:`park_workspace`."""
        return await self._arun(self._park_plan(workspace_id, reason))

    def unpark_workspace(self, workspace_id: str, reason: str | None = None) -> int:
        """Return parked entries (only those parked with ``reason``, if given) to the state
        they were parked from — pending, or verifying when their last attempt's
        outcome is unknown, so unparking never resends blindly — and end the
        workspace's pause when it was parked with ``reason`` (or ``reason`` is None).
        Sessions are released one at a time, each in one script with its entries,
        so every session keeps its accept order: a prompt accepted during the unpark
        waits behind the ones that were held. Returns the number unparked.
        """
        return self._run(self._unpark_plan(workspace_id, reason))

    async def aunpark_workspace(self, workspace_id: str, reason: str | None = None) -> int:
        """Async :meth:`unpark_workspace`."""
        return await self._arun(self._unpark_plan(workspace_id, reason))

    # -- sweeps and cleanup ---------------------------------------------------------------------

    def _sweep_unverifiable_plan(self, workspace_id: str) -> Plan[int]:
        check_identifier("workspace ID", workspace_id)
        if not self.any_verifier():
            return 0
        argv = rearm_unverifiable_argv(self._history_ttl_ms)
        return (yield from self._bulk_plan(workspace_id, "rearm_unverifiable", argv))

    def sweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """Re-arm the workspace's ``unverifiable`` error entries as verifying with a fresh
        verification window (call it when an agent that was unreachable is back).
        Returns the number re-armed; 0 without a verifier. Idempotent.
        """
        return self._run(self._sweep_unverifiable_plan(workspace_id))

    async def asweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """Async :meth:`sweep_workspace_unverifiable`."""
        return await self._arun(self._sweep_unverifiable_plan(workspace_id))

    def _sweep_parked_plan(self, workspace_id: str) -> Plan[int]:
        check_identifier("workspace ID", workspace_id)
        probe = self.ledger_probe
        if probe is None:
            return 0
        recovered = 0
        for session_id in (yield from self._sessions_plan(workspace_id)):
            snap = yield from self._snapshot_plan(workspace_id, session_id)
            for entry in snap.entries:
                if entry.status is not Status.ERROR:
                    continue
                attempt = entry.attempts + (1 if entry.reason == REASON_UNVERIFIABLE else 0)
                try:
                    state = yield Call(
                        probe,
                        {
                            "workspace_id": workspace_id,
                            "session_id": session_id,
                            "entry_id": entry.id,
                            "attempt": attempt,
                        },
                    )
                except Exception:
                    logger.warning("outbox: ledger probe failed for %s", entry.id, exc_info=True)
                    continue
                if state in (LEDGER_STATE_TURN_ENDED, LEDGER_STATE_PROMOTED):
                    op = "ledger_complete"
                elif state is None or state == LEDGER_STATE_FAILED:
                    op = "ledger_rearm"
                else:
                    if state not in (
                        LEDGER_STATE_LEDGERED,
                        LEDGER_STATE_ADMITTED,
                        LEDGER_STATE_STALLED,
                    ):
                        logger.warning("outbox: unknown ledger state %r for %s", state, entry.id)
                    continue
                # A completed entry's entry_delivered is owed and fired by the
                # next claim of its session (never lost, even if we die now).
                reply = yield from self._transition_plan(
                    op,
                    workspace_id,
                    session_id,
                    ledger_argv(entry.id, entry.attempts, self._history_ttl_ms),
                    "sent",
                )
                if reply.result in ("removed", "updated"):
                    recovered += 1
        return recovered

    def sweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """Ask the ledger probe about each error entry of the workspace and act on the answer
        (docs/explanation/lifecycle.md, "The ledger probe"): ``TURN_ENDED``/``PROMOTED`` →
        completed (removed; ``entry_delivered`` fires in the worker that next claims the session);
        no row or ``FAILED`` → re-armed to pending;
        ``LEDGERED``/``ADMITTED``/``STALLED`` → left as they are; a probe that
        raises leaves the entry for the next sweep. Returns the number completed
        or re-armed; 0 without a probe. Idempotent.
        """
        return self._run(self._sweep_parked_plan(workspace_id))

    async def asweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """Async :meth:`sweep_workspace_parked_errors`."""
        return await self._arun(self._sweep_parked_plan(workspace_id))

    def _cleanup_plan(self, workspace_id: str) -> Plan[int]:
        check_identifier("workspace ID", workspace_id)
        yield from self._key_space_plan()  # every time: it deletes
        removed = 0
        for session_id in (yield from self._sessions_plan(workspace_id)):
            keys = self.keys.session(workspace_id, session_id)
            while True:
                markers = [as_text(m) for m in (yield Cmd(("ZRANGE", keys.markers, 0, -1)))]
                marker_keys = [self.keys.dedupe(workspace_id, session_id, m) for m in markers]
                reply = CleanupReply.parse(
                    (
                        yield self._session_eval(
                            "cleanup",
                            workspace_id,
                            session_id,
                            extra_args=markers,
                            extra_keys=marker_keys,
                        )
                    )
                )
                removed += reply.removed
                if reply.done:
                    break
            # Watchers learn that the entries are gone, at a version above any they
            # hold (the session's next change starts above it).
            events = self._events(
                "updated",
                reply.gone,
                workspace_id,
                session_id,
                reply.version,
                "dismissed",
                reply.watched,
            )
            if events:
                yield Emit(events)
            # Failed firings of signals owed there (docs/reference/signals.md).
            removed += int((yield Cmd(("DEL", self.keys.owed_failures(workspace_id, session_id)))))
        removed += int((yield Cmd(("DEL", self.keys.pause(workspace_id)))))
        # Its per-minute history too (docs/howto/observe.md): every minute of the window,
        # one slot, so a few UNLINKs of many keys each.
        if self._history_ttl_ms:
            now = self._history_now((yield Cmd(("TIME",))))
            last = int(now) // 60 + 1
            first = last - self._history_ttl_ms // 60_000 - 1
            names = [self.keys.history(m, workspace_id) for m in range(first, last + 1)]
            for i in range(0, len(names), 512):
                removed += int((yield Cmd(("UNLINK", *names[i : i + 512]))))
            # Counted as an operator's change in the total: the depth sample walks again.
            total = self.keys.history(int(now) // 60)
            yield Pipe(
                [
                    Cmd(("HINCRBY", total, "x", 1)),
                    Cmd(("PEXPIRE", total, self._history_ttl_ms, "NX")),
                ]
            )
        return removed

    def cleanup_workspace(self, workspace_id: str) -> int:
        """Delete every key of the workspace — queues, staging, leases, versions,
        dedupe markers (so its idempotency keys are free again) and its per-minute
        history. Walks the
        workspace's session set, never the keyspace. Returns the number of keys
        removed; idempotent. A delivery in flight meanwhile loses its lease and
        settles nothing. Each removed entry is reported as an ``updated`` event with
        state ``dismissed`` (watchers drop it), and the session's version never goes
        backwards: its next change is numbered above every version it had.
        With a ``key_space_owner`` it first confirms (or makes) the key space's claim,
        every time, and raises :class:`KeySpaceClaimed`, deleting nothing, while another
        project holds the space (docs/howto/valkey.md#one-project-per-key-space).
        """
        return self._run(self._cleanup_plan(workspace_id))

    async def acleanup_workspace(self, workspace_id: str) -> int:
        """Async :meth:`cleanup_workspace`."""
        return await self._arun(self._cleanup_plan(workspace_id))

    # -- watchers -------------------------------------------------------------------------------

    async def awatch(self, workspace_id: str, session_id: str, delta: int) -> int:
        """Count a WebSocket watcher of the session in (``delta`` +1) or out (-1); return
        the count after the change.

        The scripts report the count to their callers (``watched``), which skip
        building events nobody would see. The count expires ``WATCH_TTL`` seconds
        after its last change, so one left by a server that died without
        disconnecting does not last (meanwhile events are only published
        needlessly, never skipped wrongly). Raises :class:`OutboxUnavailable`.
        """
        key = self.keys.session(workspace_id, session_id).watch
        results = await self._arun(
            iter_once(Pipe([Cmd(("INCRBY", key, delta)), Cmd(("EXPIRE", key, WATCH_TTL))]))
        )
        count = results[0]
        if isinstance(count, Exception):
            raise count
        if int(count) <= 0:
            await self._arun(iter_once(Cmd(("DEL", key))))
        return int(count)

    # -- a user's open WebSockets ------------------------------------------------------------

    async def aopen_socket(self, user_id: str, socket_id: str, *, limit: int, ttl: float) -> bool:
        """Count WebSocket ``socket_id`` among ``user_id``'s open sockets unless the user
        already holds ``limit`` live ones (0: no bound); True if counted.

        Each socket expires ``ttl`` seconds after it was counted or last refreshed
        (:meth:`arefresh_socket`), on Valkey's clock, so the sockets of a server
        process that died without closing them stop counting on their own.
        Raises :class:`OutboxUnavailable`.
        """
        answer = await self._arun(self._socket_eval("open", user_id, socket_id, ttl, limit))
        return int(answer) == 1

    async def arefresh_socket(self, user_id: str, socket_id: str, *, ttl: float) -> None:
        """Push the expiry of an open socket (see :meth:`aopen_socket`) ``ttl`` seconds
        ahead (it is counted again if it had expired). Raises :class:`OutboxUnavailable`."""
        await self._arun(self._socket_eval("refresh", user_id, socket_id, ttl, 0))

    async def aclose_socket(self, user_id: str, socket_id: str) -> None:
        """Stop counting a socket (see :meth:`aopen_socket`). Raises
        :class:`OutboxUnavailable`."""
        await self._arun(iter_once(Cmd(("ZREM", self.keys.sockets(user_id), socket_id))))

    def _socket_eval(
        self, op: str, user_id: str, socket_id: str, ttl: float, limit: int
    ) -> Plan[Any]:
        ttl_ms = max(1, int(ttl * 1000))
        args = [op, socket_id, ttl_ms, limit]
        return iter_once(Eval("sockets", [self.keys.sockets(user_id)], args))

    async def asession_version(
        self, workspace_id: str, session_id: str, *, watching: bool = False
    ) -> int | None:
        """The session's version (int) as Valkey holds it now, or None when the session
        has no version (it never changed, or ``cleanup_workspace`` removed it: it has no
        entries then). One ``GET``, no entry is read: a watcher compares it with the
        highest version it was sent (docs/reference/websocket.md).

        With ``watching`` (a live watcher asking) the same round trip also renews the
        watcher count's ``WATCH_TTL``; a count that is gone (expired or flushed while
        watchers stay open) is counted again (+1), so the scripts keep publishing.
        Raises :class:`InvalidIdentifier` or :class:`OutboxUnavailable`.
        """
        keys = self.keys.session(workspace_id, session_id)
        calls: list[Cmd | Eval] = [Cmd(("GET", keys.version))]
        if watching:
            calls.append(Cmd(("EXPIRE", keys.watch, WATCH_TTL)))
        results = await self._arun(iter_once(Pipe(calls)))
        for result in results:
            if isinstance(result, Exception):
                raise result
        if watching and not int(results[1]):
            await self.awatch(workspace_id, session_id, +1)
        return None if results[0] is None else int(results[0])

    # -- the worker -----------------------------------------------------------------------------

    async def arun(
        self,
        deliverer: Callable[..., Any] | None = None,
        *,
        concurrency: int | None = None,
        tick: float | None = None,
        stop: asyncio.Event | None = None,
        grace: float = 30.0,
        once: bool = False,
        heartbeat: bool = True,
    ) -> WorkerStats:
        """Deliver until ``stop`` is set (or, with ``once``, until nothing is due now).

        Claims the key space (raises :class:`KeySpaceClaimed` at once when another
        project holds it), loads the scripts, recovers staged entries whose lease is
        gone, then delivers due sessions with at most ``concurrency`` (default
        ``CONCURRENCY``) at once, finding them through the due index every ``tick``
        seconds (default ``TICK``) and at once through the wake list that accepts push
        to; another project's claim stops it within ``CLAIM_RECHECK`` (2 s), raising
        :class:`KeySpaceTakenOver` (docs/howto/valkey.md#taking-a-key-space-over). After
        ``stop``, in-flight deliveries get ``grace`` seconds to finish before they are
        cancelled (recorded as ambiguous). Every task is joined before this returns the run's
        :class:`~django_outbox.core.worker.WorkerStats`.
        """
        worker = Worker(
            self,
            deliverer,
            concurrency=concurrency or self.config.concurrency,
            tick=tick or self.config.tick,
            stop=stop or asyncio.Event(),
            grace=grace,
            once=once,
            heartbeat=heartbeat,
        )
        return await worker.run()

    # -- testing --------------------------------------------------------------------------------

    def _seed_plan(self, workspace_id: str, session_id: str, raw_json: str | bytes) -> Plan[None]:
        entry = Entry.from_json(raw_json)
        check_identifier("entry ID", entry.id)
        if entry.accepted_at is None:
            raise ValueError("a seeded entry needs acceptedAt")
        staged = entry.status is Status.DELIVERING
        reply = SeedReply.parse(
            (
                yield self._session_eval(
                    "seed",
                    workspace_id,
                    session_id,
                    extra_args=seed_argv(entry.to_json(), entry.id, staged),
                )
            )
        )
        if reply.status == "exists":
            raise ValueError(f"entry {entry.id} is already queued in {workspace_id}/{session_id}")
        yield Emit(
            self._events(
                "updated",
                [entry.evolve(seq=reply.version).to_json()],
                workspace_id,
                session_id,
                reply.version,
            )
        )

    def seed_entry_for_test(
        self, workspace_id: str, session_id: str, raw_json: str | bytes
    ) -> None:
        """Push a raw JSON entry as-is (test harnesses only): no cap, no dedupe.

        An entry with status ``delivering`` goes to staging, as if a worker had
        died delivering it. Raises ``ValueError`` if the JSON is not an entry.
        """
        self._run(self._seed_plan(workspace_id, session_id, raw_json))

    async def aseed_entry_for_test(
        self, workspace_id: str, session_id: str, raw_json: str | bytes
    ) -> None:
        """Async :meth:`seed_entry_for_test`."""
        await self._arun(self._seed_plan(workspace_id, session_id, raw_json))
