"""An ASGI application with the outbox WebSocket, for fault scenarios (tests/support/chaos.py).

Every WebSocket client is treated as an active staff user holding every outbox
permission (no database needed);
settings come from ``tests.support.settings.ws``.
"""

from types import SimpleNamespace

from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402

STAFF = SimpleNamespace(
    is_authenticated=True,
    is_active=True,
    is_staff=True,
    username="chaos",
    pk=1,
    has_perm=lambda perm: True,
)


class StaffUser:
    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        return await self.inner({**scope, "user": STAFF}, receive, send)


application = ProtocolTypeRouter(
    {"http": django_app, "websocket": StaffUser(URLRouter(websocket_urlpatterns))}
)
