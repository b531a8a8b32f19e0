"""Settings of the ASGI server processes of tests/django/ws/test_staying_true_on_servers.py
(a file database, the channel layer in its own Valkey database, short live-update
intervals).

Environment: ``TEST_DB`` (sqlite file), ``OUTBOX_VALKEY_URL`` (the outbox),
``OUTBOX_TEST_LAYER_URL`` (the channel layer), ``OUTBOX_TEST_GROUP_EXPIRY`` (seconds,
default a day), ``OUTBOX_TEST_WS`` (``check,resync_interval,budget``: the three live
settings, default ``0.4,0.5,30``), ``OUTBOX_TEST_POLICY`` (the access policy, default
``tests.support.asgi.live.revocable``), ``OUTBOX_TEST_LAYER_SOCKET_TIMEOUT`` (seconds: the
channel layer's host as the README configures it, ``{"address": ..., "socket_timeout":
...}``; unset, a bare URL).
"""

import os

from tests.support.settings.base import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ["TEST_DB"]}}
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
_check, _interval, _budget = os.environ.get("OUTBOX_TEST_WS", "0.4,0.5,30").split(",")
OUTBOX = {
    "ACCESS_POLICY": os.environ.get("OUTBOX_TEST_POLICY", "tests.support.asgi.live.revocable"),
    "CAP": 100,
    "USER_MAX_QUEUED": 0,
    "USER_ACCEPTS_PER_MINUTE": 0,
    "USER_ACCEPTS_PER_MINUTE_ALL": 0,
    "WS_CHECK_INTERVAL": float(_check),
    "WS_RESYNC_INTERVAL": float(_interval),
    "WS_RESYNC_BUDGET": int(_budget),
}
_layer_host: str | dict = os.environ["OUTBOX_TEST_LAYER_URL"]
if os.environ.get("OUTBOX_TEST_LAYER_SOCKET_TIMEOUT"):
    _layer_host = {
        "address": _layer_host,
        "socket_timeout": float(os.environ["OUTBOX_TEST_LAYER_SOCKET_TIMEOUT"]),
    }
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [_layer_host],
            "group_expiry": int(os.environ.get("OUTBOX_TEST_GROUP_EXPIRY", "86400")),
            "capacity": 100,
            "expiry": 10,
        },
    }
}
