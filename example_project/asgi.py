"""ASGI entry point: HTTP through Django, WebSockets through Channels.

``uvicorn example_project.asgi:application`` (what ``python -m example_project.run``
starts). The outbox's WebSocket routes are authenticated by Django's session
(``AuthMiddlewareStack``) and refuse a missing or foreign origin with close code 4403
and a log line (``django_outbox.ws.AllowedHostsOriginValidator``).
Static files are served by Django's ASGI static handler so the demo needs no web
server in front; a real deployment would use WhiteNoise or its CDN instead.
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "example_project.settings")

from django.core.asgi import get_asgi_application

# Set up Django (apps, settings) before importing anything that touches models.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from django_outbox.ws import AllowedHostsOriginValidator  # noqa: E402
from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
