"""The REST API (DESIGN section 10): thin DRF views over the sync outbox service.

Every view validates the IDs in its path, asks the access policy, validates the
body, makes one service call and translates its result or error into HTTP.
Domain errors are mapped here and only here (STYLE.md, "Errors and results"):

==============================================  ======  ===================================
outcome                                         status  body / ``code``
==============================================  ======  ===================================
accepted                                        202     the entry
``Duplicate``                                   200     ``{"id", "duplicate": true}``
``IdempotencyConflict``                         422     ``idempotency_conflict``
``OutboxFull``                                  429     ``outbox_full``
text over ``MAX_TEXT_BYTES``                    413     ``too_large``
body over ``DATA_UPLOAD_MAX_MEMORY_SIZE``       413     ``too_large``
``InvalidIdentifier`` (ID in the path)          400     ``invalid_identifier``
body shape / content rule                       400     ``invalid`` + ``fieldErrors``
``RetryResult``/``DismissResult.NOT_FOUND``     404     ``not_found``
``RetryResult``/``DismissResult.BUSY``          409     ``busy``
``OutboxUnavailable``                           503     ``unavailable`` + ``accepted``
==============================================  ======  ===================================

429 carries ``Retry-After: 30`` and 503 ``Retry-After: 5`` (:data:`FULL_RETRY_AFTER`,
:data:`UNAVAILABLE_RETRY_AFTER`). DRF's own refusals keep their status and code
(``not_authenticated``, ``permission_denied``, ``parse_error``,
``unsupported_media_type``, …) in the same ``{"detail", "code"}`` body. The views
are sync on purpose: an accept is
one atomic Valkey script, so a client that disconnects mid-request cannot split it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError, ValidationError
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView
from rest_framework.views import exception_handler as drf_exception_handler

from ..core.entry import DismissResult, RetryResult
from ..core.rules import check_identifier
from ..errors import (
    Duplicate,
    IdempotencyConflict,
    InvalidIdentifier,
    OutboxFull,
    OutboxUnavailable,
)
from ..outbox import get_outbox
from .permissions import OutboxAccessPolicy
from .serializers import (
    IDENTIFIER_PATTERN,
    AcceptRequestSerializer,
    DuplicateSerializer,
    EntrySerializer,
    ErrorSerializer,
    ParkedSerializer,
    ParkRequestSerializer,
    RemovedSerializer,
    SnapshotSerializer,
    UnavailableSerializer,
    UnparkedSerializer,
    UnparkRequestSerializer,
    ValidationErrorSerializer,
)

logger = logging.getLogger("django_outbox")

#: Retry-After (seconds) on 429 ``outbox_full``. A full session frees a slot only when
#: the agent finishes a turn (tens of seconds to minutes), so polling faster is waste;
#: clients that watch the queue over the WebSocket can resend as soon as it shrinks.
FULL_RETRY_AFTER = 30
#: Retry-After (seconds) on 503 ``unavailable``: Valkey restarts and failovers take seconds.
UNAVAILABLE_RETRY_AFTER = 5


# --- errors ------------------------------------------------------------------------


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
    ``EXCEPTION_HANDLER`` cannot change this API's wire contract. Anything not
    recognised here is a server bug and propagates (500).
    """
    if isinstance(exc, RequestDataTooBig):
        return error_response(
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            "too_large",
            "The request body is larger than the server accepts "
            f"({settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes).",
        )
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
        return error_response(
            status.HTTP_429_TOO_MANY_REQUESTS,
            "outbox_full",
            f"The session already holds {exc.cap} queued messages; nothing was stored. "
            "Retry later with the same clientMessageID.",
            headers={"Retry-After": str(FULL_RETRY_AFTER)},
        )
    if isinstance(exc, OutboxUnavailable):
        logger.warning("outbox API: %s", exc)
        if exc.accepted:
            detail = (
                "The message was stored but not yet acknowledged by the required replicas or "
                "append-only file. Retry with the same clientMessageID: it answers 200 with the "
                "message's ID once stored."
            )
        else:
            detail = (
                "The outbox store is unavailable; nothing was changed. Retry shortly (an accept "
                "with the same clientMessageID)."
            )
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
        detail = exc.detail
        if not isinstance(detail, str):  # a dict or list detail from custom code
            detail = "; ".join(f"{k}: {v}" for k, v in _messages(detail).items())
        response.data = {"detail": str(detail), "code": _code_of(exc)}
    return response


class OutboxJSONParser(JSONParser):
    """DRF's JSON parser, answering 400 (not 500) for nesting too deep for Python's parser.

    DRF parses JSON from ``request.body``, so a body over
    ``DATA_UPLOAD_MAX_MEMORY_SIZE`` raises ``RequestDataTooBig`` (answered 413).
    """

    def parse(self, stream: Any, media_type: Any = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


# --- OpenAPI helpers -----------------------------------------------------------------

_ID_HELP = "1 to 128 characters: ASCII letters, digits, '.', '_' and '-', starting alnum."
WORKSPACE_PARAM = OpenApiParameter(
    "workspace_id",
    str,
    OpenApiParameter.PATH,
    pattern=IDENTIFIER_PATTERN,
    description=f"Workspace ID; {_ID_HELP}",
)
SESSION_PARAM = OpenApiParameter(
    "session_id",
    str,
    OpenApiParameter.PATH,
    pattern=IDENTIFIER_PATTERN,
    description=f"Session ID; {_ID_HELP}",
)
ENTRY_PARAM = OpenApiParameter(
    "entry_id",
    str,
    OpenApiParameter.PATH,
    pattern=IDENTIFIER_PATTERN,
    description="Entry ID (the ``id`` of an entry).",
)
FULL_RETRY_AFTER_HEADER = OpenApiParameter(
    "Retry-After",
    int,
    OpenApiParameter.HEADER,
    response=[429],
    description=f"Seconds to wait before retrying ({FULL_RETRY_AFTER}).",
)
UNAVAILABLE_RETRY_AFTER_HEADER = OpenApiParameter(
    "Retry-After",
    int,
    OpenApiParameter.HEADER,
    response=[503],
    description=f"Seconds to wait before retrying ({UNAVAILABLE_RETRY_AFTER}).",
)


def _responses(own: dict[int, Any]) -> dict[int, Any]:
    """The error responses every endpoint can give, plus the endpoint's ``own``."""
    responses: dict[int, Any] = {
        400: OpenApiResponse(
            ValidationErrorSerializer,
            "A malformed ID in the path (invalid_identifier) or body (invalid, parse_error).",
        ),
        401: OpenApiResponse(
            ErrorSerializer,
            "Not authenticated, with a WWW-Authenticate header (when the project's first "
            "authentication class sends one).",
        ),
        403: OpenApiResponse(
            ErrorSerializer,
            "Not authenticated (not_authenticated, session authentication), CSRF failed, or "
            "the access policy refused the action (permission_denied).",
        ),
        406: OpenApiResponse(ErrorSerializer, "The Accept header excludes application/json."),
        503: OpenApiResponse(
            UnavailableSerializer,
            "Valkey unreachable, out of memory, or a durability wait timed out (unavailable).",
        ),
    }
    responses.update(own)
    return dict(sorted(responses.items()))


_WITH_BODY = {
    413: OpenApiResponse(
        ErrorSerializer, "The body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE (too_large)."
    ),
    415: OpenApiResponse(ErrorSerializer, "Content-Type is not application/json."),
}


def documented(**kwargs: Any) -> Any:
    """``extend_schema`` on drf-spectacular's own ``AutoSchema``, whatever the project's
    ``DEFAULT_SCHEMA_CLASS`` (extend_schema otherwise bases the method's schema on it,
    and a project without drf-spectacular as its default would get a broken document)."""

    def decorate(method: Any) -> Any:
        method.schema = AutoSchema
        return extend_schema(**kwargs)(method)

    return decorate


# --- views ---------------------------------------------------------------------------


class OutboxAPIView(APIView):
    """Base of the outbox endpoints: JSON in and out, the access policy, the error contract.

    ``actions`` maps each served HTTP method to the access-policy action it needs;
    other methods answer 405. Authentication and throttling are the project's
    (``REST_FRAMEWORK`` defaults); permission is always :class:`OutboxAccessPolicy`.
    """

    permission_classes = [OutboxAccessPolicy]
    parser_classes = [OutboxJSONParser]
    renderer_classes = [JSONRenderer]
    metadata_class = None
    schema = AutoSchema()
    actions: dict[str, str] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        methods = [m.lower() for m in cls.actions]
        if "get" in methods:
            methods.append("head")
        cls.http_method_names = methods

    def outbox_action(self, request: Request) -> str | None:
        """The policy action the request's method needs (None: method not served)."""
        method = "GET" if request.method == "HEAD" else request.method
        return self.actions.get(method or "")

    def outbox_target(self) -> tuple[str, str | None]:
        """Validate every ID in the path; return ``(workspace_id, session_id or None)``.

        Raises :class:`InvalidIdentifier` (answered 400 ``invalid_identifier``).
        """
        workspace_id = check_identifier("workspace ID", self.kwargs.get("workspace_id"))
        session_id = self.kwargs.get("session_id")
        if session_id is not None:
            check_identifier("session ID", session_id)
        if "entry_id" in self.kwargs:
            check_identifier("entry ID", self.kwargs["entry_id"])
        return workspace_id, session_id

    def get_exception_handler(self) -> Any:
        return outbox_exception_handler


def _not_found() -> Response:
    return error_response(
        status.HTTP_404_NOT_FOUND, "not_found", "No such message in this session."
    )


def _busy() -> Response:
    return error_response(
        status.HTTP_409_CONFLICT,
        "busy",
        "The message is being delivered or verified right now, or is parked (only unpark "
        "moves parked messages). Try again when it has settled.",
    )


class MessagesView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/``: the session's queue; accept a prompt."""

    actions = {"GET": "view", "POST": "accept"}

    @documented(
        operation_id="outbox_messages_list",
        summary="The session's queue",
        description="The session's version counter and its entries in FIFO order, the one "
        "being delivered included, read atomically. Needs the `view` action.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        responses=_responses({200: SnapshotSerializer}),
        tags=["outbox"],
    )
    def get(self, request: Request, workspace_id: str, session_id: str) -> Response:
        snapshot = get_outbox().snapshot(workspace_id, session_id)
        return Response(
            {"version": snapshot.version, "entries": [e.to_dict() for e in snapshot.entries]}
        )

    @documented(
        operation_id="outbox_messages_accept",
        summary="Accept a prompt",
        description="Store the prompt durably in the session's queue and answer 202; a worker "
        "delivers it. Idempotent per `clientMessageID` for `DEDUPE_TTL` (24 h) from the first "
        "accept, whatever happened to the message since: resending the same key with the same "
        "text and model answers 200 with the original ID and stores nothing. Every refusal "
        "(4xx, 503 with `accepted: false`) stores nothing and leaves the key free. Needs the "
        "`accept` action; the entry records the user's ID as `userID`.",
        parameters=[
            WORKSPACE_PARAM,
            SESSION_PARAM,
            FULL_RETRY_AFTER_HEADER,
            UNAVAILABLE_RETRY_AFTER_HEADER,
        ],
        request=AcceptRequestSerializer,
        responses=_responses(
            {
                200: OpenApiResponse(
                    DuplicateSerializer, "Already accepted with this key and content."
                ),
                202: OpenApiResponse(EntrySerializer, "Accepted (status pending)."),
                413: OpenApiResponse(
                    ErrorSerializer,
                    "text is larger than MAX_TEXT_BYTES UTF-8 bytes, or the body larger than "
                    "DATA_UPLOAD_MAX_MEMORY_SIZE (too_large).",
                ),
                415: _WITH_BODY[415],
                422: OpenApiResponse(
                    ErrorSerializer,
                    "The key was used with a different text or model (idempotency_conflict).",
                ),
                429: OpenApiResponse(
                    ErrorSerializer, "The session holds CAP messages (outbox_full), Retry-After."
                ),
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str) -> Response:
        serializer = AcceptRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        outbox = get_outbox()
        limit = outbox.config.max_text_bytes
        size = len(data["text"].encode("utf-8"))
        if size > limit:
            return error_response(
                status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
                "too_large",
                f"text is {size} UTF-8 bytes; the limit is {limit}. Nothing was stored.",
            )
        try:
            entry = outbox.accept(
                workspace_id,
                session_id,
                user_id=str(request.user.pk),
                client_message_id=data["clientMessageID"],
                text=data["text"],
                model=data.get("model"),
            )
        except Duplicate as dup:
            return Response({"id": dup.accepted_id, "duplicate": True}, status=status.HTTP_200_OK)
        except InvalidIdentifier:
            raise
        except ValueError as exc:  # a content rule of the core the serializer did not cover
            return error_response(status.HTTP_400_BAD_REQUEST, "invalid", str(exc))
        return Response(entry.to_dict(), status=status.HTTP_202_ACCEPTED)


class MessageView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/<id>/``: dismiss a message."""

    actions = {"DELETE": "dismiss"}

    @documented(
        operation_id="outbox_message_dismiss",
        summary="Dismiss a message",
        description="Remove the message whatever its status. Its idempotency key stays "
        "used for DEDUPE_TTL: resending it answers 200 with this ID. Needs `dismiss`.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, ENTRY_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=_responses(
            {
                204: OpenApiResponse(None, "Removed."),
                404: OpenApiResponse(ErrorSerializer, "No such message (not_found)."),
                409: OpenApiResponse(ErrorSerializer, "Being delivered or verified (busy)."),
            }
        ),
        tags=["outbox"],
    )
    def delete(
        self, request: Request, workspace_id: str, session_id: str, entry_id: str
    ) -> Response:
        result = get_outbox().dismiss(workspace_id, session_id, entry_id)
        if result is DismissResult.NOT_FOUND:
            return _not_found()
        if result is DismissResult.BUSY:
            return _busy()
        return Response(status=status.HTTP_204_NO_CONTENT)


class MessageRetryView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/<id>/retry/``: re-arm a message now."""

    actions = {"POST": "retry"}

    @documented(
        operation_id="outbox_message_retry",
        summary="Retry a message now",
        description="Re-arm the message: an error message returns to pending (to verifying "
        "if its last outcome is unknown and a verifier is configured); a pending or verifying "
        "one loses its backoff. Never passes through dedupe. Answers the message as it is "
        "after the retry; 404 if it is gone by then (delivered or dismissed meanwhile). "
        "Needs `retry`.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, ENTRY_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=_responses(
            {
                200: OpenApiResponse(EntrySerializer, "Re-armed; the message as it is now."),
                404: OpenApiResponse(ErrorSerializer, "No such message (not_found)."),
                409: OpenApiResponse(
                    ErrorSerializer, "Being delivered or verified, or parked (busy)."
                ),
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str, entry_id: str) -> Response:
        outbox = get_outbox()
        result = outbox.retry(workspace_id, session_id, entry_id)
        if result is RetryResult.NOT_FOUND:
            return _not_found()
        if result is RetryResult.BUSY:
            return _busy()
        for entry in outbox.snapshot(workspace_id, session_id).entries:
            if entry.id == entry_id:
                return Response(entry.to_dict())
        return error_response(
            status.HTTP_404_NOT_FOUND,
            "not_found",
            "The message was re-armed but is no longer queued (delivered or dismissed since).",
        )


class WorkspaceView(OutboxAPIView):
    """``api/workspaces/<ws>/``: delete every key of the workspace (operator action)."""

    actions = {"DELETE": "operate"}

    @documented(
        operation_id="outbox_workspace_cleanup",
        summary="Clean up a workspace",
        description="Delete every queue, lease, version and idempotency marker of the "
        "workspace (its keys are free again afterwards). Idempotent. Needs `operate`.",
        parameters=[WORKSPACE_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=_responses({200: RemovedSerializer}),
        tags=["outbox"],
    )
    def delete(self, request: Request, workspace_id: str) -> Response:
        return Response({"removed": get_outbox().cleanup_workspace(workspace_id)})


class WorkspaceParkView(OutboxAPIView):
    """``api/workspaces/<ws>/park/``: park every queued message of the workspace."""

    actions = {"POST": "operate"}

    @documented(
        operation_id="outbox_workspace_park",
        summary="Park a workspace",
        description="Park every pending, verifying and delivering message of the workspace "
        "with `reason`. Parked messages are inert until unparked or dismissed. Needs "
        "`operate`.",
        parameters=[WORKSPACE_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=ParkRequestSerializer,
        responses=_responses({200: ParkedSerializer, **_WITH_BODY}),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str) -> Response:
        serializer = ParkRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            parked = get_outbox().park_workspace(workspace_id, serializer.validated_data["reason"])
        except InvalidIdentifier:
            raise
        except ValueError as exc:
            return error_response(status.HTTP_400_BAD_REQUEST, "invalid", str(exc))
        return Response({"parked": parked})


class WorkspaceUnparkView(OutboxAPIView):
    """``api/workspaces/<ws>/unpark/``: return parked messages to where they were."""

    actions = {"POST": "operate"}

    @documented(
        operation_id="outbox_workspace_unpark",
        summary="Unpark a workspace",
        description="Return parked messages (only those parked with `reason`, if given) to "
        "pending, or to verifying when their last attempt's outcome is unknown. The body may "
        "be empty. Needs `operate`.",
        parameters=[WORKSPACE_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=UnparkRequestSerializer,
        responses=_responses({200: UnparkedSerializer, **_WITH_BODY}),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str) -> Response:
        serializer = UnparkRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            unparked = get_outbox().unpark_workspace(
                workspace_id, serializer.validated_data.get("reason")
            )
        except InvalidIdentifier:
            raise
        except ValueError as exc:
            return error_response(status.HTTP_400_BAD_REQUEST, "invalid", str(exc))
        return Response({"unparked": unparked})


# --- the schema ----------------------------------------------------------------------


def only_outbox_endpoints(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: keep the outbox API's endpoints only."""
    return [
        endpoint
        for endpoint in endpoints
        if isinstance(getattr(endpoint[3], "cls", None), type)
        and issubclass(endpoint[3].cls, OutboxAPIView)
    ]


class OutboxSchemaView(SpectacularAPIView):
    """The OpenAPI 3 document of the outbox API, wherever it is mounted.

    YAML by default; ``?format=json`` or ``Accept: application/vnd.oai.openapi+json``
    for JSON. Only the outbox endpoints are described, with their full paths.
    """

    custom_settings = {
        "TITLE": "django-outbox API",
        "DESCRIPTION": "Accept prompts into a durable per-session outbox and operate on it. "
        'Every error body is {"detail": "...", "code": "..."} with a stable code.',
        "VERSION": "1",
        "PREPROCESSING_HOOKS": ["django_outbox.api.views.only_outbox_endpoints"],
    }
