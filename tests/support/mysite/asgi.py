"""The project's ``asgi.py``: the outbox WebSocket behind the logging origin validator."""

from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter

from django_outbox.ws import AllowedHostsOriginValidator
from django_outbox.ws.routing import websocket_urlpatterns

application = ProtocolTypeRouter(
    {
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        )
    }
)
