"""Settings for an ASGI server process started by tests (a file database)."""

import os

from tests.support.settings.base import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["TEST_DB"]}}
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
# alice stands in for many users (50 clients at once): the per-user bounds are off here
# and tested in tests/operations/test_user_bounds.py.
OUTBOX = {
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
    "CAP": 100,
    "USER_MAX_QUEUED": 0,
    "USER_ACCEPTS_PER_MINUTE": 0,
    "USER_ACCEPTS_PER_MINUTE_ALL": 0,
}
