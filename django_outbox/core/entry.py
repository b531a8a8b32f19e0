"""The entry, its states and results, identifiers and timestamps (no Django imports).

An entry is stored in Valkey as one JSON object whose members fall in two
runs: the *delivery state* first (``id`` … ``lastError``), then the client's
*content* from ``"clientMessageID"`` to the end. The Lua scripts edit only
the state run and copy the content bytes through untouched, because a cjson
decode/encode would damage content (``[]`` becomes ``{}``, 17-digit integers
lose digits; docs/explanation/storage.md). The first structural ``,"clientMessageID":``
separates the runs: inside a JSON string every ``"`` is escaped, so that
sequence cannot occur in a value.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from .rules import CLIENT_MESSAGE_ID_RE, check_identifier, encode_stored, is_agent_ref


class Status(enum.StrEnum):
    """Stored entry status (docs/explanation/lifecycle.md#what-happens-to-a-message)."""

    PENDING = "pending"
    DELIVERING = "delivering"
    VERIFYING = "verifying"
    ERROR = "error"
    PARKED = "parked"
    #: Not handed to the agent before its ``expiresAt`` (server clock): never sent; visible
    #: like an error until retried or dismissed (docs/howto/steering.md#expiry).
    EXPIRED = "expired"


class Verdict(enum.Enum):
    """A verifier's decision about an attempt whose outcome was unknown."""

    INCONCLUSIVE = "inconclusive"  #: could not tell; check again with backoff
    DELIVERED = "delivered"  #: the message is in the agent's transcript
    ABSENT = "absent"  #: proven not there; safe to send again

    @staticmethod
    def split(returned: Any) -> tuple[Any, Any]:
        """``(verdict, agent reference)`` of what a verifier returned: a :class:`Verdict`
        alone (reference None), or ``(Verdict.DELIVERED, reference)``: the agent's own
        reference to the delivery it found (docs/howto/deliverer.md#what-it-returns)."""
        if isinstance(returned, tuple) and len(returned) == 2:
            return returned[0], returned[1]
        return returned, None


class RetryResult(enum.Enum):
    """Result of :meth:`Outbox.retry`. Busy is not missing: map to 409 vs 404."""

    UPDATED = "updated"
    NOT_FOUND = "not_found"
    BUSY = "busy"


class DismissResult(enum.Enum):
    """Result of :meth:`Outbox.dismiss`. Busy is not missing: map to 409 vs 404."""

    REMOVED = "removed"
    NOT_FOUND = "not_found"
    BUSY = "busy"


class EditResult(enum.Enum):
    """Result of :meth:`Outbox.edit` (docs/howto/steering.md#edit): ``UPDATED``;
    ``NOT_FOUND``; ``BUSY`` once it is being delivered or verified (409);
    ``VERSION_MISMATCH`` when ``if_version`` is not the session's version (412)."""

    UPDATED = "updated"
    NOT_FOUND = "not_found"
    BUSY = "busy"
    VERSION_MISMATCH = "version_mismatch"


class MoveResult(enum.Enum):
    """Result of :meth:`Outbox.move` (docs/howto/steering.md#reorder): ``MOVED`` (also
    when it already stood there); ``NOT_FOUND`` (the entry, or the one to go before);
    ``BUSY`` when it, or the place asked for, is the prompt in flight or being verified."""

    MOVED = "moved"
    NOT_FOUND = "not_found"
    BUSY = "busy"


class CancelResult(enum.Enum):
    """Result of :meth:`Outbox.cancel` (docs/howto/steering.md#cancel): ``REMOVED`` (a
    queued prompt, removed as by dismiss); ``NOT_FOUND``; ``IN_FLIGHT`` when it is being
    delivered or verified: cancelling it means cutting the running turn."""

    REMOVED = "removed"
    NOT_FOUND = "not_found"
    IN_FLIGHT = "in_flight"


class InterruptResult(enum.Enum):
    """Result of :meth:`Outbox.interrupt` and :meth:`Outbox.cut` (docs/howto/cutting.md).

    ``CUT``: the turn in flight is marked cut, the lease holder aborts it and its outcome
    is verified; ``ALREADY``: it was cut before (idempotent); ``IDLE``: nothing is in
    flight; ``QUEUED``: the named entry waits in the queue and was never sent (nothing
    to cut: cancel it as a queued prompt); ``NOT_FOUND``; ``NOT_SUPPORTED``: no aborter
    is configured (REST: 409 ``not_supported``); ``NOT_IN_FLIGHT``: the entry a Stop
    names (``interrupt(..., entry_id=...)``) is not the one in flight any more
    (delivered, gone, queued, or another entry is in flight), so nothing was cut (REST:
    409 ``not_in_flight``)."""

    CUT = "cut"
    ALREADY = "already"
    IDLE = "idle"
    QUEUED = "queued"
    NOT_FOUND = "not_found"
    NOT_SUPPORTED = "not_supported"
    NOT_IN_FLIGHT = "not_in_flight"


class SendNowResult(enum.Enum):
    """Result of :meth:`Outbox.send_now` (docs/howto/cutting.md).

    ``CUT``: the prompt is the session's next and the turn in flight is cut; ``ALREADY``:
    next, and that turn was cut before; ``MOVED``: next, nothing was in flight; ``BUSY``:
    the entry is not a queued prompt (in flight, being verified, in error or parked; REST
    409 ``busy``); ``NOT_FOUND``; ``NOT_SUPPORTED``: no aborter is configured (nothing
    moved; REST 409 ``not_supported``)."""

    CUT = "cut"
    ALREADY = "already"
    MOVED = "moved"
    BUSY = "busy"
    NOT_FOUND = "not_found"
    NOT_SUPPORTED = "not_supported"


# Ledger states reported by a ledger probe (the seed's frozen ABI enum names).
LEDGER_STATE_LEDGERED = "LEDGER_STATE_LEDGERED"
LEDGER_STATE_ADMITTED = "LEDGER_STATE_ADMITTED"
LEDGER_STATE_PROMOTED = "LEDGER_STATE_PROMOTED"
LEDGER_STATE_TURN_ENDED = "LEDGER_STATE_TURN_ENDED"
LEDGER_STATE_STALLED = "LEDGER_STATE_STALLED"
LEDGER_STATE_FAILED = "LEDGER_STATE_FAILED"

# Machine codes found in Entry.reason.
REASON_MAX_ATTEMPTS = "max_attempts"
REASON_UNVERIFIABLE = "unverifiable"
REASON_TRANSIENT_EXHAUSTED = "transient_exhausted"
#: Held for ``HOLD_MAX_TOTAL`` (the agent kept asking to be left alone): docs/howto/agents.md.
REASON_HOLD_EXHAUSTED = "hold_exhausted"


# --- timestamps -------------------------------------------------------------
# One fixed-width RFC 3339 form, so strings compare in time order and the Lua
# scripts can parse them: 2026-11-30T01:42:39.123456Z (UTC, microseconds).


def format_time(us: int) -> str:
    """Format microseconds since the epoch as RFC 3339 UTC with microseconds."""
    seconds, micros = divmod(us, 1_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{micros:06d}Z"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_time(value: str) -> int:
    """Parse an RFC 3339 timestamp into microseconds since the epoch.

    Accepts any offset and precision ``datetime.fromisoformat`` does; naive
    times are taken as UTC. Raises ``ValueError`` on anything else.
    """
    try:  # the scripts' own form ("...Z") first: this runs per entry on hot paths
        dt = datetime.fromisoformat(value)
    except ValueError:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


#: The fixed-width form format_time() writes (and the Lua scripts' iso()).
_FIXED_WIDTH_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


def canonical_time(value: str | None) -> str | None:
    """Normalise a timestamp to the fixed-width form (None stays None).

    A value already in that form is only validated (a C-speed ``fromisoformat``):
    every entry read back from Valkey is, and the worker reads two per message.
    """
    if value is None:
        return None
    if _FIXED_WIDTH_TIME.fullmatch(value):
        datetime.fromisoformat(value)  # ValueError for e.g. month 13
        return value
    return format_time(parse_time(value))


# --- entry IDs ----------------------------------------------------------------

_ID_LOCK = threading.Lock()
_id_last_ms = 0
_id_counter = 0
_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def new_entry_id(now_ms: int | None = None) -> str:
    """Return a fresh entry ID: 12 hex digits of time and counter, then 14 random base62.

    This is the shape of opencode's message IDs without the ``msg_`` prefix
    (``(ms * 0x1000 + counter)`` truncated to 48 bits), so IDs made by one
    process sort in creation order and ``"msg_" + id`` is a valid, time-ordered
    opencode messageID.
    """
    global _id_last_ms, _id_counter
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    with _ID_LOCK:
        if ms <= _id_last_ms:
            ms = _id_last_ms
            _id_counter += 1
        else:
            _id_last_ms, _id_counter = ms, 0
        value = (ms * 0x1000 + _id_counter) & 0xFFFF_FFFF_FFFF
    n = int.from_bytes(secrets.token_bytes(11), "big")  # 88 bits > 62**14 (83.4 bits)
    tail = []
    for _ in range(14):
        n, digit = divmod(n, 62)
        tail.append(_BASE62[digit])
    return f"{value:012x}{''.join(tail)}"


# --- the entry ----------------------------------------------------------------

_STATE_FIELDS: tuple[tuple[str, str], ...] = (
    # (JSON name, attribute name); this order is also the Lua encoder's.
    ("id", "id"),
    ("status", "status"),
    ("reason", "reason"),
    ("parkedFrom", "parked_from"),
    ("attempts", "attempts"),
    ("verifyAttempts", "verify_attempts"),
    ("transientFails", "transient_fails"),
    ("holds", "holds"),
    ("acceptedAt", "accepted_at"),
    ("seq", "seq"),
    ("lastAttemptAt", "last_attempt_at"),
    ("nextAttemptAt", "next_attempt_at"),
    ("lastError", "last_error"),
    ("deliveredAt", "delivered_at"),
    ("expiresAt", "expires_at"),
    ("mode", "mode"),
    ("mergedInto", "merged_into"),
)
#: ``interrupted``: the entry's turn was cut (docs/howto/cutting.md); after deliveredAt,
#: as in lib/entry.lua's ORDER.
_STATE_FIELDS += (("interrupted", "interrupted"),)
#: ``heldSince``: when the agent's current run of holds began; ``revision``: how often the
#: request was changed (an edit, an operator's retry of a definitive failure), which makes
#: its ``request_key``; both after interrupted, as in lib/entry.lua's ORDER.
_STATE_FIELDS += (("heldSince", "held_since"), ("revision", "revision"))
#: ``agentRef``: the agent's own reference to the delivery (a LangGraph thread and run, an
#: opencode session and message); after revision, as in lib/entry.lua's ORDER.
_STATE_FIELDS += (("agentRef", "agent_ref"),)
#: Who last edited, moved, cancelled and stopped the entry (an actor,
#: :mod:`django_outbox.core.actors`), written by the script of that transition; omitted
#: while unset; after agentRef, as in lib/entry.lua's ORDER.
ACTOR_FIELDS: tuple[tuple[str, str], ...] = (
    ("editedBy", "edited_by"),
    ("movedBy", "moved_by"),
    ("cancelledBy", "cancelled_by"),
    ("stoppedBy", "stopped_by"),
)
_STATE_FIELDS += ACTOR_FIELDS
_CONTENT_FIELDS = (
    ("clientMessageID", "client_message_id"),
    ("userID", "user_id"),
    ("text", "text"),
    ("model", "model"),
    ("traceparent", "traceparent"),
)
_ZERO_OMITTED = {"verifyAttempts", "transientFails", "holds", "seq", "interrupted", "revision"}
#: State members left out while they hold their default (``mode`` "queue": every entry
#: accepted before accept options existed reads as one).
_DEFAULT_OMITTED = {"mode": "queue"}
_NO_DEFAULT = object()
#: The ``mode`` an entry may carry: what its accept asked for while the session was busy
#: (docs/howto/steering.md#busy-sessions).
MODES = ("queue", "reject", "interrupt", "merge")
_STRING_FIELDS = {
    "reason": "reason",
    "lastError": "last_error",
    "userID": "user_id",
    "text": "text",
    "traceparent": "traceparent",
    "mode": "mode",
    "mergedInto": "merged_into",
    **dict(ACTOR_FIELDS),
}
_PARKED_FROM = {"pending", "verifying", "delivering"}
#: State members the scripts keep that an Entry does not carry: ``userDigest``, the
#: accepting user as the per-user bound counts it
#: (docs/explanation/idempotency.md#per-user-bounds); stored last in the state run, read
#: past here, never part of the wire shape.
_STORED_ONLY = {"userDigest"}
_KNOWN = (
    {name for name, _ in _STATE_FIELDS + _CONTENT_FIELDS}
    | _STORED_ONLY
    | {
        "blockedByInFlight",
        "inFlightFor",
    }
)
#: JSON name -> attribute of every member an Entry carries.
_ATTR_OF = dict(_STATE_FIELDS + _CONTENT_FIELDS)
CONTENT_MARKER = ',"clientMessageID":'


#: The stored JSON encoding, built once (``json.dumps(**options)`` builds an encoder per call).
_dumps = encode_stored
_fingerprint_dumps = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode


@dataclass(frozen=True, slots=True)
class Entry:
    """One accepted prompt. JSON names are camelCase (docs/reference/python.md).

    Times are RFC 3339 strings in UTC with microseconds. ``delivered_at`` is set
    once delivery is confirmed (the entry is then gone from ``list``; only
    ``entry_delivered`` receivers see it). ``blocked_by_in_flight``
    and ``in_flight_for`` (seconds, float) are set only by ``list`` and never stored.
    """

    #: The entry ID (JSON ``id``): 12 hex digits of time and counter, then 14 base62
    #: characters; the same for every attempt (opencode's messageID is ``"msg_" + id``).
    id: str
    #: The client's idempotency key (``clientMessageID``), 1 to 128 printable ASCII characters.
    client_message_id: str
    #: The accepting user (``userID``), as given to ``accept``; the REST API stores the pk.
    user_id: str
    #: The prompt, 1 byte to ``MAX_TEXT_BYTES`` of UTF-8.
    text: str
    #: When it was accepted (``acceptedAt``), on Valkey's clock.
    accepted_at: str
    #: The stored status: pending, delivering, verifying, error or parked.
    status: Status = Status.PENDING
    #: The client's ``model`` JSON object, passed to the deliverer untouched, or None.
    model: dict[str, Any] | None = None
    #: Attempts that failed for good so far: a deliverer's definitive failure or an
    #: ``ABSENT`` verdict (``attempts``); the deliverer's ``attempt`` argument is this + 1.
    #: ``error`` / ``max_attempts`` once it reaches ``MAX_ATTEMPTS``; retry keeps it.
    attempts: int = 0
    #: When a worker last claimed it for delivery (``lastAttemptAt``; verification passes
    #: leave it).
    last_attempt_at: str | None = None
    #: Inconclusive verification passes of the current unknown outcome (``verifyAttempts``);
    #: ``error`` / ``unverifiable`` at ``MAX_VERIFY_ATTEMPTS``; retry resets it.
    verify_attempts: int = 0
    #: Transient failures over the entry's life (``transientFails``); ``error`` /
    #: ``transient_exhausted`` at ``MAX_TRANSIENT_FAILURES``; retry resets it.
    transient_fails: int = 0
    #: Holds in a row (``holds``): the agent answered "not now, retry after ..." and the
    #: entry waits without using an attempt, at least a floor that doubles with each hold
    #: (``HOLD_FLOOR``, docs/howto/agents.md#held-retry-after); any other outcome ends the
    #: run; retry resets it.
    holds: int = 0
    #: When the current run of holds began (``heldSince``, server clock): a hold answered
    #: ``HOLD_MAX_TOTAL`` seconds after it ends the entry in ``error`` /
    #: ``hold_exhausted``. None while the entry is not held.
    held_since: str | None = None
    #: How often the request this entry makes of the agent was changed (``revision``): an
    #: edit of its text or model, an operator's retry after a definitive failure. It makes
    #: :attr:`request_key`; 0 (omitted from JSON) until the first change.
    revision: int = 0
    #: When it is due again after a backoff or verification delay (``nextAttemptAt``);
    #: None: due now.
    next_attempt_at: str | None = None
    #: The last failure as ``"Type: message"`` (``lastError``), credentials redacted, at
    #: most 2,000 characters; kept until a later failure replaces it.
    last_error: str | None = None
    #: A machine code: for ``error``, ``max_attempts``, ``unverifiable`` or
    #: ``transient_exhausted``; for ``parked``, the park's reason. None otherwise.
    reason: str | None = None
    #: For a parked entry, the status unpark returns it to (``parkedFrom``): pending,
    #: verifying or delivering.
    parked_from: str | None = None
    #: When delivery was confirmed (``deliveredAt``); only ``entry_delivered`` receivers
    #: see an entry with it set.
    delivered_at: str | None = None
    #: The W3C trace context of the accept, when it ran in a traced request
    #: (docs/howto/observe.md#tracing); the worker's spans of this entry continue that trace.
    traceparent: str | None = None
    #: Place in the session's accept order (the session's version at accept).
    seq: int = 0
    #: When the prompt expires unsent (``expiresAt``, server clock; set by accept's
    #: ``expires_after``): a claim that reaches it later marks it ``expired`` instead of
    #: sending it. None: it never expires.
    expires_at: str | None = None
    #: What its accept asked for while the session was busy (``mode``): ``queue`` (the
    #: default, omitted from the JSON), ``reject`` or ``merge``
    #: (docs/howto/steering.md#busy-sessions).
    mode: str = "queue"
    #: For a ``merge`` prompt delivered in one agent message with others: the ID of that
    #: message's first entry (``mergedInto``; the agent knows the message by that entry's
    #: message ID). Kept while the group's outcome is unknown, so it is verified once, for
    #: the group (docs/howto/steering.md#merging). None otherwise.
    merged_into: str | None = None
    #: Set by the claim only, never stored: the texts of a merged delivery in accept order
    #: (this entry's first), which the deliverer sends as one message's parts; () for a
    #: prompt delivered alone (send ``text``).
    parts: tuple[str, ...] = ()
    #: The entry's turn was cut (``interrupted``): while it is in flight or being
    #: verified, a cut is under way; on a delivered entry, the agent got it and its turn
    #: was cut (docs/howto/cutting.md). Omitted from JSON while False.
    interrupted: bool = False
    #: The agent's own reference to the delivery (``agentRef``), e.g. ``{"threadID": ...,
    #: "runID": ...}`` for LangGraph: what its deliverer returned, or its verifier with
    #: ``Verdict.DELIVERED``; set with ``delivered_at`` by the settle, None when the agent
    #: gave none (docs/howto/deliverer.md#what-it-returns). At most 8 string members,
    #: 1,024 bytes.
    agent_ref: dict[str, str] | None = None
    #: Who last edited the entry's text or model (``editedBy``): an actor
    #: (:mod:`django_outbox.core.actors`: ``user:<userID>``, ``staff:<pk>``,
    #: ``cli:<login>``, ``system``); None (omitted from JSON) until an edit.
    edited_by: str | None = None
    #: Who last moved it in the queue (``movedBy``: a move, or a send-now); None until then.
    moved_by: str | None = None
    #: Who cancelled it (``cancelledBy``): carried by the removed entry a cancel reports
    #: (the ``cancelled`` event), since a cancelled prompt is no longer stored.
    cancelled_by: str | None = None
    #: Who cut its turn (``stoppedBy``: a Stop, a cancel of the prompt in flight, a
    #: send-now of another prompt); kept while its outcome is verified and on the
    #: delivered entry. None until then.
    stopped_by: str | None = None
    #: Set by ``list`` / snapshots only, never stored (``blockedByInFlight``): a pending
    #: entry waiting behind a delivery in flight in its session.
    blocked_by_in_flight: bool = False
    #: With ``blocked_by_in_flight``: seconds the session's lease has been held
    #: (``inFlightFor``); None otherwise.
    in_flight_for: float | None = field(default=None)

    @property
    def request_key(self) -> str:
        """The idempotency key of the request this entry makes of its agent: the entry ID,
        then ``"<entry ID>.<revision>"`` once the request changed (an edit, an operator's
        retry after a definitive failure). The same for every resend of the same request
        (so verification can find it) and new when the request changes (so an agent that
        caches its answer per key never replays an old answer to a new request);
        docs/howto/agents.md#the-idempotency-key."""
        return self.id if not self.revision else f"{self.id}.{self.revision}"

    # -- wire format ---------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The entry as a JSON-ready dict with camelCase keys (omits unset optionals)."""
        out: dict[str, Any] = {}
        for name, attr in _STATE_FIELDS + _CONTENT_FIELDS:
            value = getattr(self, attr)
            if value is None or (name in _ZERO_OMITTED and value == 0):
                continue
            if _DEFAULT_OMITTED.get(name, _NO_DEFAULT) == value:
                continue
            out[name] = str(value) if name == "status" else value
        if self.blocked_by_in_flight:
            out["blockedByInFlight"] = True
        if self.in_flight_for is not None:
            out["inFlightFor"] = self.in_flight_for
        return out

    def to_json(self) -> str:
        """Serialise to the stored JSON form: state members first, content last."""
        state = {}
        for name, attr in _STATE_FIELDS:
            value = getattr(self, attr)
            if value is not None and not (name in _ZERO_OMITTED and value == 0):
                if _DEFAULT_OMITTED.get(name, _NO_DEFAULT) == value:
                    continue
                state[name] = str(value) if name == "status" else value
        content = {}
        for name, attr in _CONTENT_FIELDS:
            value = getattr(self, attr)
            if value is not None:
                content[name] = value
        head = _dumps(state)[:-1]
        tail = _dumps(content)[1:]
        return f"{head},{tail}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Entry:
        """Build an entry from its camelCase dict; raises ``ValueError`` if malformed."""
        if not isinstance(data, dict):
            raise ValueError("an entry must be a JSON object")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():  # (one pass: the worker reads an entry per message)
            attr = _ATTR_OF.get(name)
            if attr is None:
                if name not in _KNOWN:
                    raise ValueError(f"unknown entry members: {sorted(set(data) - _KNOWN)}")
            elif value is not None:
                kwargs[attr] = value
        # Strict types: a state member of the wrong type could make the scripts
        # mis-split a stored entry (docs/explanation/storage.md).
        check_identifier("entry ID", kwargs.get("id"))
        for name, attr in _STRING_FIELDS.items():
            if attr in kwargs and not isinstance(kwargs[attr], str):
                raise ValueError(f"{name} must be a string")
        cmid = kwargs.get("client_message_id")
        if not isinstance(cmid, str) or not CLIENT_MESSAGE_ID_RE.fullmatch(cmid):
            raise ValueError("clientMessageID must be 1 to 128 printable ASCII characters")
        if "model" in kwargs and not isinstance(kwargs["model"], dict):
            raise ValueError("model must be a JSON object")
        if "agent_ref" in kwargs and not is_agent_ref(kwargs["agent_ref"]):
            raise ValueError("agentRef must be an object of up to 8 short string members")
        if not isinstance(kwargs.get("interrupted", False), bool):
            raise ValueError("interrupted must be a boolean")
        if kwargs.get("parked_from") not in (None, *_PARKED_FROM):
            raise ValueError(f"parkedFrom must be one of {sorted(_PARKED_FROM)}")
        if kwargs.get("mode", "queue") not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}")
        try:
            kwargs["status"] = Status(kwargs.get("status", Status.PENDING))
            for attr in (
                "accepted_at",
                "last_attempt_at",
                "next_attempt_at",
                "delivered_at",
                "expires_at",
                "held_since",
            ):
                if attr in kwargs:
                    if not isinstance(kwargs[attr], str):
                        raise ValueError(f"{attr} must be an RFC 3339 string")
                    kwargs[attr] = canonical_time(kwargs[attr])
            for attr in (
                "attempts",
                "verify_attempts",
                "transient_fails",
                "holds",
                "seq",
                "revision",
            ):
                value = kwargs.get(attr, 0)
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ValueError(f"{attr} must be a non-negative integer")
                kwargs[attr] = value
            return cls(**kwargs)
        except TypeError as exc:
            raise ValueError(f"malformed entry: {exc}") from None

    @classmethod
    def from_json(cls, raw: str | bytes) -> Entry:
        """Parse a stored or wire JSON entry; raises ``ValueError`` if malformed."""
        return cls.from_dict(json.loads(raw))

    def evolve(self, **changes: Any) -> Entry:
        """Return a copy with ``changes`` applied (entries are immutable)."""
        return replace(self, **changes)


def fingerprint(text: str, model: dict[str, Any] | None) -> str:
    """Digest of what an idempotency key protects: the text and the model (key order ignored)."""
    payload = _fingerprint_dumps([text, model]).encode("utf-8")
    return hashlib.sha256(payload).hexdigest()[:32]


def fresh_entry_json(
    entry_id: str,
    accepted_at: str,
    client_message_id: str,
    user_id: str,
    text: str,
    model: dict[str, Any] | None,
    traceparent: str | None = None,
) -> str:
    """``Entry(...).to_json()`` of a just-accepted entry (pending, no attempts), without
    building the Entry: the accept path's hot spot. ``entry_id`` comes from
    :func:`new_entry_id` and ``accepted_at`` from :func:`format_time`, neither needing
    JSON escapes. A test pins it byte-equal to ``to_json``."""
    content: dict[str, Any] = {
        "clientMessageID": client_message_id,
        "userID": user_id,
        "text": text,
    }
    if model is not None:
        content["model"] = model
    if traceparent is not None:
        content["traceparent"] = traceparent
    head = f'{{"id":"{entry_id}","status":"pending","attempts":0,"acceptedAt":"{accepted_at}"'
    return f"{head},{_dumps(content)[1:]}"


# --- what the service reports ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """Something happened to an entry.

    ``kind`` is ``"staged"``, ``"delivered"`` or ``"updated"`` (every state
    change, including accept and dismissal); ``state`` is the queue-UI state of
    docs/reference/websocket.md (``queued``, ``delivering``, ``verifying``, ``sent``,
    ``error``, ``parked``, ``pending``, ``dismissed``); ``version`` is the
    session's version counter after the change.
    """

    kind: str
    state: str
    entry: Entry
    workspace_id: str
    session_id: str
    version: int
    #: False when no WebSocket client watches the session: publishing can be skipped.
    watched: bool = True


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a session's delivery lease: ``owner`` (a worker ID, or host-pid),
    ``acquired_at`` (RFC 3339), ``entry_id`` it was taken for, ``held_for`` (seconds).
    """

    owner: str
    acquired_at: str
    entry_id: str | None
    held_for: float


@dataclass(frozen=True, slots=True)
class Ending:
    """How an entry ended, as the session's record of recent endings keeps it for a page
    that was not connected then (docs/reference/websocket.md#how-prompts-ended):
    ``entry_id``; ``how``, one of ``delivered``, ``dismissed``, ``cancelled`` or
    ``expired``; ``at``, when (RFC 3339, the server's clock)."""

    entry_id: str
    how: str
    at: str

    def to_dict(self) -> dict[str, str]:
        """``{"id", "how", "at"}``, as the WebSocket snapshot carries it."""
        return {"id": self.entry_id, "how": self.how, "at": self.at}


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session's queue at one instant: its ``version``, ``entries`` in FIFO order and
    the ``lease`` if one is held; ``endings``: how the session's recent entries ended,
    newest first (the last 20 endings of the last hour; :class:`Ending`).
    """

    version: int
    entries: list[Entry]
    lease: Lease | None = None
    endings: tuple[Ending, ...] = ()
