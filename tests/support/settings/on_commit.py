"""Settings for the processes of tests/django/test_on_commit_processes.py: those of
tests/support/settings/worker.py (the recording agent), on the database that
``OUTBOX_TEST_DATABASE`` names (the JSON of one ``DATABASES`` entry: a SQLite file or the
test's PostgreSQL), with ``CAP`` from ``OUTBOX_TEST_CAP``."""

import json
import os

from tests.support.settings.worker import *  # noqa: F403

DATABASES = {"default": json.loads(os.environ["OUTBOX_TEST_DATABASE"])}
OUTBOX = {**OUTBOX, "CAP": int(os.environ.get("OUTBOX_TEST_CAP", "25"))}  # noqa: F405
