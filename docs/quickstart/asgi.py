"""mysite/asgi.py: HTTP through Django, the outbox's WebSocket through Channels."""

import os

# First, before anything that reads settings is imported.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")

from django.core.asgi import get_asgi_application

# Second: this sets Django up (settings, apps); what needs models is imported after it.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

# channels' validator that also logs why it refused a socket (and closes with 4403).
from django_outbox.ws import AllowedHostsOriginValidator  # noqa: E402
from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Keep the origin check: a session cookie alone would let another site's page
        # open the socket (cross-site WebSocket hijacking).
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
