"""Origin validators that say why they refused, and say it on the wire.

docs/quickstart.md#asgipy shows them in ``asgi.py``; docs/reference/websocket.md#origins
says what they do. Channels' own :class:`channels.security.websocket.OriginValidator`
refuses a missing or foreign ``Origin`` by closing before the handshake is accepted: the
server answers HTTP 403, the browser sees close code 1006 (indistinguishable from a
dropped network, so a client keeps reconnecting), and nothing is logged. These
subclasses take the same arguments and let the same origins through; a refused socket is
accepted and then closed with 4403, and the refusal is logged (warning, logger
``django_outbox.consumers``) with its reason and the origin as sent (credentials
removed, at most :data:`MAX_LOGGED_ORIGIN` characters).

Being subclasses, they satisfy the ``django_outbox.W008`` system check.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlparse

from channels.security import websocket as channels_websocket
from django.conf import settings

from ..core.redaction import redact

logger = logging.getLogger("django_outbox.consumers")

CLOSE_FORBIDDEN = 4403
#: Characters of a refused ``Origin`` header that reach the log.
MAX_LOGGED_ORIGIN = 120


async def refuse(receive: Any, send: Any, code: int) -> None:
    """Answer a WebSocket with close code ``code`` as the client can see it: accept the
    handshake, then close (a close before accepting is an HTTP 403 on the wire).
    Sends no frame; returns once the close is sent (or the client left first)."""
    message = await receive()
    if message.get("type") != "websocket.connect":
        return
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": code})


def shown_origin(raw: bytes) -> str:
    """An ``Origin`` header as it may appear in a log line: decoded (latin-1, as
    channels reads it), credentials redacted, control characters escaped, cut to
    :data:`MAX_LOGGED_ORIGIN` characters."""
    text = redact(raw[: 8 * MAX_LOGGED_ORIGIN].decode("latin-1"))
    text = text.encode("unicode_escape").decode("ascii")
    if len(text) > MAX_LOGGED_ORIGIN:
        text = text[:MAX_LOGGED_ORIGIN] + "..."
    return text


class OriginValidator(channels_websocket.OriginValidator):
    """Channels' ``OriginValidator(application, allowed_origins)``, refusing with a log
    line and close code 4403 (after accepting) instead of a silent HTTP 403.

    ``allowed_origins``: the same patterns as channels' (``"*"``,
    ``"https://example.com"``, ``".example.com"``, ...). Raises ``ValueError`` for a
    scope that is not a WebSocket, as channels' does.
    """

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if scope["type"] != "websocket":
            raise ValueError("You cannot use OriginValidator on a non-WebSocket connection")
        raw: bytes | None = None
        parsed = None
        for name, value in scope.get("headers", []):
            if name == b"origin":
                raw = value
                try:
                    parsed = urlparse(value.decode("latin1"))
                except (UnicodeDecodeError, ValueError):
                    parsed = None
        if self.valid_origin(parsed):
            return await self.application(scope, receive, send)
        if raw is None:
            logger.warning(
                "outbox: WebSocket to %s refused (4403): no Origin header",
                scope.get("path", "?"),
            )
        else:
            logger.warning(
                "outbox: WebSocket to %s refused (4403): Origin '%s' is not allowed",
                scope.get("path", "?"),
                shown_origin(raw),
            )
        await refuse(receive, send, CLOSE_FORBIDDEN)
        return None


def AllowedHostsOriginValidator(application: Any) -> OriginValidator:
    """Channels' ``AllowedHostsOriginValidator(application)``: an :class:`OriginValidator`
    allowing ``settings.ALLOWED_HOSTS`` (with ``DEBUG`` and no hosts: localhost,
    127.0.0.1 and [::1])."""
    allowed_hosts = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    return OriginValidator(application, allowed_hosts)
