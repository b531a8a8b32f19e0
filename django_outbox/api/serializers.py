"""Request validation and the documented wire shapes of the REST API (docs/reference/rest.md).

Request serializers check *shapes* (types, required members, lengths) and the
model rule of :mod:`django_outbox.core.rules`, and answer 400 with field errors.
The byte limits on ``text`` and ``model`` are the core's (``ContentTooLarge``, answered
413), and
everything the service decides (duplicates, conflicts, the cap) is translated by
:mod:`django_outbox.api.errors`. Response serializers are documentation:
responses are rendered from :meth:`Entry.to_dict`, the one source of the
camelCase wire form, as the viewer reads it
(:func:`~django_outbox.core.rules.entry_for_viewer`), and the schema test checks
the two agree.
"""

from __future__ import annotations

from typing import Any

from django.core.validators import ProhibitNullCharactersValidator, RegexValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..core.entry import Status
from ..core.rules import (
    ACCEPT_IF_BUSY,
    CLIENT_MESSAGE_ID_RE,
    ERROR_TEXTS,
    IDENTIFIER_RE,
    MAX_EXPIRES_AFTER,
    MAX_MODEL_DEPTH,
    MAX_REASON_CHARS,
    UNPRINTABLE_REASON,
    ErrorKind,
    check_model,
    has_unprintable,
    json_depth,
)
from ..errors import ContentTooLarge, InvalidContent

#: OpenAPI pattern of workspace, session and entry IDs (anchored: JSON Schema patterns search).
IDENTIFIER_PATTERN = f"^{IDENTIFIER_RE.pattern}$"


class StrictStringField(serializers.CharField):
    """A JSON string taken as is: no coercion of numbers, no trimming, NUL allowed.

    DRF's ``CharField`` turns ``123`` into ``"123"``, strips whitespace and
    refuses ``\\u0000``; a prompt must arrive byte for byte, and a number where a
    string belongs is a client bug, refused with 400 rather than stored as its
    digits. Lone surrogates are still refused (not UTF-8).
    """

    default_error_messages = {"invalid": "Must be a string."}

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)
        self.validators = [
            v for v in self.validators if not isinstance(v, ProhibitNullCharactersValidator)
        ]

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return data


@extend_schema_field({"type": "object", "additionalProperties": {}})
class ModelField(serializers.Field):
    """The optional per-prompt model selector: a JSON object passed through untouched.

    ``null`` means "no model". The rule is the core's
    (:func:`~django_outbox.core.rules.check_model`): a compact UTF-8 encoding of at
    most 16 KiB, finite numbers only, nested at most ``MAX_MODEL_DEPTH`` (32) deep.
    A break answers 400 with a field error, except the size: a model over 16 KiB is the
    core's ``ContentTooLarge``, answered 413 ``too_large`` like a text over its limit
    (docs/reference/rest.md).
    """

    default_error_messages = {
        "invalid": "Must be a JSON object.",
        "not_json": "Must be plain JSON with finite numbers and valid Unicode.",
        "too_deep": "Must be nested at most {limit} levels deep.",
    }

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("invalid")
        try:
            check_model(data)
        except ContentTooLarge:
            raise  # 413 too_large, as for text: a size, not a shape
        except InvalidContent:
            # check_model tests depth before encoding; json_depth stops past the limit.
            if json_depth(data, MAX_MODEL_DEPTH) > MAX_MODEL_DEPTH:
                self.fail("too_deep", limit=MAX_MODEL_DEPTH)
            self.fail("not_json")
        return data

    def to_representation(self, value: Any) -> dict[str, Any]:
        return value


#: Full match of the core's clientMessageID rule (``\\A``/``\\Z`` become ``^``/``$`` in OpenAPI).
CLIENT_MESSAGE_ID_VALIDATOR = RegexValidator(
    rf"\A{CLIENT_MESSAGE_ID_RE.pattern}\Z",
    message="Must be 1 to 128 printable ASCII characters.",
    code="invalid",
)
#: A reason must contain a non-whitespace character (the core strips it to check).
NOT_BLANK_VALIDATOR = RegexValidator(r"\S", message="This field may not be blank.", code="blank")


def printable_reason(value: str) -> None:
    """A new park reason holds no control or format character (the character rule of the
    core's :func:`~django_outbox.core.rules.check_printable_reason`; the admin's too)."""
    if has_unprintable(value):
        raise serializers.ValidationError(
            UNPRINTABLE_REASON[0].upper() + UNPRINTABLE_REASON[1:] + ".", code="invalid"
        )


@extend_schema_field(
    {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_EXPIRES_AFTER,
        "nullable": True,
    }
)
class SecondsField(serializers.Field):
    """A JSON number of seconds, above 0 and at most ``MAX_EXPIRES_AFTER`` (30 days).

    Strict like :class:`StrictStringField`: ``"10"`` or ``true`` is a client bug (400),
    not 10 seconds or 1."""

    default_error_messages = {
        "invalid": "Must be a number of seconds.",
        "range": f"Must be above 0 and at most {MAX_EXPIRES_AFTER} seconds (30 days).",
    }

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        if not 0 < data <= MAX_EXPIRES_AFTER:  # (NaN fails too)
            self.fail("range")
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class AcceptRequestSerializer(serializers.Serializer):
    """POST body of the messages endpoint: ``{clientMessageID, text, model?}``.

    ``text`` must be non-empty; over its UTF-8 size limit (``MAX_TEXT_BYTES``,
    102,400 bytes by default) the core refuses it and the API answers 413.
    """

    clientMessageID = StrictStringField(
        min_length=1,
        max_length=128,
        validators=[CLIENT_MESSAGE_ID_VALIDATOR],
        help_text="Idempotency key: 1 to 128 printable ASCII characters, unique per message "
        "within the session. Resend the same key (and the same text) after any failure.",
    )
    text = StrictStringField(
        min_length=1,
        help_text="The prompt, 1 byte to MAX_TEXT_BYTES (default 102,400) UTF-8 bytes; "
        "larger answers 413.",
    )
    model = ModelField(
        required=False,
        allow_null=True,
        help_text="Optional per-prompt model selector, a JSON object of at most 16 KiB "
        f"nested at most {MAX_MODEL_DEPTH} levels deep, passed to the agent untouched.",
    )
    ifBusy = serializers.ChoiceField(
        choices=list(ACCEPT_IF_BUSY),
        required=False,
        default="queue",
        help_text="What to do while the session is busy (something pending, in flight or "
        "being verified): queue (default) behind it; reject: answer 409 session_busy and "
        "store nothing; merge: join the next delivery with the merge prompts queued behind "
        "the running turn (docs/howto/steering.md; 409 not_supported, nothing stored, when "
        "the session's agent cannot deliver merged prompts); interrupt: become the session's next, "
        "ahead of queued prompts, and cut the running turn (409 not_supported, nothing "
        "stored, without an aborter; docs/howto/cutting.md).",
    )
    expiresAfter = SecondsField(
        required=False,
        allow_null=True,
        help_text="Seconds (server clock): a prompt not handed to the agent by then is never "
        "sent and ends expired (retry or dismiss it).",
    )


class EditRequestSerializer(serializers.Serializer):
    """PATCH body of a message: ``{text?, model?}``, at least one (docs/howto/steering.md#edit).
    The rules are accept's: ``text`` 1 byte to ``MAX_TEXT_BYTES`` (413 above), ``model`` a
    JSON object (a model is replaced, never removed)."""

    text = StrictStringField(min_length=1, required=False, help_text="The new prompt text.")
    model = ModelField(required=False, help_text="The new model selector (replaces the old).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs.get("text") is None and attrs.get("model") is None:
            raise serializers.ValidationError("Give text, model or both.", code="invalid")
        return attrs


class MoveRequestSerializer(serializers.Serializer):
    """POST body of ``move/``: ``{"before": "<id>"}`` or ``{"to": "next" | "last"}``
    (docs/howto/steering.md#reorder)."""

    before = StrictStringField(
        required=False,
        validators=[RegexValidator(rf"\A{IDENTIFIER_RE.pattern}\Z", "Must be an entry ID.")],
        help_text="Put the message right before this queued message.",
    )
    to = serializers.ChoiceField(
        choices=["next", "last"],
        required=False,
        help_text="next: first after the message in flight or being verified; last: the end.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("before" in attrs) == ("to" in attrs):
            raise serializers.ValidationError("Give exactly one of before or to.", code="invalid")
        return attrs


class InterruptRequestSerializer(serializers.Serializer):
    """POST body of ``interrupt/`` ("Stop"): ``{"entryID"?}``, the entry whose turn the
    client showed in flight (docs/howto/cutting.md). No body, or none of it: the turn in
    flight when the request arrives is cut, which races the end of the turn the user saw."""

    entryID = StrictStringField(
        required=False,
        validators=[RegexValidator(rf"\A{IDENTIFIER_RE.pattern}\Z", "Must be an entry ID.")],
        help_text="The entry whose turn to stop: the one the client shows in flight. Its "
        "turn is cut only while it is the entry in flight; otherwise nothing is cut and the "
        "answer is 409 not_in_flight (it was delivered, is gone or queued, or another entry "
        "is in flight). Without it, whatever turn is in flight when the request arrives is "
        "cut: a Stop sent as a turn ends may cut the next prompt's turn.",
    )


class ParkRequestSerializer(serializers.Serializer):
    """POST body of ``park/``: ``{reason}``, a machine code such as ``mode_transition``."""

    reason = StrictStringField(
        max_length=MAX_REASON_CHARS,
        validators=[NOT_BLANK_VALIDATOR, printable_reason],
        help_text=f"Why the workspace is parked (non-blank, at most {MAX_REASON_CHARS} "
        "characters, no control or format characters); stored on each parked entry as its "
        "reason.",
    )


class UnparkRequestSerializer(serializers.Serializer):
    """POST body of ``unpark/``: ``{reason?}``; with a reason only entries parked with it move."""

    reason = StrictStringField(
        max_length=MAX_REASON_CHARS,
        validators=[NOT_BLANK_VALIDATOR],
        required=False,
        allow_null=True,
        help_text="Only unpark entries parked with this reason (default: all parked entries).",
    )


# --- responses (documentation of Entry.to_dict and the small result bodies) ------------


class EntrySerializer(serializers.Serializer):
    """One entry in its camelCase wire form. Unset members are omitted."""

    id = serializers.CharField(help_text="Entry ID, unique per accept (opaque, URL-safe).")
    status = serializers.ChoiceField(choices=[s.value for s in Status])
    reason = serializers.CharField(
        required=False,
        help_text="Machine code for error/parked entries: max_attempts, unverifiable, "
        "transient_exhausted, hold_exhausted, or a park reason.",
    )
    parkedFrom = serializers.CharField(
        required=False, help_text="The status a parked entry returns to when unparked."
    )
    attempts = serializers.IntegerField(
        min_value=0, help_text="Driven attempts that ended not delivered."
    )
    verifyAttempts = serializers.IntegerField(
        required=False, min_value=0, help_text="Inconclusive verification passes (omitted if 0)."
    )
    transientFails = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Failures in which no attempt was driven (omitted if 0).",
    )
    holds = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="Holds in a row: the agent asked to be left alone until a time (HTTP 429 "
        "or 503 with Retry-After); no attempt used (omitted if 0).",
    )
    heldSince = serializers.CharField(
        required=False,
        help_text="When the current run of holds began (RFC 3339, server clock); holds that "
        "last HOLD_MAX_TOTAL end in error hold_exhausted (omitted while not held).",
    )
    revision = serializers.IntegerField(
        required=False,
        min_value=0,
        help_text="How often the request to the agent changed (an edit, an operator's retry "
        "after a definitive failure): its Idempotency-Key is the ID, then '<id>.<revision>' "
        "(omitted if 0).",
    )
    acceptedAt = serializers.CharField(help_text="RFC 3339 UTC with microseconds.")
    lastAttemptAt = serializers.CharField(required=False)
    nextAttemptAt = serializers.CharField(
        required=False, help_text="Backoff gate; absent means due now."
    )
    lastError = serializers.CharField(
        required=False,
        help_text="What ended the last attempt. For a user who may view entries in the admin "
        "(active staff with view_outboxentry): the stored text, credentials removed, which "
        "may quote the agent's answer and name its URL. For everyone else: a short text "
        "that holds nothing the agent wrote, e.g. 'the agent answered with an error "
        "(HTTP 500)'.",
    )
    errorKind = serializers.ChoiceField(
        choices=[(kind.value, ERROR_TEXTS[kind].format(status="")) for kind in ErrorKind],
        required=False,
        help_text="With lastError: what kind of failure it was.",
    )
    errorStatus = serializers.IntegerField(
        required=False,
        min_value=100,
        max_value=599,
        help_text="With lastError, when the agent answered: its HTTP status.",
    )
    deliveredAt = serializers.CharField(required=False)
    expiresAt = serializers.CharField(
        required=False,
        help_text="When the prompt expires unsent (RFC 3339, server clock); absent: never.",
    )
    mode = serializers.ChoiceField(
        choices=["reject", "interrupt", "merge"],
        required=False,
        help_text="The accept's ifBusy when not queue (absent: queue).",
    )
    mergedInto = serializers.CharField(
        required=False,
        help_text="For a merge prompt delivered in one message with others: the ID of that "
        "message's first entry (while its outcome is being verified).",
    )
    agentRef = serializers.DictField(
        child=serializers.CharField(),
        required=False,
        help_text="With deliveredAt: the agent's own reference to the delivery, e.g. "
        '{"threadID": ..., "runID": ...} for LangGraph or {"sessionID": ..., "messageID": '
        "...} for opencode; at most 8 string members (absent: the agent gave none).",
    )
    editedBy = serializers.CharField(
        required=False,
        help_text="Who last edited its text or model: user:<pk> (REST), staff:<pk> (admin), "
        "cli:<login> (manage.py outbox) or system (Python); absent until an edit.",
    )
    movedBy = serializers.CharField(
        required=False, help_text="Who last moved it (a move, a send-now); absent until then."
    )
    cancelledBy = serializers.CharField(
        required=False,
        help_text="Who cancelled it (only on the removed entry a WebSocket cancelled update "
        "carries).",
    )
    stoppedBy = serializers.CharField(
        required=False, help_text="Who cut its turn (a Stop, a cancel of it in flight)."
    )
    clientMessageID = serializers.CharField()
    userID = serializers.CharField(help_text="The accepting user's primary key.")
    text = serializers.CharField()
    model = serializers.DictField(required=False, help_text="As sent, untouched.")
    blockedByInFlight = serializers.BooleanField(
        required=False, help_text="Pending and waiting behind a delivery in flight (list only)."
    )
    inFlightFor = serializers.FloatField(
        required=False, help_text="Seconds the session's lease has been held (list only)."
    )


class SnapshotSerializer(serializers.Serializer):
    """The session's queue: its version counter and entries in FIFO order."""

    version = serializers.IntegerField(
        help_text="The session's version counter; WebSocket events carry the same counter."
    )
    entries = EntrySerializer(many=True)


class DuplicateSerializer(serializers.Serializer):
    """The key was already accepted with the same content: the original entry's ID."""

    id = serializers.CharField()
    duplicate = serializers.BooleanField()


class ParkedSerializer(serializers.Serializer):
    """Result of ``park/``: how many entries were parked."""

    parked = serializers.IntegerField(min_value=0)


class UnparkedSerializer(serializers.Serializer):
    """Result of ``unpark/``: how many entries were re-armed."""

    unparked = serializers.IntegerField(min_value=0)


class RemovedSerializer(serializers.Serializer):
    """Result of a workspace cleanup: how many Valkey keys were removed."""

    removed = serializers.IntegerField(min_value=0)


class ErrorSerializer(serializers.Serializer):
    """Every error body: a human-readable ``detail`` and a stable machine ``code``."""

    detail = serializers.CharField()
    code = serializers.CharField(
        help_text="Stable machine code: invalid, invalid_identifier, not_found, busy, "
        "session_busy, version_mismatch, not_supported, not_in_flight, "
        "idempotency_conflict, outbox_full (with scope: session or user), rate_limited, "
        "too_large, unavailable, not_authenticated, "
        "authentication_failed, permission_denied, parse_error, unsupported_media_type, "
        "method_not_allowed, not_acceptable, throttled."
    )


class ForbiddenSerializer(ErrorSerializer):
    """A 403: not authenticated, CSRF failed, or the access policy refused the action
    (``permission_denied``, naming it in ``action``)."""

    action = serializers.CharField(
        required=False,
        help_text="With permission_denied: the access-policy action refused (view, accept, "
        "retry, dismiss, edit, move, cancel, park, cleanup, interrupt; "
        "docs/howto/access-policy.md).",
    )


class ValidationErrorSerializer(ErrorSerializer):
    """A 400: ``code`` is ``invalid`` (bad body) or ``invalid_identifier`` (bad ID in the
    path) or ``parse_error`` (not JSON); ``fieldErrors`` maps body members to messages."""

    fieldErrors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text='Field errors, e.g. {"text": ["Must be a string."]}; '
        '"non_field_errors" for a body that is not a JSON object.',
    )


class UnavailableSerializer(ErrorSerializer):
    """A 503: Valkey unreachable, out of memory, or a durability wait timed out."""

    accepted = serializers.BooleanField(
        help_text="True when the message WAS stored but not yet acknowledged by the "
        "required replicas/AOF: retry with the same clientMessageID (it answers 200 with "
        "the entry's ID). False: nothing was stored; retry with the same key."
    )


class WorkerPresenceSerializer(serializers.Serializer):
    """Result of ``worker/``: whether a worker is alive to deliver this session's prompts
    (docs/howto/frontend.md, "Is a worker running?")."""

    alive = serializers.BooleanField(
        help_text="Some worker's heartbeat is fresh (it beat less than 15 s ago)."
    )
    lastSeen = serializers.DateTimeField(
        allow_null=True,
        help_text="The most recent heartbeat of any worker seen in the last 150 s "
        "(server clock), or null.",
    )
