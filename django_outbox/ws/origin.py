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

They compare an ``Origin`` as Django's CSRF check compares one
(``CsrfViewMiddleware``, ``CSRF_TRUSTED_ORIGINS``): scheme, host and port. A pattern with
a scheme (``"https://example.com"``, ``"https://example.com:8443"``, a
``CSRF_TRUSTED_ORIGINS`` entry, ``"https://*.example.com"``) must match all three; a bare
host pattern (``"example.com"``, ``".example.com"``, what ``ALLOWED_HOSTS`` holds) admits
that host only with the scheme and port the socket itself was opened on
(:func:`socket_origin`: a page at ``https://example.com`` may open
``wss://example.com/...``, not one at ``http://example.com`` or
``https://example.com:8443``). ``"*"`` admits every ``Origin`` (system check
``django_outbox.W011`` warns). Channels' own classes let another scheme or port of an
allowed host through.

Being subclasses, they satisfy the ``django_outbox.W008`` system check.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlparse

from channels.security import websocket as channels_websocket
from django.conf import settings
from django.utils.http import is_same_domain

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


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    """The first value of header ``name`` (lower case) in ``scope``, decoded as latin-1."""
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def _meta_header(meta_name: str) -> bytes:
    """``HTTP_X_FORWARDED_PROTO`` (a ``request.META`` name) as an ASGI header name."""
    return meta_name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")


def socket_origin(scope: dict[str, Any]) -> tuple[str, int]:
    """The origin a WebSocket was opened on, as ``(scheme, port)`` of the page that may
    open it: ``https`` for ``wss`` (or when ``SECURE_PROXY_SSL_HEADER`` says the proxy
    in front got TLS, as ``request.is_secure()`` reads it), else ``http``; the port of
    the ``Host`` header (``X-Forwarded-Host`` with ``USE_X_FORWARDED_HOST``), else the
    server's, else the scheme's default (443, 80)."""
    secure = scope.get("scheme") in ("wss", "https")
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if not secure and proxy:
        name, expected = proxy
        value = _header(scope, _meta_header(name))
        secure = value is not None and value.split(",", 1)[0].strip() == expected
    scheme = "https" if secure else "http"
    host = None
    if getattr(settings, "USE_X_FORWARDED_HOST", False):
        forwarded = _header(scope, b"x-forwarded-host")
        host = forwarded.split(",", 1)[0].strip() if forwarded else None
    host = host or _header(scope, b"host")
    port: int | None = None
    if host:
        try:
            port = urlparse(f"//{host}").port
        except ValueError:
            port = None
    elif scope.get("server"):
        port = scope["server"][1]
    return scheme, port or (443 if secure else 80)


def _host_of(pattern: str) -> str:
    """The host a scheme-less pattern names (``"example.com:8000"`` -> ``example.com``)."""
    return urlparse("//" + pattern).hostname or pattern


class OriginValidator(channels_websocket.OriginValidator):
    """Channels' ``OriginValidator(application, allowed_origins)``, refusing with a log
    line and close code 4403 (after accepting) instead of a silent HTTP 403, and
    comparing scheme, host and port (see the module's docstring).

    ``allowed_origins``: the same patterns as channels' (``"*"``,
    ``"https://example.com"``, ``".example.com"``, ...). Raises ``ValueError`` for a
    scope that is not a WebSocket, as channels' does.
    """

    def allows(self, scope: dict[str, Any], parsed: Any) -> bool:
        """Whether the parsed ``Origin`` (None: none, or not parseable) may open the
        socket of ``scope``: ``"*"`` admits anything; a pattern with a scheme needs the
        same scheme, host and port (a ``*.`` host: any subdomain); a bare host pattern
        needs its host (``.example.com``: and subdomains) and the scheme and port of
        :func:`socket_origin`."""
        if "*" in self.allowed_origins:
            return True
        if parsed is None or parsed.hostname is None:
            return False
        own_scheme, own_port = socket_origin(scope)
        origin_port = self.get_origin_port(parsed)
        for pattern in self.allowed_origins:
            if "://" in pattern:
                if self.match_allowed_origin(parsed, pattern.replace("://*.", "://.", 1)):
                    return True
            elif (
                parsed.scheme == own_scheme
                and origin_port == own_port
                and is_same_domain(parsed.hostname, _host_of(pattern))
            ):
                return True
        return False

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
        if self.allows(scope, parsed):
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
    127.0.0.1 and [::1]) on the socket's own scheme and port, and the origins of
    ``settings.CSRF_TRUSTED_ORIGINS`` — what Django's CSRF check lets post."""
    allowed_hosts = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed_hosts:
        allowed_hosts = ["localhost", "127.0.0.1", "[::1]"]
    trusted = [o for o in getattr(settings, "CSRF_TRUSTED_ORIGINS", []) if "://" in o]
    return OriginValidator(application, allowed_hosts + trusted)
