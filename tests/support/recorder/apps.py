from django.apps import AppConfig


class RecorderConfig(AppConfig):
    """Records entry_delivered in Valkey so tests can count it across worker processes."""

    name = "tests.support.recorder"
    label = "test_recorder"

    def ready(self):
        from django_outbox.signals import entry_delivered
        from tests.support.agents import record_delivered

        entry_delivered.connect(record_delivered, dispatch_uid="test-recorder")
