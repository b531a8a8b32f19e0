"""Connects the metering receivers (tests/support/metering/receivers.py) when Django starts."""

from django.apps import AppConfig


class MeteringConfig(AppConfig):
    name = "tests.support.metering"
    label = "test_metering"
    default_auto_field = "django.db.models.AutoField"

    def ready(self):
        from django_outbox.signals import entry_delivered

        from .receivers import linger, meter

        entry_delivered.connect(meter, once=True)
        entry_delivered.connect(linger, dispatch_uid="test-metering-linger")
