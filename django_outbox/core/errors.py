"""Errors raised by the outbox and by deliverers (no Django imports).

Service errors derive from :class:`OutboxError`. The three delivery
outcome errors are raised *by deliverers* to tell the worker what happened
downstream (docs/explanation/lifecycle.md#what-happens-to-a-message); they wrap the
underlying error as ``err``.
"""

from __future__ import annotations

import math
from typing import Any


class OutboxError(Exception):
    """Base class of every error the outbox service raises."""


class Duplicate(OutboxError):
    """The idempotency key was already accepted with the same content.

    ``accepted_id`` is the original entry's ID; answer it (HTTP 200), it is
    not a failure.
    """

    def __init__(self, accepted_id: str) -> None:
        super().__init__(f"already accepted as {accepted_id}")
        self.accepted_id = accepted_id


class IdempotencyConflict(OutboxError):
    """The idempotency key was already used with a different text or model (HTTP 422)."""

    def __init__(self, accepted_id: str) -> None:
        super().__init__(
            f"clientMessageID was already used for entry {accepted_id} with different content"
        )
        self.accepted_id = accepted_id


class OutboxFull(OutboxError):
    """A bound on queued entries is reached (HTTP 429): ``scope`` ``"session"``, the
    session holds ``CAP`` entries; ``"user"``, the accepting user has ``USER_MAX_QUEUED``
    entries queued or in flight in the workspace
    (docs/explanation/idempotency.md#per-user-bounds). ``cap`` is the bound that was
    reached."""

    def __init__(self, cap: int, scope: str = "session") -> None:
        if scope == "user":
            message = f"this user already has {cap} entries queued in the workspace"
        else:
            message = f"session outbox is full ({cap} entries)"
        super().__init__(message)
        self.cap = cap
        self.scope = scope


class RateLimited(OutboxError):
    """The accepting user used up ``USER_ACCEPTS_PER_MINUTE`` (``limit``) in the workspace
    (HTTP 429); an accept can succeed again in ``retry_after`` seconds
    (docs/explanation/idempotency.md#per-user-bounds)."""

    def __init__(self, retry_after: int, limit: int) -> None:
        super().__init__(
            f"this user accepted {limit} messages into the workspace within a minute; "
            f"retry in {retry_after} s"
        )
        self.retry_after = retry_after
        self.limit = limit


class SessionBusy(OutboxError):
    """An accept with ``if_busy="reject"`` found the session busy: something pending, in
    flight or being verified (HTTP 409 ``session_busy``). Nothing was stored and no dedupe
    marker written, so the same key may be sent again later
    (docs/howto/steering.md#busy-sessions)."""

    def __init__(self) -> None:
        super().__init__("the session is busy: a prompt is pending, in flight or being verified")


class InvalidIdentifier(OutboxError, ValueError):
    """A workspace, session or entry ID breaks ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``."""

    def __init__(self, kind: str, value: object) -> None:
        super().__init__(
            f"invalid {kind} {value!r}: must match ^[A-Za-z0-9][A-Za-z0-9._-]{{0,127}}$"
        )
        self.kind = kind
        self.value = value


class InvalidContent(OutboxError, ValueError):
    """Text, model, idempotency key, user ID or park reason breaks a rule of
    :mod:`django_outbox.core.rules` (HTTP 400); the message names the rule."""


class ModelNotAllowed(InvalidContent):
    """The prompt's model selector is not in ``OUTBOX["MODELS"]`` (HTTP 400
    ``model_not_allowed``); ``name`` is the ``"providerID/modelID"`` asked for, or None
    when the selector names none (docs/reference/settings.md#models)."""

    def __init__(self, name: str | None) -> None:
        if name is None:
            message = 'model must name a "providerID" and a "modelID" (OUTBOX["MODELS"] is set)'
        else:
            message = f"model {name!r} is not allowed here (OUTBOX['MODELS'])"
        super().__init__(message)
        self.name = name


class ContentTooLarge(InvalidContent):
    """Text or model is larger than allowed (HTTP 413); ``size`` and ``limit`` in bytes."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(f"{what} is {size} UTF-8 bytes; the limit is {limit}")
        self.what = what
        self.size = size
        self.limit = limit


class OutboxUnavailable(OutboxError):
    """Valkey was unreachable, refused the write (OOM, read-only) or a durability wait timed out.

    ``accepted`` is True when the entry *was* stored but a ``WAIT_REPLICAS`` /
    ``WAIT_AOF`` acknowledgement did not arrive in time: a retry with the same
    idempotency key then answers :class:`Duplicate` with the entry's ID.
    """

    def __init__(self, message: str, *, accepted: bool = False) -> None:
        super().__init__(message)
        self.accepted = accepted


class KeySpaceClaimed(OutboxError):
    """The key space (``KEY_PREFIX`` on this server and database) belongs to another
    project: this outbox does not deliver, clean up or accept there
    (docs/howto/valkey.md#one-project-per-key-space). ``prefix`` is the key prefix,
    ``claimed_by`` who holds the space (the claim's label, host and time, as text)."""

    def __init__(self, prefix: str, claimed_by: str) -> None:
        super().__init__(
            f"the outbox key space {prefix!r} on this Valkey database belongs to another "
            f"project ({claimed_by}); this project does not deliver, clean up or accept "
            "there. Give it its own KEY_PREFIX or database number, or take the key space "
            "over deliberately (docs/howto/valkey.md#one-project-per-key-space)"
        )
        self.prefix = prefix
        self.claimed_by = claimed_by


class KeySpaceTakenOver(KeySpaceClaimed):
    """Another project claimed the key space while this worker ran (``outbox claim
    --force``): the worker stopped claiming and delivering there at once, its in-flight
    deliveries cancelled and left to the new owner's workers to verify
    (docs/howto/valkey.md#taking-a-key-space-over). ``prefix`` and ``claimed_by`` as
    :class:`KeySpaceClaimed`'s."""

    def __init__(self, prefix: str, claimed_by: str) -> None:
        OutboxError.__init__(
            self,
            f"the outbox key space {prefix!r} on this Valkey database was claimed by "
            f"another project ({claimed_by}) while this worker ran: it stopped claiming and "
            "delivering there at once, and left its in-flight deliveries to the new owner's "
            "workers to verify. Give this project its own KEY_PREFIX or database number "
            "(docs/howto/valkey.md#taking-a-key-space-over)",
        )
        self.prefix = prefix
        self.claimed_by = claimed_by


class ServerUnsupported(OutboxError):
    """The server cannot do what the outbox or its settings need (too old, or without a
    command such as WAITAOF for ``WAIT_AOF``): the worker does not start
    (docs/howto/valkey.md#supported-servers). ``unmet`` lists each reason, with its fix."""

    def __init__(self, unmet: list[Any]) -> None:
        super().__init__(" ".join(f"{u.message} {u.hint}" for u in unmet))
        self.unmet = unmet


class AgentMisconfigured(OutboxError):
    """An agent's start-up probe found that it refuses what the settings name (a LangGraph
    ``ASSISTANT_ID`` the server does not know): the worker does not start
    (docs/howto/agents.md#the-start-up-probe)."""


class NotSupported(OutboxError):
    """The session's agent cannot carry out what was asked; nothing was stored or changed
    (REST: 409 ``not_supported``; docs/howto/agents.md#what-every-agent-carries)."""


class CutNotSupported(NotSupported):
    """A running turn cannot be cut: no aborter is configured for the session's agent
    (``OUTBOX["ABORTER"]``). Raised by :meth:`Outbox.accept_interrupting` before anything
    is stored (REST: 409 ``not_supported``; docs/howto/cutting.md)."""


class MergeNotSupported(NotSupported):
    """``if_busy="merge"`` for a session whose agent's deliverer does not declare that it
    sends every part of a merged delivery (``outbox_capabilities`` without ``"merge"``),
    or whose agent cannot be resolved now. Raised by ``accept`` before anything is
    stored, so no merged prompt is ever marked delivered without reaching the agent
    (REST: 409 ``not_supported``; docs/howto/agents.md#what-every-agent-carries)."""


class SignalOwed(Exception):
    """Raised by an emit hook (``Outbox.emit`` / ``aemit``) for a ``delivered`` event
    whose receivers must run again: the entry is not acknowledged, its
    ``entry_delivered`` stays owed and is fired again by a later claim of the session,
    once the lease it was fired under has expired (``LOCK_TTL`` seconds;
    docs/reference/signals.md). ``reason`` says which receivers failed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _DeliveryOutcome(Exception):
    """Base of the deliverer outcome errors; ``err`` is the wrapped cause (or None)."""

    def __init__(self, message: object = "", err: BaseException | None = None) -> None:
        if isinstance(message, BaseException) and err is None:
            err, message = message, _safe_str(message) or type(message).__name__
        super().__init__(_safe_str(message))
        self.err = err
        if err is not None:
            self.__cause__ = err


class AmbiguousError(_DeliveryOutcome):
    """The attempt's outcome is unknown (timeout mid-turn, connection cut after sending).

    The entry moves to ``verifying`` and the verifier decides; it is never resent blindly.
    """


class TransientDeliveryError(_DeliveryOutcome):
    """No attempt was driven (name did not resolve, connection refused).

    The entry goes back to pending with backoff; the attempt number is not used up
    (``transientFails`` grows instead, bounded by ``MAX_TRANSIENT_FAILURES``).
    """


class PriorAttemptPendingError(_DeliveryOutcome):
    """The previous attempt is still owned downstream; like transient, no attempt is minted."""


class HoldDeliveryError(_DeliveryOutcome):
    """The agent refused the prompt for now and said when to come back (HTTP 429 or 503
    with ``Retry-After``): nothing was delivered and no attempt is used. The entry stays
    pending, due again in ``retry_after`` seconds (at most ``HOLD_MAX``), and its session
    waits behind it; ``holds`` counts such answers in a row, and past ``MAX_HOLDS`` the
    entry ends in error ``hold_exhausted`` (docs/howto/agents.md#write-your-own-agent).
    ``retry_after``: seconds, a finite number >= 0 (``ValueError`` otherwise, also for an
    int too large for a float)."""

    def __init__(
        self, message: object = "", err: BaseException | None = None, *, retry_after: float
    ) -> None:
        super().__init__(message, err)
        if (
            isinstance(retry_after, bool)
            or not isinstance(retry_after, int | float)
            or not _finite(retry_after)
            or retry_after < 0
        ):
            raise ValueError(
                f"retry_after must be a finite number of seconds >= 0, got {retry_after!r}"
            )
        self.retry_after = float(retry_after)


def _finite(number: float) -> bool:
    """Whether ``number`` is finite as a float: an int past the float range is not (where
    ``math.isfinite`` would raise ``OverflowError``)."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _safe_str(value: object) -> str:
    """``str(value)``, or its ``repr``, or a placeholder: wrapping an exception whose
    ``__str__`` raises must not turn the deliverer's ``raise`` into another error."""
    for render in (str, repr):
        try:
            text = render(value)
            if isinstance(text, str):
                return str.__str__(text)
        except Exception:
            continue
    return f"<unprintable {type(value).__name__}>"
