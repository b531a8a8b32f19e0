"""Settings for the WebSocket server process of tests/support/chaos.py."""

import os

from tests.support.settings.base import *  # noqa: F403

ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # max_connections: hundreds of sockets checked every 0.5 s (row 7) are a server
            # with thousands at the default WS_CHECK_INTERVAL, which docs/howto/valkey.md
            # tells to raise redis-py 8's pool bound of 100 (past it MaxConnectionsError,
            # and a handshake meeting that twice closes 4503)
            "hosts": [
                {
                    "address": os.environ["OUTBOX_VALKEY_URL"],
                    "socket_timeout": 30,
                    "max_connections": 500,
                }
            ],
            "capacity": 100,
            "expiry": 10,
        },
    }
}
# One staff user stands in for every client (hundreds of sockets): the per-user socket
# bound is off here and tested in tests/django/ws/test_refusals_on_servers.py.
OUTBOX = {"WS_MAX_SOCKETS_PER_USER": 0}
