"""The metering table: one row per run of :func:`tests.support.metering.receivers.meter`. No
constraint on it, so a second run for a delivery would show as a second row."""

from django.db import models


class Metering(models.Model):
    entry_id = models.CharField(max_length=128)
    delivered_at = models.CharField(max_length=40)
    pid = models.IntegerField()

    class Meta:
        app_label = "test_metering"

    def __str__(self) -> str:
        return f"{self.entry_id} metered by {self.pid}"
