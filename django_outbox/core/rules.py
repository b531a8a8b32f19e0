"""What callers may send: identifiers, idempotency keys, text, model and park reasons.

One place for the input rules (no Django imports). The core applies them before
anything reaches Valkey; adapters (the REST serializers, the WebSocket consumer,
the admin) import them rather than restating them, so a rule changes in one
place. Breaking a rule raises a typed error from :mod:`django_outbox.core.errors`:
:class:`InvalidIdentifier` (HTTP 400), :class:`InvalidContent` (400) or its
subclass :class:`ContentTooLarge` (413). Both content errors are ``ValueError``\\s.

The identifier allow-list keeps ``:``, ``{``, ``}``, ``*``, whitespace and
newlines out of key names, so no input can alias another session's keys or act
as a pattern (docs/explanation/storage.md).

It also says what comes out: text the outbox did not write is cleaned (:func:`clean_text`,
:func:`describe_error`), a stored error is summarised for every viewer
(:func:`summarize_error`, :func:`entry_for_viewer`), and an entry's JSON has a bound
(:func:`max_entry_json_bytes`).
"""

from __future__ import annotations

import enum
import fnmatch
import json
import math
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ContentTooLarge, InvalidContent, InvalidIdentifier, ModelNotAllowed
from .errors import _safe_str as _safe_str
from .redaction import redact

IDENTIFIER_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: Characters a clientMessageID may use: printable ASCII, 1..128 of them.
CLIENT_MESSAGE_ID_RE = re.compile(r"[\x20-\x7e]{1,128}")
#: Largest compact UTF-8 JSON encoding of a model, in bytes.
MAX_MODEL_BYTES = 16 * 1024
#: Deepest nesting of objects/arrays in a model (the model object itself is 1). Python's
#: JSON codec recurses, so a model nested near the interpreter's limit could be stored
#: from a shallow stack and then fail to decode in a deeper one, poisoning the queue.
MAX_MODEL_DEPTH = 32
MAX_REASON_CHARS = 200
MAX_USER_ID_CHARS = 255

#: The encoding entries are stored in (also :mod:`django_outbox.core.entry`'s): a model
#: must encode this way to be accepted.
encode_stored = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def check_identifier(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid workspace, session or entry ID, else raise.

    ``kind`` names the value in the message (``"workspace ID"``). Raises
    :class:`InvalidIdentifier` unless ``value`` is a str matching
    ``^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$``.
    """
    if not isinstance(value, str) or not IDENTIFIER_RE.fullmatch(value):
        raise InvalidIdentifier(kind, value)
    return value


def check_reason(reason: object) -> str:
    """Return a park reason: a non-blank str of at most 200 characters.

    Raises :class:`InvalidContent` otherwise.
    """
    if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON_CHARS:
        raise InvalidContent(
            f"reason must be a non-empty string of at most {MAX_REASON_CHARS} characters"
        )
    return reason


#: Unicode categories a park reason may not contain: controls (NUL, escapes), format
#: characters (a right-to-left override, a zero-width space) and line/paragraph
#: separators, which would make a reason read differently from what it stores.
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
#: The message every adapter shows when a reason breaks :func:`check_printable_reason`.
UNPRINTABLE_REASON = "reason must not contain control or format characters"


def has_unprintable(text: str) -> bool:
    """Whether ``text`` holds a character of :data:`UNPRINTABLE_CATEGORIES`."""
    return any(unicodedata.category(ch) in UNPRINTABLE_CATEGORIES for ch in text)


def check_printable_reason(reason: object) -> str:
    """Return a new park reason: :func:`check_reason`, and no character of
    :data:`UNPRINTABLE_CATEGORIES`. The REST API, the admin and the Python API share this
    rule; an unpark filter is checked by :func:`check_reason` alone, so a reason stored
    before the rule can still be matched. Raises :class:`InvalidContent`."""
    reason = check_reason(reason)
    if has_unprintable(reason):
        raise InvalidContent(UNPRINTABLE_REASON)
    return reason


def check_user_id(user_id: object) -> str:
    """Return the accepting user's ID as a str (an int is converted).

    Raises :class:`InvalidContent` unless it is a str (or int) of at most 255 characters.
    """
    if isinstance(user_id, int) and not isinstance(user_id, bool):
        user_id = str(user_id)
    if not isinstance(user_id, str) or len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidContent(f"user_id must be a string of at most {MAX_USER_ID_CHARS} characters")
    return user_id


def json_depth(value: Any, limit: int = MAX_MODEL_DEPTH) -> int:
    """Nesting depth of a JSON value (a scalar is 0, ``{}`` is 1), counting no further
    than ``limit + 1`` so a hostile value costs at most ``limit`` levels of recursion."""
    children: Iterable[Any]
    if isinstance(value, dict):
        children = value.values()
    elif isinstance(value, list):
        children = value
    else:
        return 0
    if limit < 0:
        return 1
    return 1 + max((json_depth(c, limit - 1) for c in children), default=0)


def validate_content(
    text: object, model: object, client_message_id: object, max_text_bytes: int
) -> None:
    """Check what a client sends with a prompt; raise naming the rule that failed.

    Rules: ``client_message_id`` is 1..128 printable ASCII characters; ``text``
    is a str of 1..``max_text_bytes`` UTF-8 bytes with no lone surrogates;
    ``model`` is None or a JSON object of at most 16 KiB (encoded) and 32
    levels, with finite numbers. Size rules raise :class:`ContentTooLarge`
    (HTTP 413), the others :class:`InvalidContent` (HTTP 400).
    """
    if not isinstance(client_message_id, str) or not CLIENT_MESSAGE_ID_RE.fullmatch(
        client_message_id
    ):
        raise InvalidContent("clientMessageID must be 1 to 128 printable ASCII characters")
    if not isinstance(text, str):
        raise InvalidContent("text must be a string")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidContent("text must be valid Unicode (it contains a lone surrogate)") from None
    if size == 0:
        raise InvalidContent("text must not be empty")
    if size > max_text_bytes:
        raise ContentTooLarge("text", size, max_text_bytes)
    if model is None:
        return
    check_model(model)


def model_name(model: object) -> str | None:
    """The ``"providerID/modelID"`` a model selector names (opencode's shape:
    ``{"providerID": "anthropic", "modelID": "claude-sonnet-4"}``), or None when it does
    not hold both as non-empty strings."""
    if not isinstance(model, dict):
        return None
    provider, name = model.get("providerID"), model.get("modelID")
    if not isinstance(provider, str) or not isinstance(name, str) or not provider or not name:
        return None
    return f"{provider}/{name}"


def check_model_allowed(model: object, allowed: tuple[str, ...] | None) -> None:
    """Raise :class:`ModelNotAllowed` unless ``model`` is None, ``allowed`` is None (any
    valid selector), or the selector's :func:`model_name` matches one of ``allowed``:
    exact names or ``fnmatch`` patterns (``"anthropic/*"``), case-sensitive. An empty
    ``allowed`` refuses every model. docs/reference/settings.md#models"""
    if model is None or allowed is None:
        return
    name = model_name(model)
    if name is None or not any(fnmatch.fnmatchcase(name, pattern) for pattern in allowed):
        raise ModelNotAllowed(name)


def check_model(model: object) -> None:
    """Check a per-prompt model selector: a JSON object of at most 16 KiB (encoded) and
    32 levels with finite numbers. Raises :class:`InvalidContent` or
    :class:`ContentTooLarge`."""
    if not isinstance(model, dict):
        raise InvalidContent("model must be a JSON object")
    if json_depth(model, MAX_MODEL_DEPTH) > MAX_MODEL_DEPTH:
        raise InvalidContent(f"model must not nest deeper than {MAX_MODEL_DEPTH} levels")
    try:
        encoded = encode_stored(model).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as exc:
        raise InvalidContent(f"model must be plain JSON: {exc}") from None
    if len(encoded) > MAX_MODEL_BYTES:
        raise ContentTooLarge("model", len(encoded), MAX_MODEL_BYTES)


# --- text the outbox did not write ----------------------------------------------------

#: Characters past ``limit`` that :func:`clean_text` still redacts, so that a credential
#: straddling the cut is removed whole before the cut (and what redaction removes
#: cannot pull a cut credential's start into the kept text).
_REDACTION_MARGIN = 16 * 1024
#: Lone surrogates: what ``bytes.decode(errors="surrogateescape")`` leaves in a str for
#: bytes that are not UTF-8. They cannot be encoded, stored or sent as JSON.
_SURROGATES = re.compile("[\ud800-\udfff]")


def clean_text(text: object, limit: int) -> str:
    """``text`` made safe to store and send: a str (anything else through
    :func:`describe_error`'s safe ``str``), lone surrogates replaced by U+FFFD,
    credentials removed (:func:`~django_outbox.core.redaction.redact`,
    docs/explanation/security.md), at most ``limit`` characters (an ellipsis marks a cut).
    For exception messages, verifier output and agent replies: text the outbox did not
    write itself."""
    if not isinstance(text, str):
        text = _safe_str(text)
    elif type(text) is not str:
        text = str.__str__(text)  # a str subclass with its own __str__ cannot interfere
    # Redact before the cut (a cut URL would no longer look like one), on a bounded slice.
    text = redact(_SURROGATES.sub("\ufffd", text[: limit + _REDACTION_MARGIN]))
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + "\u2026"
    return text


def describe_error(exc: BaseException, *, with_type: bool = True) -> str:
    """``"<Type>: <message>"`` (or the message alone) of an exception, for storing as an
    entry's ``lastError``. Never raises, whatever the exception's ``__str__``,
    ``__repr__`` or class name do; the message is cleaned by :func:`clean_text`
    (bounded to 2,000 characters)."""
    message = _safe_str(exc)
    if not with_type:
        return clean_text(message, MAX_ERROR_CHARS)
    try:
        name = type(exc).__name__
        if not isinstance(name, str):
            raise TypeError
    except Exception:
        name = "Exception"
    return clean_text(f"{name}: {message}" if message else name, MAX_ERROR_CHARS)


#: Longest stored error text (characters).
MAX_ERROR_CHARS = 2000


# --- what every viewer reads of a failure -------------------------------------------------


class ErrorKind(enum.StrEnum):
    """What ended an entry's last attempt, as every viewer may read it (``errorKind``;
    docs/explanation/security.md)."""

    TIMEOUT = "timeout"  #: the agent did not answer within ``DELIVERY_TIMEOUT``
    UNREACHABLE = "unreachable"  #: nothing was sent: the agent could not be reached
    AGENT_ERROR = "agent_error"  #: the agent answered a server error (5xx)
    REJECTED = "rejected"  #: the agent answered another non-2xx status
    NO_ANSWER = "no_answer"  #: sent, but no answer came back (the outcome is unknown)
    INTERRUPTED = "interrupted"  #: the delivery was cancelled (a worker stopping)
    STOPPED = "stopped"  #: a Stop cut the agent's turn (docs/howto/cutting.md); no failure
    UNCONFIRMED = "unconfirmed"  #: whether the agent has the message could not be told
    NOT_RECEIVED = "not_received"  #: the verifier found the agent does not have it
    AGENT_BUSY = "agent_busy"  #: the agent still handles an earlier attempt
    HELD = "held"  #: the agent asked to be left alone until a time (docs/howto/agents.md)
    UNAVAILABLE = "unavailable"  #: the queue store did not confirm the step
    FAILED = "failed"  #: the deliverer failed in another way


#: The short text every viewer reads for each kind (``{status}``: `` (HTTP 503)`` or "").
ERROR_TEXTS = {
    ErrorKind.TIMEOUT: "the agent did not answer in time",
    ErrorKind.UNREACHABLE: "the agent could not be reached",
    ErrorKind.AGENT_ERROR: "the agent answered with an error{status}",
    ErrorKind.REJECTED: "the agent refused the message{status}",
    ErrorKind.NO_ANSWER: "the message was sent but no answer came back",
    ErrorKind.INTERRUPTED: "the delivery was interrupted",
    ErrorKind.STOPPED: "stopped: the turn was cut",
    ErrorKind.UNCONFIRMED: "it could not be confirmed that the agent has the message",
    ErrorKind.NOT_RECEIVED: "the agent does not have the message",
    ErrorKind.AGENT_BUSY: "the agent is still handling an earlier attempt",
    ErrorKind.HELD: "the agent is busy and asked to wait",
    ErrorKind.UNAVAILABLE: "the queue store did not confirm the delivery step",
    ErrorKind.FAILED: "the delivery failed",
}

# The stored texts' openings, as the delivery step writes them (core/step.py and
# core/calling.py); a test drives each through a real delivery.
_KIND_BY_OPENING = (
    ("cancelled", ErrorKind.INTERRUPTED),
    ("interrupted: the turn was cut", ErrorKind.STOPPED),
    ("timed out after ", ErrorKind.TIMEOUT),
    ("transient: replicas did not acknowledge", ErrorKind.UNAVAILABLE),
    ("prior attempt pending: ", ErrorKind.AGENT_BUSY),
    ("held for ", ErrorKind.HELD),
    ("verifier: the agent does not have it", ErrorKind.NOT_RECEIVED),
    ("verifier", ErrorKind.UNCONFIRMED),
    ("outcome unknown", ErrorKind.UNCONFIRMED),
)
# An HTTP status where a message starts with one (after an exception's type): the opencode
# deliverer's "opencode answered HTTP 503 for <url>" and httpx's raise_for_status()
# "Server error '503 Service Unavailable' for url ...". Anchored: a status further on
# (in the agent's body) is the agent's text, not the answer's status.
_STATUS = re.compile(
    r"(?:[A-Za-z_][\w.]{0,99}: )?"
    r"(?:[\w.-]{1,40} answered HTTP (?P<answered>[1-5]\d\d)(?!\d)"
    r"|(?:Informational response|Redirect response|Client error|Server error) "
    r"'(?P<raised>[1-5]\d\d) )"
)


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """What every viewer reads of a stored error: its ``kind``, the agent's HTTP
    ``status`` when it answered one (else None) and a short ``text`` that holds nothing
    the agent wrote."""

    kind: ErrorKind
    status: int | None
    text: str


def summarize_error(last_error: str) -> ErrorSummary:
    """The :class:`ErrorSummary` of a stored ``lastError`` (as the delivery step writes
    it: ``"transient: ..."``, ``"ambiguous: ..."``, ``"timed out after ..."``,
    ``"<Type>: <message>"``, ...). Reads only the text's opening and the status the
    message starts with; never raises."""
    kind: ErrorKind | None = None
    for opening, known in _KIND_BY_OPENING:
        if last_error.startswith(opening):
            kind = known
            break
    status = None
    if kind is None:
        outcome, colon, rest = last_error.partition(": ")
        if not colon or outcome not in ("transient", "ambiguous"):
            outcome, rest = "", last_error
        match = _STATUS.match(rest)
        if match is not None:
            status = int(match["answered"] or match["raised"])
            kind = ErrorKind.AGENT_ERROR if status >= 500 else ErrorKind.REJECTED
        elif outcome == "transient":
            kind = ErrorKind.UNREACHABLE
        elif outcome == "ambiguous":
            kind = ErrorKind.NO_ANSWER
        else:
            kind = ErrorKind.FAILED
    shown = f" (HTTP {status})" if status is not None else ""
    return ErrorSummary(kind, status, ERROR_TEXTS[kind].format(status=shown))


def entry_for_viewer(data: dict[str, Any], *, excerpt: bool) -> dict[str, Any]:
    """An entry's wire dict (``Entry.to_dict()``) as one viewer reads it. With a
    ``lastError``: ``errorKind`` (an :class:`ErrorKind`) and, when the agent answered
    one, ``errorStatus`` (int) follow it, and ``lastError`` is the summary's short text
    unless ``excerpt`` (staff: the stored, redacted text, which may quote the agent's
    answer and name its URL; docs/explanation/security.md). A new dict; ``data`` is
    left as it is, and one without a ``lastError`` is returned as it is."""
    error = data.get("lastError")
    if not isinstance(error, str):
        return data
    summary = summarize_error(error)
    out: dict[str, Any] = {}
    for name, value in data.items():
        if name in ("errorKind", "errorStatus"):
            continue
        out[name] = value
        if name == "lastError":
            if not excerpt:
                out[name] = summary.text
            out["errorKind"] = str(summary.kind)
            if summary.status is not None:
                out["errorStatus"] = summary.status
    return out


# --- the agent's reference to a delivery ---------------------------------------------------

#: The most bytes of an entry's ``agentRef`` (its compact, ASCII JSON).
MAX_AGENT_REF_BYTES = 1024
#: The most members of an ``agentRef``.
MAX_AGENT_REF_MEMBERS = 8
_AGENT_REF_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")
_AGENT_REF_VALUE = re.compile(r"[^\x00-\x1f\x7f]{1,256}")


def agent_ref_json(ref: object) -> tuple[str, str]:
    """``(compact JSON, "")`` of what a deliverer returned, or a verifier with its
    ``Verdict.DELIVERED``, when it is an agent reference the entry keeps as ``agentRef``
    (docs/howto/deliverer.md#what-it-returns): a mapping of at most
    :data:`MAX_AGENT_REF_MEMBERS` names (a letter, then up to 31 letters, digits or ``_``)
    to strings (1 to 256 characters, no control character), at most
    :data:`MAX_AGENT_REF_BYTES` bytes as ASCII JSON. ``("", "")`` for None or anything that
    is not a mapping (a deliverer written before references existed, returning what it
    likes); ``("", why)`` for a mapping that breaks a rule (the caller logs it; the delivery
    stands)."""
    if not isinstance(ref, Mapping):
        return "", ""
    if not ref or len(ref) > MAX_AGENT_REF_MEMBERS:
        return "", f"an agent reference holds 1 to {MAX_AGENT_REF_MEMBERS} members"
    for name, value in ref.items():
        if not isinstance(name, str) or not _AGENT_REF_NAME.fullmatch(name):
            return "", f"an agent reference's member name {name!r} is not a short identifier"
        if not isinstance(value, str) or not _AGENT_REF_VALUE.fullmatch(value):
            return "", f"an agent reference's {name} is not a string of 1 to 256 characters"
    encoded = json.dumps(dict(ref), separators=(",", ":"), ensure_ascii=True)
    if len(encoded) > MAX_AGENT_REF_BYTES:
        return "", f"an agent reference over {MAX_AGENT_REF_BYTES} bytes"
    return encoded, ""


def is_agent_ref(value: object) -> bool:
    """Whether ``value`` is a stored ``agentRef`` (a dict that :func:`agent_ref_json`
    accepts)."""
    return isinstance(value, dict) and bool(agent_ref_json(value)[0])


# --- the size of an entry on the wire -----------------------------------------------------

#: JSON escapes one character into at most six bytes (a control character becomes ``\u00XX``).
_ESCAPED = 6
#: Bytes of an entry's JSON that no rule above bounds by itself: member names, the ID,
#: status, times, counters, ``parkedFrom``, ``blockedByInFlight``, ``inFlightFor``,
#: ``errorKind``, ``errorStatus`` (about 750 in the worst case) and ``agentRef`` (at most
#: :data:`MAX_AGENT_REF_BYTES`), rounded up generously.
_ENTRY_FIXED_BYTES = 4096
#: Bytes a snapshot frame adds around its entries: type, workspace and session IDs (128
#: characters each at most), version, page and page count.
SNAPSHOT_ENVELOPE_BYTES = 1024


def max_entry_json_bytes(max_text_bytes: int) -> int:
    """The most UTF-8 bytes one entry's JSON (its wire shape, ``Entry.to_dict`` encoded
    with ``ensure_ascii=False``) can take when its text is at most ``max_text_bytes``
    UTF-8 bytes: every text byte, error, reason and user ID character escaped six-fold,
    the model at its 16 KiB bound, the client message ID escaped two-fold."""
    return (
        _ESCAPED * max_text_bytes
        + MAX_MODEL_BYTES
        + _ESCAPED * (MAX_ERROR_CHARS + MAX_REASON_CHARS + MAX_USER_ID_CHARS)
        + 2 * 128
        + _ENTRY_FIXED_BYTES
    )


def min_snapshot_frame_bytes(max_text_bytes: int) -> int:
    """The smallest ``WS_MAX_FRAME_BYTES`` that always fits one entry (int bytes): with
    the default ``MAX_TEXT_BYTES`` (102,400) it is 650,890; the default is 786,432."""
    return max_entry_json_bytes(max_text_bytes) + SNAPSHOT_ENVELOPE_BYTES


#: What ``accept`` may be asked to do while the session is busy (``if_busy``;
#: docs/howto/steering.md#busy-sessions, ``interrupt``: docs/howto/cutting.md).
ACCEPT_IF_BUSY = ("queue", "reject", "interrupt", "merge")
#: The longest ``expires_after`` accept takes, seconds (30 days).
MAX_EXPIRES_AFTER = 30 * 24 * 3600


def check_accept_options(if_busy: object, expires_after: object) -> tuple[str, int]:
    """Check accept's ``if_busy`` (one of :data:`ACCEPT_IF_BUSY`) and ``expires_after``
    (None, or seconds as a positive int or float up to :data:`MAX_EXPIRES_AFTER`);
    return ``(mode, expires_after in microseconds, 0 for never)``. Raises
    :class:`InvalidContent` (HTTP 400) naming the rule (docs/howto/steering.md)."""
    if not isinstance(if_busy, str) or if_busy not in ACCEPT_IF_BUSY:
        raise InvalidContent(f"ifBusy must be one of {', '.join(ACCEPT_IF_BUSY)}")
    if expires_after is None:
        return if_busy, 0
    if (
        isinstance(expires_after, bool)
        or not isinstance(expires_after, int | float)
        or not math.isfinite(expires_after)
        or not 0 < expires_after <= MAX_EXPIRES_AFTER
    ):
        raise InvalidContent(
            f"expiresAfter must be a number of seconds above 0 and at most {MAX_EXPIRES_AFTER}"
        )
    return if_busy, max(1, int(expires_after * 1_000_000))
