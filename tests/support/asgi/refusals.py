"""The outbox WebSocket behind a real ASGI server, for the close-code tests.

Served by uvicorn and daphne in ``tests/django/ws/test_refusals_on_servers.py`` with settings
``tests.support.settings.refusals``. The user comes from the cookie ``user`` (default
``alice``): an active, non-staff user whose primary key is the name, allowed by
``tests.support.policies.own_workspace`` into the workspace named like them. The WebSocket
routes sit behind :func:`django_outbox.ws.AllowedHostsOriginValidator`. HTTP:
``GET /?session=<name>`` is a page subscribing outbox.js to ``ws1``/``<name>`` (the
browser test's page, ``tests/support/asgi/close_codes.py``), ``GET /outbox.js`` the client.
"""

from __future__ import annotations

from http.cookies import SimpleCookie
from types import SimpleNamespace
from typing import Any

import django

django.setup()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from django_outbox.ws import AllowedHostsOriginValidator  # noqa: E402
from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402
from tests.support.asgi.close_codes import _http  # noqa: E402


def user_named(name: str) -> SimpleNamespace:
    """An active, non-staff user ``name`` (also its primary key)."""
    return SimpleNamespace(
        is_authenticated=True, is_active=True, is_staff=False, username=name, pk=name
    )


class CookieUser:
    """Sets ``scope["user"]`` from the ``user`` cookie (``alice`` without one)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        cookie = SimpleCookie()
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                cookie.load(value.decode("latin-1"))
        name = cookie["user"].value if "user" in cookie else "alice"
        return await self.inner({**scope, "user": user_named(name)}, receive, send)


async def http(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The browser test's page and outbox.js."""
    await _http(scope, send)


application = ProtocolTypeRouter(
    {
        "http": http,
        "websocket": AllowedHostsOriginValidator(CookieUser(URLRouter(websocket_urlpatterns))),
    }
)
