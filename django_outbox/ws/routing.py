"""WebSocket routes: ``websocket_urlpatterns``, to add to your ``URLRouter``.

docs/quickstart.md#asgipy shows the ``asgi.py`` that routes them.

One route, ``ws/outbox/workspaces/<workspace_id>/sessions/<session_id>/``, served by
:class:`django_outbox.ws.consumer.OutboxConsumer`. ``django_outbox.routing`` re-exports
the same list.
"""

from django.urls import re_path

from .consumer import OutboxConsumer

websocket_urlpatterns = [
    re_path(
        r"^ws/outbox/workspaces/(?P<workspace_id>[^/]+)/sessions/(?P<session_id>[^/]+)/$",
        OutboxConsumer.as_asgi(),
    ),
]
