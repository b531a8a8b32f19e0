"""Connects the receivers of :mod:`tests.support.dbwrites.receivers` when Django starts: those
``OUTBOX_TEST_DBWRITES`` names (comma-separated; default all three). ``write_once`` is
connected with ``once=True``."""

import os

from django.apps import AppConfig


class DbWritesConfig(AppConfig):
    name = "tests.support.dbwrites"
    label = "test_dbwrites"
    default_auto_field = "django.db.models.AutoField"

    def ready(self):
        from django_outbox.signals import entry_delivered

        from . import receivers

        wanted = os.environ.get("OUTBOX_TEST_DBWRITES", "write,awrite,write_once").split(",")
        for name in ("write", "awrite"):
            if name in wanted:
                fn = getattr(receivers, name)
                entry_delivered.connect(fn, dispatch_uid=f"test-dbwrites-{name}")
        if "write_once" in wanted:
            entry_delivered.connect(receivers.write_once, once=True)
