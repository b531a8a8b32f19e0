"""The ASGI application of tests/django/ws/test_staying_true_on_servers.py: the test project
over HTTP and the outbox WebSocket behind ``AuthMiddlewareStack`` (a Django login session),
with an access policy the test can revoke from outside the server (settings:
``tests.support.settings.live``)."""

import os

import redis
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from django_outbox.policy import session_scoped  # noqa: E402
from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402
from tests.support.policies import any_session, own_workspace  # noqa: E402

#: Set ``test:revoked:<username>`` in the outbox's Valkey to take a user's access away.
REVOKED = "test:revoked:"
_valkey = redis.Redis.from_url(os.environ["OUTBOX_VALKEY_URL"])


@session_scoped(any_session)
def revocable(user, workspace_id, session_id, action):
    """``tests.support.policies.own_workspace``, unless ``test:revoked:<username>`` exists."""
    if _valkey.exists(REVOKED + getattr(user, "username", "")):
        return False
    return own_workspace(user, workspace_id, session_id, action)


application = ProtocolTypeRouter(
    {"http": django_app, "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns))}
)
