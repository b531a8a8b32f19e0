"""Settings for benchmark worker processes (DJANGO_SETTINGS_MODULE=bench.settings)."""

import os

SECRET_KEY = "bench"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "channels", "django_outbox"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
OUTBOX = {
    "DELIVERER": os.environ.get("BENCH_DELIVERER", "bench.agents.noop"),
    "ACCESS_POLICY": "django_outbox.policy.staff_only",
    "CAP": 10_000,
    "CONCURRENCY": int(os.environ.get("BENCH_CONCURRENCY", "64")),
}
if os.environ.get("BENCH_EVENTS", "1") == "1":
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["OUTBOX_VALKEY_URL"]]},
        }
    }
LOGGING = {"version": 1, "root": {"level": "WARNING"}}
