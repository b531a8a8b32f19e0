"""Settings of the ASGI servers of tests/django/ws/test_refusals_on_servers.py
(tests/support/asgi/refusals.py).

Environment: ``OUTBOX_VALKEY_URL`` (the outbox and the channel layer);
``OUTBOX_TEST_NO_LAYER=1`` leaves ``CHANNEL_LAYERS`` out; ``OUTBOX_TEST_MAX_SOCKETS``
is ``WS_MAX_SOCKETS_PER_USER`` (default 3).
"""

import os

from tests.support.settings.base import *  # noqa: F403

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
if os.environ.get("OUTBOX_TEST_NO_LAYER") != "1":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["OUTBOX_VALKEY_URL"]], "expiry": 10},
        }
    }
OUTBOX = {
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
    "WS_MAX_SOCKETS_PER_USER": int(os.environ.get("OUTBOX_TEST_MAX_SOCKETS", "3")),
}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_outbox": {"handlers": ["stderr"], "level": "INFO"}},
}
