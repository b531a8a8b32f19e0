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

Every refusal accepts the handshake and then closes with its code, so the code
reaches the client through a real server (a close before accepting is an HTTP 403
on the wire, seen as 1006): 4400 an invalid ID, 4403 refused by the access policy,
4429 the user holds ``WS_MAX_SOCKETS_PER_USER`` sockets already, 4503 Valkey or the
channel layer unreachable (after one retry), 4500 no channel layer configured or an
unexpected error. No frame is sent before such a close. Whatever fails while a
message is handled, the socket's registrations (watcher count, group, socket
count) are undone when it closes.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.exceptions import StopConsumer
from channels.generic.websocket import AsyncWebsocketConsumer
from django.db.models import Model

from ..conf import outbox_settings
from ..core.redaction import redact
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
CLOSE_TOO_MANY = 4429
#: Server error (no channel layer, an unexpected failure). Not 1011: daphne (autobahn)
#: refuses an application close code outside 1000 and 3000-4999.
CLOSE_INTERNAL = 4500
#: Seconds a socket counts towards its user's ``WS_MAX_SOCKETS_PER_USER`` after it was
#: counted or last refreshed (:meth:`OutboxConsumer.refresh_socket`): a socket of a server
#: process that died stops counting after this long.
SOCKET_TTL = 600.0
#: What an error frame says (the cause, which may name servers, goes to the log only).
ERROR_TEXT = {
    "unavailable": "the queue store is unavailable right now; ask again with a resync",
    "internal": "the server could not handle this frame",
}


class OutboxConsumer(AsyncWebsocketConsumer):
    """One client watching one session's queue."""

    group: str | None = None
    #: True while this socket is counted in the session's watcher count.
    watching = False
    #: The user whose socket count holds this socket (None: not counted).
    socket_user: str | None = None
    socket_id = ""

    async def connect(self) -> None:
        """Check the IDs and the access policy, count the user's socket and the session's
        watcher, join the group, accept and send the snapshot. A refusal accepts and
        closes: 4400 (bad ID), 4403 (denied), 4429 (too many sockets), 4503 (Valkey or
        the channel layer down), 4500 (no channel layer, or an unexpected error)."""
        try:
            code = await self._admit()
        except Exception:
            logger.exception("outbox: WebSocket connect to %s failed", self.scope.get("path"))
            code = CLOSE_INTERNAL
        if code is not None:
            await self._release()
            await self._refuse(code)
            return
        await self.accept()
        try:
            await self._send_snapshot()
        except Exception:
            logger.exception("outbox: cannot send the snapshot to %s", self.scope.get("path"))
            await self.close(code=CLOSE_INTERNAL)

    async def _admit(self) -> int | None:
        """Everything :meth:`connect` does before accepting; the close code of a refusal,
        or None once the socket is counted and in its group."""
        if self.channel_layer is None:
            logger.error(
                "outbox: WebSocket to %s closed with 4500: CHANNEL_LAYERS is missing from "
                "the settings, so no queue update could reach it (README 'Live updates "
                "(WebSocket)')",
                self.scope.get("path"),
            )
            return CLOSE_INTERNAL
        kwargs = self.scope["url_route"]["kwargs"]
        self.workspace_id = kwargs.get("workspace_id", "")
        self.session_id = kwargs.get("session_id", "")
        if not (
            IDENTIFIER_RE.fullmatch(self.workspace_id) and IDENTIFIER_RE.fullmatch(self.session_id)
        ):
            return CLOSE_INVALID
        if not await self._allowed(fresh=False):
            return CLOSE_FORBIDDEN
        try:
            if not await self._retry_once("count the user's socket", self._open_socket):
                return CLOSE_TOO_MANY
            # Count this client before joining the group and reading the snapshot, so
            # every change is either in the snapshot or published (see publish.py).
            await self._retry_once("register a watcher", self._count_watcher)
            await self._retry_once("join the session's group", self._join_group)
        except Exception:
            return CLOSE_UNAVAILABLE
        return None

    async def disconnect(self, code: int) -> None:
        """Leave the group, uncount the watcher and the user's socket (best effort: the
        counts expire on their own)."""
        await self._release()

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, made to survive what a handler raises: a frame that fails
        gets an error frame (the socket stays open); any other failure is logged and
        closes the socket with 4500; a failed disconnect still undoes the counts."""
        try:
            await super().dispatch(message)
        except StopConsumer:
            raise
        except Exception:
            kind = message.get("type")
            logger.exception("outbox: WebSocket %s failed on %s", kind, self.scope.get("path"))
            if kind == "websocket.disconnect":
                await self._release()
                raise StopConsumer() from None
            try:
                if kind == "websocket.connect":
                    await self._release()
                    await self._refuse(CLOSE_INTERNAL)
                elif kind == "websocket.receive":
                    await self._error("internal")
                else:
                    await self.close(code=CLOSE_INTERNAL)
            except Exception as exc:  # the client is gone: its disconnect releases
                logger.warning("outbox: cannot answer a failure: %s", redact(str(exc)))

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
        except (ValueError, RecursionError):  # RecursionError: nested too deep
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

    async def refresh_socket(self) -> None:
        """Keep this socket counted towards its user's ``WS_MAX_SOCKETS_PER_USER`` for
        another :data:`SOCKET_TTL` seconds (call it at least every ``SOCKET_TTL / 2``).
        Logs and returns on failure (the count expires, it never blocks wrongly)."""
        if self.socket_user is None:
            return
        try:
            await get_outbox().arefresh_socket(self.socket_user, self.socket_id, ttl=SOCKET_TTL)
        except Exception as exc:
            logger.warning("outbox: cannot refresh a socket's count: %s", redact(str(exc)))

    async def _watch(self, delta: int) -> None:
        await get_outbox().awatch(self.workspace_id, self.session_id, delta)

    async def _refuse(self, code: int) -> None:
        """Accept, then close with ``code``: the only way a code reaches the client."""
        await self.accept()
        await self.close(code=code)

    async def _retry_once(self, what: str, step: Callable[[], Awaitable[Any]]) -> Any:
        """``step()``, once more if it fails (a pooled connection may be stale after a
        Valkey restart); the second failure is logged and raised."""
        try:
            return await step()
        except Exception as exc:
            logger.info("outbox: cannot %s (%s); trying once more", what, redact(str(exc)))
        try:
            return await step()
        except Exception as exc:
            logger.warning(
                "outbox: WebSocket to %s closed with 4503: cannot %s: %s",
                self.scope.get("path"),
                what,
                redact(f"{type(exc).__name__}: {exc}"),
            )
            raise

    async def _open_socket(self) -> bool:
        """Count this socket for its user; False when the user holds too many."""
        limit = outbox_settings().config.ws_max_sockets_per_user
        user_id = socket_user_id(self.scope.get("user"))
        if not limit or user_id is None:
            return True
        self.socket_id = self.socket_id or uuid.uuid4().hex
        if not await get_outbox().aopen_socket(
            user_id, self.socket_id, limit=limit, ttl=SOCKET_TTL
        ):
            logger.warning(
                "outbox: WebSocket to %s closed with 4429: the user already holds %d sockets "
                "(WS_MAX_SOCKETS_PER_USER)",
                self.scope.get("path"),
                limit,
            )
            return False
        self.socket_user = user_id
        return True

    async def _count_watcher(self) -> None:
        if not self.watching:
            await self._watch(+1)
            self.watching = True

    async def _join_group(self) -> None:
        group = group_name(self.workspace_id, self.session_id)
        await self.channel_layer.group_add(group, self.channel_name)
        self.group = group

    async def _release(self) -> None:
        """Undo what :meth:`_admit` registered, each step on its own (never raises)."""
        if self.group is not None:
            group, self.group = self.group, None
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except Exception as exc:  # the layer's group expiry drops it
                logger.warning("outbox: cannot leave a group: %s", redact(str(exc)))
        if self.watching:
            self.watching = False
            try:
                await self._watch(-1)
            except Exception as exc:  # the count expires on its own (WATCH_TTL)
                logger.warning("outbox: cannot unregister a watcher: %s", redact(str(exc)))
        if self.socket_user is not None:
            user, self.socket_user = self.socket_user, None
            try:
                await get_outbox().aclose_socket(user, self.socket_id)
            except Exception as exc:  # it expires on its own (SOCKET_TTL)
                logger.warning("outbox: cannot uncount a socket: %s", redact(str(exc)))

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

    async def _error(self, code: str, detail: str = "") -> None:
        """Send an error frame ``{"type": "error", "code", "detail"}``. For the codes of
        :data:`ERROR_TEXT` the client gets that fixed text and ``detail`` (which may
        name a server) is logged instead."""
        public = ERROR_TEXT.get(code)
        if public is not None:
            if detail:
                logger.warning(
                    "outbox: error frame %r to %s: %s", code, self.scope.get("path"), redact(detail)
                )
            detail = public
        await self.send(text_data=json.dumps({"type": "error", "code": code, "detail": detail}))


def socket_user_id(user: Any) -> str | None:
    """Whose socket this is, for ``WS_MAX_SOCKETS_PER_USER``: the primary key (as text)
    of an authenticated user; None (not counted) for an anonymous one or a user object
    without a primary key."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = getattr(user, "pk", None)
    return None if pk is None else str(pk)
