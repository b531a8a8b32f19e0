"""A re-export of :mod:`django_outbox.ws.routing`, kept so existing ``asgi.py`` files work.

Projects written before the WebSocket code moved to :mod:`django_outbox.ws` import
``from django_outbox.routing import websocket_urlpatterns``; that keeps working and
gives the same list. New code may import from :mod:`django_outbox.ws.routing`.
"""

from .ws.routing import websocket_urlpatterns

__all__ = ["websocket_urlpatterns"]
