"""The ASGI application of tests/django/ws/test_revocation_on_servers.py (settings
``tests.support.settings.revoke``): the test project over HTTP and the outbox WebSocket
behind ``AuthMiddlewareStack`` (a Django login session) around the documented token
middleware (:mod:`tests.support.ws_auth`), with an access policy that needs a permission.
"""

import os
import time

import redis
from channels.auth import AuthMiddlewareStack
from channels.routing import ProtocolTypeRouter, URLRouter
from django.core.asgi import get_asgi_application

django_app = get_asgi_application()

from django_outbox.policy import session_scoped  # noqa: E402
from django_outbox.ws.routing import websocket_urlpatterns  # noqa: E402
from tests.support.policies import any_session  # noqa: E402
from tests.support.ws_auth import TokenAuthMiddleware  # noqa: E402

#: The permission :func:`watchers` asks for (directly or through a group).
PERMISSION = "django_outbox.view_outboxentry"
#: ``test:slow:<username>`` in the outbox's Valkey: seconds the policy takes for that user.
SLOW = "test:slow:"
#: ``test:revoked:<username>``: the policy refuses that user.
REVOKED = "test:revoked:"
_valkey = redis.Redis.from_url(os.environ["OUTBOX_VALKEY_URL"])


@session_scoped(any_session)
def watchers(user, workspace_id, session_id, action):
    """An active user holding :data:`PERMISSION` may use the workspace named like them
    (after ``test:slow:<username>`` seconds; never while ``test:revoked:<username>``
    exists)."""
    name = getattr(user, "username", "")
    slow = _valkey.get(SLOW + name)
    if slow:
        time.sleep(float(slow))
    if _valkey.exists(REVOKED + name):
        return False
    return user.is_active and name == workspace_id and user.has_perm(PERMISSION)


application = ProtocolTypeRouter(
    {
        "http": django_app,
        "websocket": AuthMiddlewareStack(TokenAuthMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
