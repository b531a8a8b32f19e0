"""The queue WebSocket consumer: a snapshot on connect, then every ``queue.update``.

README "Live updates (WebSocket)" describes the frames. Route:
``ws/outbox/workspaces/<ws>/sessions/<ses>/`` (see :mod:`django_outbox.ws.routing`).
The user comes from the scope (``AuthMiddlewareStack``, or any middleware that
sets ``scope["user"]``, e.g. a token middleware); the access policy decides
(action ``view``, README "Access policy"), on connect and again on every resync,
with the user read afresh from the database (a refusal closes with 4403). Frames
the client may send: ``{"type": "resync"}`` → a fresh ``queue.snapshot``.
Anything else gets an error frame and the socket stays open; binary frames
(close 1003) and frames over ``MAX_FRAME_BYTES`` (close 1009) close that socket
only.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from asgiref.sync import sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db.models import Model

from ..core.rules import IDENTIFIER_RE
from ..errors import OutboxUnavailable
from ..outbox import get_outbox
from ..policy import is_allowed
from .publish import group_name

# The logger keeps the name it had before the module moved into ws/ (logging configs use it).
logger = logging.getLogger("django_outbox.consumers")

MAX_FRAME_BYTES = 64 * 1024
CLOSE_UNSUPPORTED = 1003  # binary frames
CLOSE_TOO_BIG = 1009
CLOSE_FORBIDDEN = 4403
CLOSE_INVALID = 4400
CLOSE_UNAVAILABLE = 4503


class OutboxConsumer(AsyncWebsocketConsumer):
    """One client watching one session's queue."""

    group: str | None = None

    async def connect(self) -> None:
        """Check the IDs and the access policy, count the watcher, join the group, send
        the snapshot. Closes with 4400 (bad ID), 4403 (denied) or 4503 (Valkey down)."""
        kwargs = self.scope["url_route"]["kwargs"]
        self.workspace_id = kwargs.get("workspace_id", "")
        self.session_id = kwargs.get("session_id", "")
        if not (
            IDENTIFIER_RE.fullmatch(self.workspace_id) and IDENTIFIER_RE.fullmatch(self.session_id)
        ):
            await self.close(code=CLOSE_INVALID)
            return
        if not await self._allowed(fresh=False):
            await self.close(code=CLOSE_FORBIDDEN)
            return
        # Count this client before joining the group and reading the snapshot, so
        # every change is either in the snapshot or published (see publish.py).
        try:
            await self._watch(+1)
        except Exception as exc:
            logger.warning("outbox: cannot register a watcher: %s", exc)
            await self.close(code=CLOSE_UNAVAILABLE)
            return
        self.group = group_name(self.workspace_id, self.session_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self._send_snapshot()

    async def disconnect(self, code: int) -> None:
        """Leave the group and uncount the watcher (best effort: the count expires)."""
        if self.group is not None:
            await self.channel_layer.group_discard(self.group, self.channel_name)
            self.group = None
            try:
                await self._watch(-1)
            except Exception as exc:  # the count expires on its own (WATCH_TTL)
                logger.warning("outbox: cannot unregister a watcher: %s", exc)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Answer ``{"type": "resync"}`` with a snapshot once the access policy still
        allows it (else close 4403); anything else with an error frame."""
        if bytes_data is not None:
            await self.close(code=CLOSE_UNSUPPORTED)
            return
        text = text_data or ""
        if len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
            await self.close(code=CLOSE_TOO_BIG)
            return
        try:
            message = json.loads(text)
        except ValueError:
            await self._error("malformed", "frames must be JSON objects")
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "resync":
            if not await self._allowed(fresh=True):
                await self.close(code=CLOSE_FORBIDDEN)
                return
            await self._send_snapshot()
        else:
            await self._error(
                "unknown_type", 'the only frame a client may send is {"type": "resync"}'
            )

    async def queue_update(self, message: dict[str, Any]) -> None:
        """Relay a ``queue.update`` from the channel layer."""
        await self.send(text_data=json.dumps(message, ensure_ascii=False))

    # -- helpers -----------------------------------------------------------------

    async def _watch(self, delta: int) -> None:
        await get_outbox().awatch(self.workspace_id, self.session_id, delta)

    @sync_to_async
    def _allowed(self, fresh: bool) -> bool:
        """Whether the access policy lets the scope's user ``view`` this session; with
        ``fresh``, the user as the database holds it now (Django caches permissions
        on a user object, and the scope's is as old as the connection)."""
        user = self.scope.get("user")
        if fresh and isinstance(user, Model) and user.pk is not None:
            user = user.__class__._default_manager.filter(pk=user.pk).first()
        return is_allowed(user, self.workspace_id, self.session_id, "view")

    async def _send_snapshot(self) -> None:
        try:
            snapshot = await get_outbox().asnapshot(self.workspace_id, self.session_id)
        except OutboxUnavailable as exc:
            await self._error("unavailable", str(exc))
            return
        await self.send(
            text_data=json.dumps(
                {
                    "type": "queue.snapshot",
                    "workspaceID": self.workspace_id,
                    "sessionID": self.session_id,
                    "version": snapshot.version,
                    "entries": [e.to_dict() for e in snapshot.entries],
                },
                ensure_ascii=False,
            )
        )

    async def _error(self, code: str, detail: str) -> None:
        await self.send(text_data=json.dumps({"type": "error", "code": code, "detail": detail}))
