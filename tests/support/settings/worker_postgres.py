"""Settings for worker processes on the PostgreSQL of tests/support/postgres.py: those of
tests/support/settings/worker.py, plus the dbwrites app (receivers writing through the ORM)
and ``DATABASES`` on database ``$OUTBOX_TEST_PG_NAME`` at ``127.0.0.1:$OUTBOX_TEST_PG_PORT``.
``OUTBOX_TEST_CONN_MAX_AGE`` sets ``CONN_MAX_AGE`` (seconds, or ``none`` for connections
kept for the life of the process; Django's default 0 when unset) and
``OUTBOX_TEST_CONN_HEALTH_CHECKS=1`` turns on ``CONN_HEALTH_CHECKS``."""

import os

from tests.support.postgres import SUPERUSER
from tests.support.settings.worker import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.dbwrites"]  # noqa: F405

_max_age = os.environ.get("OUTBOX_TEST_CONN_MAX_AGE", "0")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("OUTBOX_TEST_PG_NAME", "postgres"),
        "USER": SUPERUSER,
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("OUTBOX_TEST_PG_PORT", "5432"),
        "CONN_MAX_AGE": None if _max_age == "none" else int(_max_age),
        "CONN_HEALTH_CHECKS": os.environ.get("OUTBOX_TEST_CONN_HEALTH_CHECKS") == "1",
    }
}
