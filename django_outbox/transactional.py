"""Accepting a prompt as part of the caller's database transaction (docs/howto/transactions.md).

:func:`accept_on_commit` (``Outbox.accept_on_commit``) checks the prompt at once, writes a
:class:`~django_outbox.models.PendingAccept` row in the caller's transaction and asks Django
to move it when that transaction commits (``transaction.on_commit(..., robust=True)``). The
prompt enters the outbox if and only if the row is committed: a rollback, of the
transaction or of a savepoint around the call, takes the row and its callback away
together. The move (:func:`move`) accepts the row's prompt into Valkey with ``accept`` and
deletes the row: right after the commit in the process that committed, or, when that
process died first, within about :data:`MOVE_INTERVAL` seconds by the duty every worker
runs (:func:`mover`).

Exactly one entry: two moves of one row (the committing process and a worker, or two
workers) accept one idempotency key with one content, so the outbox answers the second
with ``Duplicate``: the row has moved already, and it is deleted. The dedupe marker that
answers it lives ``DEDUPE_TTL`` seconds from the first move, which came after the row's
``created``; so the duty moves a row only within ``DEDUPE_TTL`` of its ``created``.

A refused move is never silent. It is logged (WARNING), written on the row (``attempts``,
``last_error``) for the admin's *Pending accepts*, and the worker's metrics count the rows
by state (``outbox_pending_accepts``):

* ``OutboxFull``, ``RateLimited``, ``OutboxUnavailable`` (``accepted`` or not: the next move
  answers ``Duplicate`` if the entry was stored), ``KeySpaceClaimed`` and any unexpected
  error: the row stays ``waiting`` and is tried again after :data:`RETRY_BACKOFF` seconds,
  doubling up to :data:`MAX_RETRY_BACKOFF` (at least a ``RateLimited``'s ``retry_after``),
  until ``DEDUPE_TTL`` after ``created``; then it is ``failed`` (logged at ERROR).
* ``IdempotencyConflict`` (the key holds another prompt), ``SessionBusy`` (the caller's
  ``if_busy="reject"``: its answer, not a condition to wait out), ``NotSupported`` (the
  agent cannot merge or cut) and invalid content or options (the settings changed since
  the call, e.g. a lower ``MAX_TEXT_BYTES``): ``failed`` at once.

Accept's options mean what they mean to ``accept``, from the call. ``if_busy`` is decided
when the prompt enters the outbox, by the accept script, as for ``accept``.
``expires_after`` counts from the call: the move gives ``accept`` what is left of it, the
time since the call measured on the database's clock (the row's ``created``, stamped by
the insert the call made, against the database's time at the move: one clock, whichever
process moves the row; see :func:`_from_the_call`). A prompt whose expiry passed before
its move is still accepted, with the shortest expiry ``accept`` takes
(:data:`EXPIRED_AT_THE_MOVE`), so it is stored and ends ``expired`` at the first claim,
never sent, as a prompt accepted in time that waited too long does; an ``interrupt``
prompt then cuts nothing (it is stored as queued).

A ``failed`` row stays until staff move it (the admin action, which ignores the window) or
delete it. A duty pass that fails (the database unreachable) pauses the next ones, so an
outage is not logged every second.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from asgiref.sync import sync_to_async
from django.db import connections, router, transaction
from django.db.models import Count, F
from django.db.models.functions import Now

from .core.agents import CAPABILITY_MERGE, UnknownAgent
from .core.duties import Duty
from .core.errors import (
    CutNotSupported,
    Duplicate,
    IdempotencyConflict,
    MergeNotSupported,
    NotSupported,
    RateLimited,
    SessionBusy,
)
from .core.rules import (
    check_accept_options,
    check_identifier,
    check_model_allowed,
    check_user_id,
    describe_error,
    validate_content,
)

if TYPE_CHECKING:
    from .core.service import Outbox
    from .models import PendingAccept

logger = logging.getLogger("django_outbox")

#: Seconds between two passes of a worker's :func:`mover`.
MOVE_INTERVAL = 1.0
#: Most rows one pass moves (and most it gives up) per database.
MOVE_BATCH = 100
#: Seconds before a refused move is tried again; doubled after each refusal.
RETRY_BACKOFF = 1.0
#: The longest wait between two tries of a refused move, in seconds.
MAX_RETRY_BACKOFF = 60.0
#: The ``expires_after`` a move gives accept for a prompt whose expiry passed before its
#: move, in seconds: the shortest accept takes (one microsecond on Valkey's clock; 0 would
#: mean "never"), so the entry is stored already expiring and the first claim, a later
#: script, marks it ``expired`` instead of sending it.
EXPIRED_AT_THE_MOVE = 1e-6


class Moved(enum.Enum):
    """What :func:`move` did with a row."""

    #: Accepted into the outbox now; the row is deleted.
    MOVED = "moved"
    #: An earlier move had accepted it (``Duplicate``); the row is deleted.
    ALREADY = "already"
    #: Refused for now; the row waits for its next try.
    REFUSED = "refused"
    #: Refused for good, or given up; the row waits for staff.
    FAILED = "failed"


class Move(NamedTuple):
    """:func:`move`'s answer: ``outcome``, and ``detail``, the entry's ID when it moved
    (``MOVED``, ``ALREADY``) or the refusal (``REFUSED``, ``FAILED``)."""

    outcome: Moved
    detail: str


def accept_on_commit(
    outbox: Outbox,
    workspace_id: str,
    session_id: str,
    *,
    user_id: str,
    client_message_id: str,
    text: str,
    model: dict[str, Any] | None = None,
    using: str | None = None,
    **options: Any,
) -> PendingAccept:
    """``outbox.accept_on_commit``: the prompt checked, its row written on ``using`` (None:
    the router's database for writing :class:`~django_outbox.models.PendingAccept`) and its
    move registered with that database's ``on_commit``; returns the row.
    Raises what ``accept`` raises for bad input (``InvalidIdentifier``, ``InvalidContent``,
    ``ContentTooLarge``; ``InvalidContent`` also for an ``if_busy`` or ``expires_after``
    that accept refuses), ``CutNotSupported`` for ``if_busy="interrupt"`` in a session
    whose agent cannot cut a turn (docs/howto/cutting.md), ``MergeNotSupported`` for
    ``if_busy="merge"`` in one whose agent does not deliver merged prompts
    (docs/howto/agents.md#what-every-agent-carries), ``TypeError`` for an option
    ``accept`` does not take or a value that is not JSON, and what the database raises."""
    from .models import PendingAccept

    check_identifier("workspace ID", workspace_id)
    check_identifier("session ID", session_id)
    check_accept_options(options.get("if_busy", "queue"), options.get("expires_after"))
    if options.get("if_busy") == "interrupt" and not _can_cut(outbox, workspace_id, session_id):
        # The move would be refused for good: say so inside the caller's transaction.
        raise CutNotSupported("no aborter is configured: the running turn cannot be cut")
    if options.get("if_busy") == "merge" and not outbox.carries(
        workspace_id, session_id, CAPABILITY_MERGE
    ):
        raise MergeNotSupported(
            "the session's agent does not declare that it delivers merged prompts: "
            "send it without if_busy='merge'"
        )
    validate_content(text, model, client_message_id, outbox.config.max_text_bytes)
    check_model_allowed(model, outbox.config.models)
    user_id = check_user_id(user_id)
    prompt = {"user_id": user_id, "text": text, "model": model}
    try:
        # The move passes the options to accept: one it does not take fails now.
        inspect.signature(outbox.accept).bind(
            workspace_id, session_id, client_message_id=client_message_id, **prompt, **options
        )
        payload = json.dumps({**prompt, "options": options}, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"accept_on_commit() passes its options to accept(): {exc}") from None
    db = using or router.db_for_write(PendingAccept)
    pending = PendingAccept.objects.using(db).create(
        workspace_id=workspace_id,
        session_id=session_id,
        client_message_id=client_message_id,
        payload=payload,
    )
    transaction.on_commit(lambda: move(outbox, pending, using=db), using=db, robust=True)
    return pending


def _can_cut(outbox: Outbox, workspace_id: str, session_id: str) -> bool:
    """Whether the session's agent has an aborter (an unroutable session has none)."""
    try:
        return outbox.aborter_for(workspace_id, session_id) is not None
    except UnknownAgent:
        return False


def move(outbox: Outbox, pending: PendingAccept, *, using: str) -> Move:
    """Accept ``pending``'s prompt into ``outbox`` and delete its row on ``using``, or write
    the refusal on the row (see the module docstring for which refusals are retried).
    Idempotent: a second move of a moved row answers ``ALREADY``. Raises only what the
    database raises while deleting or updating the row (the row then stays, and a later
    move settles it)."""
    from .models import PendingAccept

    rows = PendingAccept.objects.using(using).filter(pk=pending.pk)
    try:
        prompt = json.loads(pending.payload)
        entry = outbox.accept(
            pending.workspace_id,
            pending.session_id,
            user_id=prompt["user_id"],
            client_message_id=pending.client_message_id,
            text=prompt["text"],
            model=prompt["model"],
            **_from_the_call(rows, pending, prompt["options"]),
        )
    except Duplicate as dup:
        rows.delete()
        return Move(Moved.ALREADY, dup.accepted_id)
    except (IdempotencyConflict, SessionBusy, NotSupported, ValueError, TypeError, KeyError) as exc:
        # The key holds another prompt, the caller asked for a refusal while busy, the
        # agent cannot do what was asked, or the prompt breaks today's rules: no retry helps.
        return _refused(rows, pending, exc, final=True)
    except Exception as exc:
        return _refused(rows, pending, exc, final=False)
    rows.delete()
    return Move(Moved.MOVED, entry.id)


def _from_the_call(rows: Any, pending: PendingAccept, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` (the row's, for ``accept``) with ``expires_after`` counted from the call:
    what is left of it now. The time since the call is read from the database, on its
    clock alone (``created`` was stamped there by the call's insert), so neither the web
    process's clock nor the mover's enters; what is left is handed to accept, which counts
    it on Valkey's clock as every expiry. Left nothing (or the row is gone: another move
    took it, and accept answers ``Duplicate``): :data:`EXPIRED_AT_THE_MOVE`, and
    ``if_busy="interrupt"`` becomes ``"queue"``, since a prompt that is never sent must
    not cut the running turn. Raises ``InvalidContent`` for options accept refuses (a row
    written before the call checked them) and what the database raises."""
    expires_after = options.get("expires_after")
    if expires_after is None:
        return options
    check_accept_options(options.get("if_busy", "queue"), expires_after)
    found = rows.annotate(now=Now()).values_list("created", "now").first()
    if found is not None:
        called, now = found
        left = expires_after - (now - called).total_seconds()
        if left > 0:
            return {**options, "expires_after": left}
        logger.warning(
            "outbox: the accept on commit %s (%s/%s key %r) expired before its move "
            "(expires_after %g s from the call, %.1f s ago): stored to end expired, never sent",
            pending.pk,
            pending.workspace_id,
            pending.session_id,
            pending.client_message_id,
            expires_after,
            (now - called).total_seconds(),
        )
    expired = {**options, "expires_after": EXPIRED_AT_THE_MOVE}
    if expired.get("if_busy") == "interrupt":
        expired["if_busy"] = "queue"
    return expired


def _refused(rows: Any, pending: PendingAccept, exc: Exception, *, final: bool) -> Move:
    """Write a refusal on the row (``rows``: its queryset) and log it."""
    from .models import PendingAccept

    reason = describe_error(exc)
    where = f"{pending.workspace_id}/{pending.session_id} key {pending.client_message_id!r}"
    if final:
        rows.update(state=PendingAccept.State.FAILED, attempts=F("attempts") + 1, last_error=reason)
        logger.error(
            "outbox: the accept on commit %s (%s) was refused for good: %s; it waits for "
            "staff (admin: Pending accepts)",
            pending.pk,
            where,
            reason,
        )
        return Move(Moved.FAILED, reason)
    wait = min(MAX_RETRY_BACKOFF, RETRY_BACKOFF * 2 ** min(pending.attempts, 32))
    if isinstance(exc, RateLimited):
        wait = max(wait, float(exc.retry_after))
    rows.update(
        attempts=F("attempts") + 1,
        last_error=reason,
        next_attempt=Now() + timedelta(seconds=wait),
    )
    if pending.state == PendingAccept.State.FAILED:
        then = "it stays failed, for staff"  # a staff move of a failed row
    else:
        then = f"tried again in {wait:g} s"
    logger.warning(
        "outbox: moving the accept on commit %s (%s) into the outbox was refused: %s; %s",
        pending.pk,
        where,
        reason,
        then,
    )
    return Move(Moved.REFUSED, reason)


# -- the worker's duty -----------------------------------------------------------------------

#: Databases where the table was found (it stays once migrated).
_tables_seen: set[str] = set()


def _databases() -> Iterator[str]:
    """The databases that may hold rows: those the router lets the table live in, and
    that have it (a worker's database without migrations holds none)."""
    from .models import PendingAccept

    for alias in connections:
        if connections[alias].vendor == "dummy":  # DATABASES is empty: nowhere to look
            continue
        if not router.allow_migrate_model(alias, PendingAccept):
            continue
        if alias not in _tables_seen:
            if PendingAccept._meta.db_table not in connections[alias].introspection.table_names():
                continue
            _tables_seen.add(alias)
        yield alias


def move_due(outbox: Outbox, *, batch: int = MOVE_BATCH) -> int:
    """One pass of the duty: on every database holding the table, give up the waiting rows
    older than ``DEDUPE_TTL``, then move the waiting rows whose ``next_attempt`` has come,
    oldest first, at most ``batch`` of each. Returns the rows moved (``MOVED`` or
    ``ALREADY``). Connections are treated as Django treats them around a request: closed
    before and after when unusable or older than ``CONN_MAX_AGE``. Raises what the
    database raises."""
    from .models import PendingAccept

    window = timedelta(seconds=outbox.config.dedupe_ttl)
    moved = 0
    for alias in _databases():
        connection = connections[alias]
        # A worker has no request cycle to close a connection the database dropped.
        outside = not connection.in_atomic_block
        if outside:
            connection.close_if_unusable_or_obsolete()
        try:
            waiting = PendingAccept.objects.using(alias).filter(state=PendingAccept.State.WAITING)
            for pending in waiting.filter(created__lte=Now() - window).order_by("pk")[:batch]:
                _give_up(pending, alias)
            due = waiting.filter(next_attempt__lte=Now(), created__gt=Now() - window)
            for pending in due.order_by("pk")[:batch]:
                if move(outbox, pending, using=alias).outcome in (Moved.MOVED, Moved.ALREADY):
                    moved += 1
        finally:
            if outside:
                connection.close_if_unusable_or_obsolete()
    return moved


def _give_up(pending: PendingAccept, using: str) -> None:
    from .models import PendingAccept

    reason = (
        "not moved within DEDUPE_TTL of the accept: a move now could no longer be told "
        f"from an earlier one; last refusal: {pending.last_error or 'none'}"
    )
    PendingAccept.objects.using(using).filter(
        pk=pending.pk, state=PendingAccept.State.WAITING
    ).update(state=PendingAccept.State.FAILED, last_error=reason)
    logger.error(
        "outbox: gave up the accept on commit %s (%s/%s key %r) after %d refused moves: %s; "
        "it waits for staff (admin: Pending accepts)",
        pending.pk,
        pending.workspace_id,
        pending.session_id,
        pending.client_message_id,
        pending.attempts,
        reason,
    )


def mover(outbox: Outbox, interval: float = MOVE_INTERVAL) -> Duty:
    """The worker duty (:class:`~django_outbox.core.duties.Duty`) that runs
    :func:`move_due` every ``interval`` seconds, the first pass at the worker's start; in a
    ``once`` run too. A pass that fails (the database unreachable) is logged by the worker,
    and the passes pause for ``interval`` seconds, doubling after each failed pass up to
    :data:`MAX_RETRY_BACKOFF`, so an outage is not logged every second."""
    failures = 0
    resume_at = 0.0

    async def run() -> None:
        nonlocal failures, resume_at
        if time.monotonic() < resume_at:
            return
        try:
            moved = await sync_to_async(move_due, thread_sensitive=True)(outbox)
        except Exception:
            pause = min(MAX_RETRY_BACKOFF, interval * 2 ** min(failures, 32))
            failures += 1
            resume_at = time.monotonic() + pause
            raise
        failures = 0
        if moved:
            logger.info("outbox: moved %d accepts committed in the database", moved)

    return Duty("moving accepts on commit", interval, run, first_after=0.0, burst=True)


def pending_counts() -> dict[str, int]:
    """Rows of :class:`~django_outbox.models.PendingAccept` by state, over every database
    that holds the table (for the worker's metrics). Raises what the database raises."""
    from .models import PendingAccept

    counts = dict.fromkeys(PendingAccept.State.values, 0)
    for alias in _databases():
        by_state = PendingAccept.objects.using(alias).values("state").order_by()
        for row in by_state.annotate(n=Count("pk")):
            counts[row["state"]] = counts.get(row["state"], 0) + row["n"]
    return counts
