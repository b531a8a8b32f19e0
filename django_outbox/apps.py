"""The app's configuration: when Django starts, registers the system checks and
subscribes the WebSocket publisher to the outbox's events."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "django_outbox"
    label = "django_outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks, conf  # noqa: F401  (registers checks, connects setting_changed)
        from .ws import checks as ws_checks  # noqa: F401  (registers W018)
        from .ws import publish, revoke

        publish.subscribe()
        revoke.connect_signals()
