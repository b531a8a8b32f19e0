"""WebSocket routes: add ``websocket_urlpatterns`` to your ``URLRouter``."""

from django.urls import re_path

from .consumers import OutboxConsumer

websocket_urlpatterns = [
    re_path(
        r"^ws/outbox/workspaces/(?P<workspace_id>[^/]+)/sessions/(?P<session_id>[^/]+)/$",
        OutboxConsumer.as_asgi(),
    ),
]
