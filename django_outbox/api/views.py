"""The REST API's views: thin DRF views over the sync outbox service (docs/reference/rest.md).

Every view validates the IDs in its path, asks the access policy (both in
:class:`~django_outbox.api.base.OutboxAPIView`), validates the body, makes one
service call and answers its result. Errors, the core's content rules included,
are answered by :mod:`django_outbox.api.errors`, which lists every status and
code; the OpenAPI text in the ``documented`` decorators comes from
:mod:`django_outbox.api.schema`. The views are sync on purpose: an accept is one
atomic Valkey script, so a client that disconnects mid-request cannot split it.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

from drf_spectacular.utils import OpenApiResponse, extend_schema_view
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from ..core.entry import (
    CancelResult,
    DismissResult,
    EditResult,
    Entry,
    InterruptResult,
    MoveResult,
    RetryResult,
    Snapshot,
    format_time,
)
from ..core.rules import entry_for_viewer
from ..errors import Duplicate, InvalidContent
from ..outbox import get_outbox
from ..policy import reads_error_excerpts
from .base import OutboxAPIView, request_actor
from .cutting import CutSerializer, not_supported_response
from .errors import (
    busy_response,
    error_response,
    not_found_response,
    version_mismatch_response,
)
from .schema import (
    BODY_ERRORS,
    ENTRY_PARAM,
    FULL_RETRY_AFTER_HEADER,
    IF_MATCH_HEADER,
    SESSION_PARAM,
    UNAVAILABLE_RETRY_AFTER_HEADER,
    WORKSPACE_PARAM,
    documented,
    with_common_errors,
)
from .serializers import (
    AcceptRequestSerializer,
    DuplicateSerializer,
    EditRequestSerializer,
    EntrySerializer,
    ErrorSerializer,
    MoveRequestSerializer,
    ParkedSerializer,
    ParkRequestSerializer,
    RemovedSerializer,
    SnapshotSerializer,
    UnparkedSerializer,
    UnparkRequestSerializer,
    WorkerPresenceSerializer,
)
from .throttling import UserAcceptThrottle


def entries_for(request: Request, *entries: Entry) -> list[dict[str, Any]]:
    """``entries`` as the request's user reads them: a ``lastError`` with its
    ``errorKind`` and ``errorStatus``, the stored excerpt for staff only
    (:func:`~django_outbox.policy.reads_error_excerpts`, docs/reference/rest.md)."""
    excerpt = any(e.last_error for e in entries) and reads_error_excerpts(request.user)
    return [entry_for_viewer(e.to_dict(), excerpt=excerpt) for e in entries]


class MessagesView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/``: the session's queue; accept a prompt."""

    actions = {"GET": "view", "POST": "accept"}

    def outbox_cuts(self, request: Request) -> bool:
        """An accept with ``ifBusy: "interrupt"`` cuts the running turn, whoever's it is."""
        data = request.data if request.method == "POST" else None
        return isinstance(data, dict) and data.get("ifBusy") == "interrupt"

    def get_throttles(self) -> list[Any]:
        """The project's throttles, and on an accept one user's bound over every workspace
        (:class:`~django_outbox.api.throttling.UserAcceptThrottle`)."""
        throttles = list(super().get_throttles())
        if self.request.method == "POST":
            throttles.append(UserAcceptThrottle())
        return throttles

    @documented(
        operation_id="outbox_messages_list",
        summary="The session's queue",
        description="The session's version counter and its entries in FIFO order, the one "
        "being delivered included, read atomically. Needs the `view` action.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        responses=with_common_errors({200: SnapshotSerializer}),
        tags=["outbox"],
    )
    def get(self, request: Request, workspace_id: str, session_id: str) -> Response:
        snapshot = get_outbox().snapshot(workspace_id, session_id)
        return Response(
            {"version": snapshot.version, "entries": entries_for(request, *snapshot.entries)},
            headers={"ETag": f'"{snapshot.version}"'},
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
        responses=with_common_errors(
            {
                200: OpenApiResponse(
                    DuplicateSerializer, "Already accepted with this key and content."
                ),
                202: OpenApiResponse(
                    EntrySerializer,
                    "Accepted (status pending, or parked with the park's reason while the "
                    "workspace is parked).",
                ),
                413: OpenApiResponse(
                    ErrorSerializer,
                    "text is larger than MAX_TEXT_BYTES UTF-8 bytes, model larger than 16 KiB "
                    "encoded as JSON, or the body larger than DATA_UPLOAD_MAX_MEMORY_SIZE "
                    "(too_large).",
                ),
                415: BODY_ERRORS[415],
                422: OpenApiResponse(
                    ErrorSerializer,
                    "The key was used with a different text or model (idempotency_conflict).",
                ),
                429: OpenApiResponse(
                    ErrorSerializer, "The session holds CAP messages (outbox_full), Retry-After."
                ),
                409: OpenApiResponse(
                    ErrorSerializer,
                    "ifBusy reject and the session is busy (session_busy); ifBusy interrupt "
                    "and no aborter is configured, or ifBusy merge and the agent cannot "
                    "deliver merged prompts (not_supported). Nothing stored.",
                ),
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str) -> Response:
        serializer = AcceptRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        options = {
            "user_id": str(request.user.pk),
            "client_message_id": data["clientMessageID"],
            "text": data["text"],
            "model": data.get("model"),
            "if_busy": data["ifBusy"],
            "expires_after": data.get("expiresAfter"),
        }
        cut_only = getattr(request, "outbox_cut_only", None)
        outbox = get_outbox()
        try:
            if cut_only is not None and data["ifBusy"] == "interrupt":
                entry = outbox.accept_interrupting(
                    workspace_id, session_id, cut_only=cut_only, **options
                )[0]
            else:
                entry = outbox.accept(workspace_id, session_id, **options)
        except Duplicate as dup:
            return Response({"id": dup.accepted_id, "duplicate": True}, status=status.HTTP_200_OK)
        return Response(entries_for(request, entry)[0], status=status.HTTP_202_ACCEPTED)


class MessageView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/<id>/``: dismiss or edit a message."""

    actions = {"DELETE": "dismiss", "PATCH": "edit"}

    @documented(
        operation_id="outbox_message_dismiss",
        summary="Dismiss a message",
        description="Remove the message whatever its status. Its idempotency key stays "
        "used for DEDUPE_TTL: resending it answers 200 with this ID. Needs `dismiss`.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, ENTRY_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=with_common_errors(
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
            return not_found_response()
        if result is DismissResult.BUSY:
            return busy_response()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @documented(
        operation_id="outbox_message_edit",
        summary="Edit a waiting message",
        description="Replace the text and/or model of a message that is pending, parked, "
        "expired or in error; it keeps its ID, place and state. Send `If-Match` with the "
        "session version you read (the list's `ETag`): another version answers 412 and "
        "changes nothing. A resend of the original accept (same key, original text) still "
        "answers 200 duplicate with this ID. Needs `edit`.",
        parameters=[
            WORKSPACE_PARAM,
            SESSION_PARAM,
            ENTRY_PARAM,
            IF_MATCH_HEADER,
            UNAVAILABLE_RETRY_AFTER_HEADER,
        ],
        request=EditRequestSerializer,
        responses=with_common_errors(
            {
                200: OpenApiResponse(EntrySerializer, "Edited; the message as it is now."),
                404: OpenApiResponse(ErrorSerializer, "No such message (not_found)."),
                409: OpenApiResponse(ErrorSerializer, "Being delivered or verified (busy)."),
                412: OpenApiResponse(
                    ErrorSerializer, "If-Match names an old version (version_mismatch)."
                ),
                **BODY_ERRORS,
                413: OpenApiResponse(
                    ErrorSerializer, "text larger than MAX_TEXT_BYTES, or body too large."
                ),
            }
        ),
        tags=["outbox"],
    )
    def patch(
        self, request: Request, workspace_id: str, session_id: str, entry_id: str
    ) -> Response:
        if_version = if_match_version(request)
        serializer = EditRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        outbox = get_outbox()
        result = outbox.edit(
            workspace_id,
            session_id,
            entry_id,
            text=data.get("text"),
            model=data.get("model"),
            if_version=if_version,
            actor=request_actor(request),
        )
        if result is EditResult.NOT_FOUND:
            return not_found_response()
        if result is EditResult.BUSY:
            return busy_response()
        snapshot = outbox.snapshot(workspace_id, session_id)
        if result is EditResult.VERSION_MISMATCH:
            return version_mismatch_response(snapshot.version)
        return entry_response(request, snapshot, entry_id)


def if_match_version(request: Request) -> int | None:
    """The session version an ``If-Match`` header names (``"42"``, ``W/"42"`` or ``42``),
    or None without one (``*`` too). Raises ``InvalidContent`` (400) for anything else,
    a number longer than :data:`MAX_VERSION_DIGITS` included (a version is a 64-bit
    counter; Python refuses to read an integer of over 4300 digits)."""
    header = request.headers.get("If-Match")
    if header is None or header.strip() == "*":
        return None
    value = header.strip().removeprefix("W/").strip('"')
    if not value.isascii() or not value.isdigit() or len(value) > MAX_VERSION_DIGITS:
        raise InvalidContent('If-Match must be a session version, e.g. "42"')
    return int(value)


#: The most digits an ``If-Match`` version may have: a session version is Valkey's
#: signed 64-bit counter, at most 19 digits.
MAX_VERSION_DIGITS = 19


def entry_response(request: Request, snapshot: Snapshot, entry_id: str) -> Response:
    """200 with the entry as the snapshot holds it and the session version as ``ETag``;
    404 when it is no longer queued (delivered or removed meanwhile)."""
    for entry in snapshot.entries:
        if entry.id == entry_id:
            return Response(
                entries_for(request, entry)[0], headers={"ETag": f'"{snapshot.version}"'}
            )
    return error_response(
        status.HTTP_404_NOT_FOUND,
        "not_found",
        "The message was changed but is no longer queued (delivered or removed since).",
    )


class MessageMoveView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/<id>/move/``: reorder a queued message."""

    actions = {"POST": "move"}

    @documented(
        operation_id="outbox_message_move",
        summary="Move a queued message",
        description='Reorder: `{"before": "<id>"}` puts it right before another queued '
        'message, `{"to": "next"}` first after the message in flight or being verified, '
        '`{"to": "last"}` at the end. The message in flight or being verified never moves '
        "and nothing moves ahead of it (409 busy). Moving it where it already stands "
        "changes nothing. Needs `move`.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, ENTRY_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=MoveRequestSerializer,
        responses=with_common_errors(
            {
                200: OpenApiResponse(EntrySerializer, "Moved; the message as it is now."),
                404: OpenApiResponse(
                    ErrorSerializer, "No such message, or no such message to go before."
                ),
                409: OpenApiResponse(
                    ErrorSerializer, "It, or the place asked for, is in flight (busy)."
                ),
                **BODY_ERRORS,
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str, entry_id: str) -> Response:
        serializer = MoveRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        outbox = get_outbox()
        result = outbox.move(
            workspace_id,
            session_id,
            entry_id,
            before=data.get("before"),
            to=data.get("to"),
            actor=request_actor(request),
        )
        if result is MoveResult.NOT_FOUND:
            return not_found_response()
        if result is MoveResult.BUSY:
            return busy_response()
        return entry_response(request, outbox.snapshot(workspace_id, session_id), entry_id)


def cancel_in_flight_response(
    request: Request, workspace_id: str, session_id: str, entry_id: str
) -> Response:
    """What ``cancel/`` answers for the message in flight or being verified: its turn is
    cut (``Outbox.cut``; docs/howto/cutting.md), and the cut's outcome is verified — 202
    ``{"result": "cut" | "already"}``; 409 ``not_supported`` without an aborter (nothing
    changed); 404 when it is gone meanwhile. Back in the queue meanwhile (its attempt
    failed): cancelled as a queued prompt, 204; anything else: 409 ``busy``."""
    outbox = get_outbox()
    actor = request_actor(request)
    result = outbox.cut(workspace_id, session_id, entry_id, actor=actor)
    if result is InterruptResult.NOT_SUPPORTED:
        return not_supported_response()
    if result is InterruptResult.NOT_FOUND:
        return not_found_response()
    if result in (InterruptResult.CUT, InterruptResult.ALREADY):
        return Response({"result": result.value}, status=status.HTTP_202_ACCEPTED)
    if result is InterruptResult.QUEUED:
        if outbox.cancel(workspace_id, session_id, entry_id, actor=actor) is CancelResult.REMOVED:
            return Response(status=status.HTTP_204_NO_CONTENT)
    return busy_response()


class MessageCancelView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/<id>/cancel/``: cancel a message."""

    actions = {"POST": "cancel"}

    @documented(
        operation_id="outbox_message_cancel",
        summary="Cancel a message",
        description="A queued message (pending, parked, expired or in error) is removed as "
        "by DELETE; watchers see it `cancelled`, and its key stays used for DEDUPE_TTL. The "
        "message in flight or being verified has its turn cut (202; 409 not_supported "
        "without an aborter) and ends verified: `delivered` with `interrupted: true`, or "
        "`cancelled`. Needs `cancel`.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, ENTRY_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=with_common_errors(
            {
                202: OpenApiResponse(CutSerializer, "In flight: its turn is being cut."),
                204: OpenApiResponse(None, "Cancelled (removed)."),
                404: OpenApiResponse(ErrorSerializer, "No such message (not_found)."),
                409: OpenApiResponse(
                    ErrorSerializer, "In flight and no aborter is configured (not_supported)."
                ),
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str, entry_id: str) -> Response:
        result = get_outbox().cancel(
            workspace_id, session_id, entry_id, actor=request_actor(request)
        )
        if result is CancelResult.NOT_FOUND:
            return not_found_response()
        if result is CancelResult.IN_FLIGHT:
            return cancel_in_flight_response(request, workspace_id, session_id, entry_id)
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
        responses=with_common_errors(
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
            return not_found_response()
        if result is RetryResult.BUSY:
            return busy_response()
        for entry in outbox.snapshot(workspace_id, session_id).entries:
            if entry.id == entry_id:
                return Response(entries_for(request, entry)[0])
        return error_response(
            status.HTTP_404_NOT_FOUND,
            "not_found",
            "The message was re-armed but is no longer queued (delivered or dismissed since).",
        )


class WorkspaceView(OutboxAPIView):
    """``api/workspaces/<ws>/``: delete every key of the workspace (operator action)."""

    actions = {"DELETE": "cleanup"}

    @documented(
        operation_id="outbox_workspace_cleanup",
        summary="Clean up a workspace",
        description="Delete every queue, lease, version and idempotency marker of the "
        "workspace (its keys are free again afterwards). Idempotent. Needs `cleanup`.",
        parameters=[WORKSPACE_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=with_common_errors({200: RemovedSerializer}),
        tags=["outbox"],
    )
    def delete(self, request: Request, workspace_id: str) -> Response:
        return Response({"removed": get_outbox().cleanup_workspace(workspace_id)})


class WorkspaceBulkView(OutboxAPIView, abc.ABC):
    """Base of ``park/`` and ``unpark/``: validate the ``{reason}`` body with
    ``request_serializer``, run :meth:`run` over the workspace and answer
    ``{count_member: count}``. Needs ``park`` (park and unpark alike)."""

    actions = {"POST": "park"}
    request_serializer: ClassVar[type[serializers.Serializer]]
    count_member: ClassVar[str]

    @abc.abstractmethod
    def run(self, workspace_id: str, data: dict[str, Any]) -> int:
        """Apply the operation to the workspace with the validated body ``data``; return
        how many entries it changed. Raises what the service raises."""

    def post(self, request: Request, workspace_id: str) -> Response:
        serializer = self.request_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        count = self.run(workspace_id, serializer.validated_data)
        return Response({self.count_member: count})


@extend_schema_view(
    post=documented(
        operation_id="outbox_workspace_park",
        summary="Park a workspace",
        description="Pause the workspace: park every pending, verifying and delivering message "
        "with `reason`, and hold every message accepted into the workspace afterwards (any "
        "session, old or new) as parked with the same reason until it is unparked. Parked "
        "messages are inert until unparked or dismissed; a delivery already in flight "
        "finishes. Needs `park`.",
        parameters=[WORKSPACE_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=ParkRequestSerializer,
        responses=with_common_errors({200: ParkedSerializer, **BODY_ERRORS}),
        tags=["outbox"],
    )
)
class WorkspaceParkView(WorkspaceBulkView):
    """``api/workspaces/<ws>/park/``: pause the workspace (park and hold its messages)."""

    request_serializer = ParkRequestSerializer
    count_member = "parked"

    def run(self, workspace_id: str, data: dict[str, Any]) -> int:
        return get_outbox().park_workspace(workspace_id, data["reason"])


@extend_schema_view(
    post=documented(
        operation_id="outbox_workspace_unpark",
        summary="Unpark a workspace",
        description="Return parked messages (only those parked with `reason`, if given) to "
        "pending, or to verifying when their last attempt's outcome is unknown, and end the "
        "workspace's pause (when it was parked with `reason`, or none is given). Each "
        "session is released in accept order. The body may be empty. Needs `park`.",
        parameters=[WORKSPACE_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=UnparkRequestSerializer,
        responses=with_common_errors({200: UnparkedSerializer, **BODY_ERRORS}),
        tags=["outbox"],
    )
)
class WorkspaceUnparkView(WorkspaceBulkView):
    """``api/workspaces/<ws>/unpark/``: return parked messages to where they were."""

    request_serializer = UnparkRequestSerializer
    count_member = "unparked"

    def run(self, workspace_id: str, data: dict[str, Any]) -> int:
        return get_outbox().unpark_workspace(workspace_id, data.get("reason"))


class WorkerView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/worker/``: is a worker alive to deliver?"""

    actions = {"GET": "view"}

    @documented(
        operation_id="outbox_worker_presence",
        summary="Is a worker running?",
        description="Whether any worker is alive (its heartbeat, written every 5 s, is "
        "less than 15 s old) and when one last beat, so that a page can say why prompts "
        "stay queued. Nothing else about the workers (hosts, PIDs, counts) is shown. "
        "Needs the `view` action on the session.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        responses=with_common_errors({200: WorkerPresenceSerializer}),
        tags=["outbox"],
    )
    def get(self, request: Request, workspace_id: str, session_id: str) -> Response:
        presence = get_outbox().worker_presence()
        seen = presence.last_seen
        return Response(
            {
                "alive": presence.alive,
                "lastSeen": None if seen is None else format_time(int(seen * 1_000_000)),
            }
        )
