"""Connects the receivers of :mod:`tests.support.dbwrites.receivers` when Django starts."""

from django.apps import AppConfig


class DbWritesConfig(AppConfig):
    name = "tests.support.dbwrites"
    label = "test_dbwrites"
    default_auto_field = "django.db.models.AutoField"

    def ready(self):
        from django_outbox.signals import entry_delivered

        from .receivers import awrite, write, write_once

        entry_delivered.connect(write, dispatch_uid="test-dbwrites-write")
        entry_delivered.connect(awrite, dispatch_uid="test-dbwrites-awrite")
        entry_delivered.connect(write_once, once=True)
