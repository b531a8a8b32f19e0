"""Settings for worker processes started by tests (python -m django ... --settings)."""

import os

from tests.support.settings.base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.recorder"]  # noqa: F405
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
OUTBOX = {
    "DELIVERER": os.environ.get("OUTBOX_TEST_DELIVERER", "tests.support.agents.deliver"),
    "VERIFIER": "tests.support.agents.verify",
    "LOCK_TTL": float(os.environ.get("OUTBOX_TEST_LOCK_TTL", "30")),
    "RETRY_BACKOFF": float(os.environ.get("OUTBOX_TEST_RETRY_BACKOFF", "0.05")),
    "MAX_BACKOFF": float(os.environ.get("OUTBOX_TEST_MAX_BACKOFF", "0.2")),
    "VERIFY_DELAY": 0,
    "VERIFY_BACKOFF": 0.05,
    "MAX_VERIFY_BACKOFF": 0.2,
    "MAX_ATTEMPTS": 50,
    "MAX_TRANSIENT_FAILURES": 50,
    "ABORTER": os.environ.get("OUTBOX_TEST_ABORTER") or None,
}

if os.environ.get("OUTBOX_TEST_CHANNEL_LAYER"):
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [os.environ["OUTBOX_TEST_CHANNEL_LAYER"]]},
        }
    }
