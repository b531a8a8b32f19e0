"""The REST endpoints that cut a running turn: ``interrupt/`` ("Stop") and ``send-now/``
(docs/howto/cutting.md, docs/reference/rest.md).

Both need the access-policy action ``interrupt``. A cut is carried out by the lease
holder, wherever it runs, within about a second, and its outcome is verified: the
answer is 202 with ``{"result": "cut" | "already"}`` once it is recorded, 200 when there
was nothing to cut. Without ``OUTBOX["ABORTER"]`` they answer 409 ``not_supported`` and
change nothing. A Stop names the entry it stops (``{"entryID"}``): 409 ``not_in_flight``,
nothing cut, once that entry is not the one in flight.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from ..core.entry import InterruptResult, SendNowResult
from ..core.rules import IDENTIFIER_RE
from ..outbox import get_outbox
from .base import OutboxAPIView, request_actor
from .errors import busy_response, error_response, not_found_response
from .schema import (
    BODY_ERRORS,
    ENTRY_PARAM,
    SESSION_PARAM,
    UNAVAILABLE_RETRY_AFTER_HEADER,
    WORKSPACE_PARAM,
    documented,
    with_common_errors,
)
from .serializers import ErrorSerializer, InterruptRequestSerializer

#: The results that mean a turn is being cut (answered 202: carried out asynchronously).
_CUTTING = frozenset({"cut", "already"})


class CutSerializer(serializers.Serializer):
    """``{"result"}`` of ``interrupt/`` and ``send-now/``."""

    result = serializers.ChoiceField(
        choices=["cut", "already", "idle", "moved"],
        help_text="cut: the turn in flight is being cut; already: it was cut before; idle: "
        "nothing was in flight (interrupt/); moved: the prompt is next, nothing was in flight "
        "(send-now/).",
    )


def not_supported_response() -> Response:
    """409 ``not_supported``: no aborter is configured, so a running turn cannot be cut."""
    return error_response(
        status.HTTP_409_CONFLICT,
        "not_supported",
        "The agent's running turn cannot be cut here: no OUTBOX['ABORTER'] is configured. "
        "Queued prompts can still be cancelled, edited and moved.",
    )


def not_in_flight_response() -> Response:
    """409 ``not_in_flight``: the entry a Stop names is not the one in flight (its turn
    ended: delivered, gone, back in the queue, or another entry is in flight); nothing
    was cut."""
    return error_response(
        status.HTTP_409_CONFLICT,
        "not_in_flight",
        "That message is not in flight any more (delivered, gone or queued, or another "
        "message is in flight now); nothing was cut. Stop the one in flight now by its ID "
        "if you mean to.",
    )


def _answer(result: str) -> Response:
    code = status.HTTP_202_ACCEPTED if result in _CUTTING else status.HTTP_200_OK
    return Response({"result": result}, status=code)


_CUT_RESPONSES = {
    200: OpenApiResponse(CutSerializer, "Nothing to cut."),
    202: OpenApiResponse(CutSerializer, "The turn is being cut; its outcome will be verified."),
}
_NOT_SUPPORTED = "no aborter is configured (not_supported)"


class SessionInterruptView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/interrupt/``: "Stop", cut the running turn."""

    actions = {"POST": "interrupt"}

    def outbox_entry_id(self, request: Request) -> str | None:
        """The ``entryID`` the Stop names, when it is a well-formed ID (else None: the
        body's own validation answers it)."""
        data = request.data
        named = data.get("entryID") if isinstance(data, dict) else None
        return named if isinstance(named, str) and IDENTIFIER_RE.fullmatch(named) else None

    @documented(
        operation_id="outbox_session_interrupt",
        summary="Stop: cut the running turn",
        description="Cut the agent's running turn in this session and send nothing new; "
        "queued prompts stay queued. The prompt in flight ends verified: `delivered` with "
        "`interrupted: true` when the agent has it, else removed as `cancelled` (never sent "
        "again). Idempotent. Needs `interrupt`. Send `entryID`, the message the client "
        "shows in flight: only its turn is cut, and 409 `not_in_flight` (nothing cut) once "
        "it is not the one in flight. Without it (no body), whatever turn is in flight when "
        "the request arrives is cut: a Stop sent as a turn ends may cut the next prompt's.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=InterruptRequestSerializer,
        responses=with_common_errors(
            {
                **_CUT_RESPONSES,
                409: OpenApiResponse(
                    ErrorSerializer,
                    f"The named message is not in flight (not_in_flight), or {_NOT_SUPPORTED}.",
                ),
                **BODY_ERRORS,
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str) -> Response:
        serializer = InterruptRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        named = serializer.validated_data.get("entryID")
        result = get_outbox().interrupt(
            workspace_id, session_id, entry_id=named, actor=request_actor(request)
        )
        if result is InterruptResult.NOT_SUPPORTED:
            return not_supported_response()
        if result is InterruptResult.NOT_IN_FLIGHT:
            return not_in_flight_response()
        return _answer(result.value)


class MessageSendNowView(OutboxAPIView):
    """``api/workspaces/<ws>/sessions/<ses>/messages/<id>/send-now/``: make a queued prompt
    the next one and cut the running turn."""

    actions = {"POST": "interrupt"}

    def outbox_cuts(self, request: Request) -> bool:
        """Sending a prompt now cuts the running turn, whoever's it is."""
        return True

    @documented(
        operation_id="outbox_message_send_now",
        summary="Send a queued prompt now",
        description="Move the pending prompt in front of every other pending prompt of the "
        "session and cut the running turn (as `interrupt/`); a prompt whose outcome is "
        "being verified stays ahead. 409 `busy` when the prompt is not pending (in flight, "
        "verifying, error, parked). Needs `interrupt`.",
        parameters=[WORKSPACE_PARAM, SESSION_PARAM, ENTRY_PARAM, UNAVAILABLE_RETRY_AFTER_HEADER],
        request=None,
        responses=with_common_errors(
            {
                **_CUT_RESPONSES,
                404: OpenApiResponse(ErrorSerializer, "No such message (not_found)."),
                409: OpenApiResponse(
                    ErrorSerializer, f"Not a pending prompt (busy), or {_NOT_SUPPORTED}."
                ),
            }
        ),
        tags=["outbox"],
    )
    def post(self, request: Request, workspace_id: str, session_id: str, entry_id: str) -> Response:
        result = get_outbox().send_now(
            workspace_id,
            session_id,
            entry_id,
            actor=request_actor(request),
            cut_only=getattr(request, "outbox_cut_only", None),
        )
        if result is SendNowResult.NOT_SUPPORTED:
            return not_supported_response()
        if result is SendNowResult.NOT_FOUND:
            return not_found_response()
        if result is SendNowResult.BUSY:
            return busy_response()
        return _answer(result.value)
