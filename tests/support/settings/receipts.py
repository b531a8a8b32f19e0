"""Settings for worker processes with a ``once=True`` receiver: those of
tests/support/settings/worker.py, plus the metering app and a SQLite file every process shares
(``OUTBOX_TEST_DB``; WAL, ``BEGIN IMMEDIATE`` so concurrent writers wait their turn)."""

import os

from tests.support.settings.worker import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.metering"]  # noqa: F405
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("OUTBOX_TEST_DB", ":memory:"),
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
        },
    }
}
