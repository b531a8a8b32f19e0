"""Settings for the WebSocket server process of tests/chaos.py."""

import os

from tests.settings import *  # noqa: F403

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
