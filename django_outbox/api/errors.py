"""The REST API's error contract: every refusal as ``{"detail", "code"}`` with a stable code.

Domain errors are translated into HTTP here and only here (docs/reference/rest.md):
:func:`outbox_exception_handler` maps the outbox's exceptions and reshapes
DRF's own, and the views answer the ``NOT_FOUND``/``BUSY`` results of retry and
dismiss with :func:`not_found_response` and :func:`busy_response`.

==================================================  ======  ==============================
outcome                                             status  body / ``code``
==================================================  ======  ==============================
accepted (answered by the view)                     202     the entry
``Duplicate`` (answered by the view)                200     ``{"id", "duplicate": true}``
``IdempotencyConflict``                             422     ``idempotency_conflict``
``OutboxFull`` (session ``CAP`` / user bound)       429     ``outbox_full`` + ``scope``
``RateLimited`` (``USER_ACCEPTS_PER_MINUTE``)       429     ``rate_limited``
``SessionBusy`` (``ifBusy`` reject)                 409     ``session_busy``
``ContentTooLarge`` (text over ``MAX_TEXT_BYTES``)  413     ``too_large``
body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``           413     ``too_large``
``InvalidIdentifier`` (ID in the path)              400     ``invalid_identifier``
body shape / content rule (serializer)              400     ``invalid`` + ``fieldErrors``
``InvalidContent`` (a content rule of the core)     400     ``invalid``
``ModelNotAllowed`` (not in ``OUTBOX["MODELS"]``)   400     ``model_not_allowed``
``RetryResult``/``DismissResult.NOT_FOUND``         404     ``not_found``
``RetryResult``/``DismissResult.BUSY``              409     ``busy``
``EditResult.VERSION_MISMATCH`` (stale ``If-Match``)  412     ``version_mismatch``
``CutNotSupported`` (no ``ABORTER``)                409     ``not_supported``
``InterruptResult.NOT_IN_FLIGHT`` (a Stop's entry)  409     ``not_in_flight``
``MergeNotSupported`` (agent sends no parts)        409     ``not_supported``
``OutboxUnavailable``                               503     ``unavailable`` + ``accepted``
``KeySpaceClaimed`` (another project's key space)   503     ``unavailable`` + ``accepted``
==================================================  ======  ==============================

``outbox_full`` carries ``Retry-After: 30``, ``rate_limited`` the seconds until the user's
next accept can succeed, and 503 ``Retry-After: 5`` (:data:`FULL_RETRY_AFTER`,
:data:`UNAVAILABLE_RETRY_AFTER`; docs/explanation/idempotency.md#per-user-bounds). DRF's
own refusals keep their status and code
(``not_authenticated``, ``permission_denied``, ``parse_error``,
``unsupported_media_type``, …) in the same ``{"detail", "code"}`` body; a 403
``permission_denied`` adds ``action``, the access-policy action refused. Any other
exception, a plain ``ValueError`` included, is a server bug and answers 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import status
from rest_framework.exceptions import APIException, PermissionDenied, ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from ..errors import (
    ContentTooLarge,
    CutNotSupported,
    IdempotencyConflict,
    InvalidContent,
    InvalidIdentifier,
    KeySpaceClaimed,
    MergeNotSupported,
    ModelNotAllowed,
    OutboxFull,
    OutboxUnavailable,
    RateLimited,
    SessionBusy,
)

logger = logging.getLogger("django_outbox")

#: Retry-After (seconds) on 429 ``outbox_full``. A full session frees a slot only when
#: the agent finishes a turn (tens of seconds to minutes), so polling faster is waste;
#: clients that watch the queue over the WebSocket can resend as soon as it shrinks.
FULL_RETRY_AFTER = 30
#: Retry-After (seconds) on 503 ``unavailable``: Valkey restarts and failovers take seconds.
UNAVAILABLE_RETRY_AFTER = 5


def error_response(
    status_code: int,
    code: str,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    """A ``{"detail", "code", **extra}`` error response."""
    return Response({"detail": detail, "code": code, **extra}, status=status_code, headers=headers)


def not_found_response() -> Response:
    """404 ``not_found``: the message is not in the session (never was, or is gone)."""
    return error_response(
        status.HTTP_404_NOT_FOUND, "not_found", "No such message in this session."
    )


def busy_response() -> Response:
    """409 ``busy``: the message exists but cannot be changed right now."""
    return error_response(
        status.HTTP_409_CONFLICT,
        "busy",
        "The message is being delivered or verified right now, or is parked (only unpark "
        "moves parked messages). Try again when it has settled.",
    )


def version_mismatch_response(version: int) -> Response:
    """412 ``version_mismatch``: ``If-Match`` named another session version than the current
    one (``version``, also sent as the ``ETag``); nothing was changed
    (docs/howto/steering.md#edit)."""
    return error_response(
        status.HTTP_412_PRECONDITION_FAILED,
        "version_mismatch",
        "The session changed since you read it (If-Match names an old version); nothing "
        "was changed. Read the queue again and retry.",
        headers={"ETag": f'"{version}"'},
    )


def _messages(detail: Any) -> dict[str, list[str]]:
    """DRF validation detail as ``{field: [message, ...]}`` (non-dict detail: non_field_errors)."""
    if not isinstance(detail, dict):
        detail = {"non_field_errors": detail}
    out: dict[str, list[str]] = {}
    for name, value in detail.items():
        items = value if isinstance(value, list) else [value]
        out[str(name)] = [str(item) for item in items]
    return out


def _code_of(exc: APIException) -> str:
    code = getattr(exc.detail, "code", None)
    return str(code or exc.default_code)


def outbox_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Translate outbox errors, and reshape DRF's, into ``{"detail", "code"}`` responses.

    Used by the outbox views only (``get_exception_handler``), so a project's
    ``EXCEPTION_HANDLER`` cannot change this API's wire contract. Returns None for
    anything not recognised here: a server bug, which propagates (500).
    """
    if isinstance(exc, RequestDataTooBig):
        return error_response(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            "too_large",
            "The request body is larger than the server accepts "
            f"({settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes).",
        )
    if isinstance(exc, ContentTooLarge):  # before InvalidContent: it is one
        return error_response(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE, "too_large", f"{exc}. Nothing was stored."
        )
    if isinstance(exc, ModelNotAllowed):  # before InvalidContent: it is one
        return error_response(status.HTTP_400_BAD_REQUEST, "model_not_allowed", f"{exc}.")
    if isinstance(exc, InvalidContent):
        return error_response(status.HTTP_400_BAD_REQUEST, "invalid", str(exc))
    if isinstance(exc, InvalidIdentifier):
        return error_response(status.HTTP_400_BAD_REQUEST, "invalid_identifier", str(exc))
    if isinstance(exc, IdempotencyConflict):
        return error_response(
            status.HTTP_422_UNPROCESSABLE_ENTITY,
            "idempotency_conflict",
            "This clientMessageID was already used in this session with a different text "
            "or model; the stored message is unchanged. Use a new clientMessageID for a new "
            "message.",
        )
    if isinstance(exc, OutboxFull):
        if exc.scope == "user":
            held = f"You already have {exc.cap} queued messages in this workspace"
        else:
            held = f"The session already holds {exc.cap} queued messages"
        return error_response(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "outbox_full",
            f"{held}; nothing was stored. Retry later with the same clientMessageID.",
            headers={"Retry-After": str(FULL_RETRY_AFTER)},
            scope=exc.scope,
        )
    if isinstance(exc, RateLimited):
        return error_response(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "rate_limited",
            f"You sent {exc.limit} messages to this workspace within a minute; nothing was "
            f"stored. Retry in {exc.retry_after} s with the same clientMessageID.",
            headers={"Retry-After": str(exc.retry_after)},
        )
    if isinstance(exc, SessionBusy):
        return error_response(
            status.HTTP_409_CONFLICT,
            "session_busy",
            "The session is busy (a prompt is pending, in flight or being verified) and "
            "ifBusy is reject; nothing was stored. Send again later, with the same "
            "clientMessageID if you like.",
        )
    if isinstance(exc, KeySpaceClaimed):
        # The deployment is misconfigured: the operators learn who holds the space from
        # the log and from manage.py check; the client only that nothing was done.
        logger.error("outbox API: %s", exc)
        return error_response(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "unavailable",
            "The outbox is not available on this server until its operators fix its "
            "configuration; nothing was changed.",
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)},
            accepted=False,
        )
    if isinstance(exc, CutNotSupported):
        return error_response(
            status.HTTP_409_CONFLICT,
            "not_supported",
            "The agent's running turn cannot be cut here: no OUTBOX['ABORTER'] is configured; "
            "nothing was stored or changed.",
        )
    if isinstance(exc, MergeNotSupported):
        return error_response(
            status.HTTP_409_CONFLICT,
            "not_supported",
            "This session's agent cannot deliver merged prompts (ifBusy 'merge'); send the "
            "prompt without it. Nothing was stored.",
        )
    if isinstance(exc, OutboxUnavailable):
        logger.warning("outbox API: %s", exc)
        if exc.accepted:
            detail = (
                "The message was stored but not yet acknowledged by the required replicas or "
                "append-only file. Retry with the same clientMessageID: it answers 200 with the "
                "message's ID once stored."
            )
        elif _is_write(context):
            detail = (
                "The outbox store is unavailable; nothing was changed. Retry shortly (an accept "
                "retried with the same clientMessageID is stored once)."
            )
        else:
            detail = "The outbox store is unavailable. Retry shortly."
        return error_response(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            "unavailable",
            detail,
            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER)},
            accepted=exc.accepted,
        )
    response = drf_exception_handler(exc, context)
    if response is None or not isinstance(exc, APIException):
        return response
    if isinstance(exc, ValidationError):
        response.data = {
            "detail": "Invalid input.",
            "code": "invalid",
            "fieldErrors": _messages(exc.detail),
        }
    else:
        raw = exc.detail  # custom code may give a dict or a list: joined
        detail = (
            raw
            if isinstance(raw, str)
            else "; ".join(f"{k}: {v}" for k, v in _messages(raw).items())
        )
        response.data = {"detail": str(detail), "code": _code_of(exc)}
        if isinstance(exc, PermissionDenied):
            refused = _refused_action(context)
            if refused is not None:
                response.data["action"] = refused
    return response


def _refused_action(context: dict[str, Any]) -> str | None:
    """The access-policy action the refused request needed (None when the view names none):
    ``interrupt`` when it was refused cutting the running turn besides its own action."""
    view, request = (context or {}).get("view"), (context or {}).get("request")
    if getattr(request, "outbox_refused_cut", False):
        return "interrupt"
    outbox_action = getattr(view, "outbox_action", None)
    if outbox_action is None or request is None:
        return None
    action = outbox_action(request)
    return action if isinstance(action, str) else None


def _is_write(context: dict[str, Any]) -> bool:
    """Whether the failed request was one that changes something (POST, PUT, ...)."""
    request = context.get("request") if context else None
    return getattr(request, "method", "POST") not in ("GET", "HEAD", "OPTIONS")
