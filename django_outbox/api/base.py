"""The base of every outbox endpoint: JSON in and out, the access policy, the error contract.

:class:`OutboxAPIView` is what the views in :mod:`django_outbox.api.views` derive
from and what the schema (:mod:`django_outbox.api.schema`) recognises as an outbox
endpoint; :class:`OutboxJSONParser` is its only parser.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from ..core.actors import user_actor
from ..core.rules import check_identifier
from .errors import outbox_exception_handler
from .permissions import OutboxAccessPolicy


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


class OutboxAPIView(APIView):
    """Base of the outbox endpoints: JSON in and out, the access policy, the error contract.

    ``actions`` maps each served HTTP method to the access-policy action it needs;
    other methods answer 405. Authentication and throttling are the project's
    (``REST_FRAMEWORK`` defaults); permission is always :class:`OutboxAccessPolicy`,
    and errors are always answered by :func:`outbox_exception_handler`.
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

    def outbox_entry_id(self, request: Request) -> str | None:
        """The entry an action on one prompt is about, for an access policy that takes
        ``entry``: the path's entry ID (None when the path names none)."""
        return self.kwargs.get("entry_id")

    def outbox_cuts(self, request: Request) -> bool:
        """Whether the request cuts the session's running turn besides its own action
        (send-now, an accept with ``ifBusy: "interrupt"``): a policy that takes ``entry`` is
        then asked ``interrupt`` of the entry in flight too."""
        return False

    def get_exception_handler(self) -> Any:
        """:func:`outbox_exception_handler`, whatever the project's ``EXCEPTION_HANDLER``."""
        return outbox_exception_handler


def request_actor(request: Request) -> str:
    """Who acts, as an edit, move, cancel or Stop over REST records it: ``user:<pk>``,
    the request's user as an accept stores its ``userID``
    (docs/explanation/storage.md#who-changed-an-entry)."""
    return user_actor(request.user.pk)
