"""The app's configuration: registers the system checks when Django starts."""

from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "django_outbox"
    label = "django_outbox"
    verbose_name = "Outbox"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        from . import checks, conf  # noqa: F401  (registers checks, connects setting_changed)
