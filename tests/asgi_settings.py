"""Settings for an ASGI server process started by tests (a file database)."""

import os

from tests.settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["TEST_DB"]}}
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
OUTBOX = {"ACCESS_POLICY": "tests.policies.own_workspace", "CAP": 100}
