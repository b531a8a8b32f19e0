"""Settings for the WebSocket server process of tests/support/chaos.py."""

import os

from tests.support.settings.base import *  # noqa: F403

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": os.environ["OUTBOX_VALKEY_URL"], "socket_timeout": 30}],
            "capacity": 100,
            "expiry": 10,
        },
    }
}
# One staff user stands in for every client (hundreds of sockets): the per-user socket
# bound is off here and tested in tests/django/ws/test_refusals_on_servers.py.
OUTBOX = {"WS_MAX_SOCKETS_PER_USER": 0}
