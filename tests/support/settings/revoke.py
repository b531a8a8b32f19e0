"""Settings of the ASGI server processes and the revoker child of
tests/django/ws/test_revocation_on_servers.py: ``tests.support.settings.live`` (a file
database, the channel layer in its own Valkey database, ``OUTBOX_TEST_WS``), plus DRF's
tokens and an access policy that reads a permission
(:func:`tests.support.asgi.revoke.watchers`).
"""

from tests.support.settings.live import *  # noqa: F403
from tests.support.settings.live import INSTALLED_APPS, OUTBOX

INSTALLED_APPS = [*INSTALLED_APPS, "rest_framework.authtoken"]
OUTBOX = {**OUTBOX, "ACCESS_POLICY": "tests.support.asgi.revoke.watchers"}
