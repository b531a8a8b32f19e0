"""Settings for benchmark worker processes (DJANGO_SETTINGS_MODULE=bench.settings).

Environment: OUTBOX_VALKEY_URL (the server, or any node of a cluster), BENCH_DELIVERER,
BENCH_CONCURRENCY, BENCH_EVENTS (1: events on a channels-redis layer on that server; 0: no
channel layer), BENCH_CLUSTER (1: OUTBOX["CLUSTER"] = True, Valkey Cluster clients; needs
BENCH_EVENTS=0, since channels-redis does not support Valkey Cluster).
"""

import os

SECRET_KEY = "bench"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "channels", "django_outbox"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
cluster = os.environ.get("BENCH_CLUSTER", "0") == "1"
OUTBOX = {
    "DELIVERER": os.environ.get("BENCH_DELIVERER", "bench.agents.noop"),
    "ACCESS_POLICY": "django_outbox.policy.staff_only",
    "CAP": 10_000,
    # One synthetic user sends the whole load: no per-user bounds.
    "USER_MAX_QUEUED": 0,
    "USER_ACCEPTS_PER_MINUTE": 0,
    "USER_ACCEPTS_PER_MINUTE_ALL": 0,
    "CONCURRENCY": int(os.environ.get("BENCH_CONCURRENCY", "64")),
    "CLUSTER": cluster,
}
if os.environ.get("BENCH_EVENTS", "1") == "1":
    if cluster:
        raise RuntimeError("BENCH_CLUSTER=1 needs BENCH_EVENTS=0 (channels-redis has no cluster)")
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["OUTBOX_VALKEY_URL"]]},
        }
    }
LOGGING = {"version": 1, "root": {"level": "WARNING"}}
