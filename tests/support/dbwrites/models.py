"""One row per call of a receiver of :mod:`tests.support.dbwrites.receivers` that succeeded."""

from django.db import models


class Write(models.Model):
    receiver = models.CharField(max_length=40)
    entry_id = models.CharField(max_length=128)

    class Meta:
        app_label = "test_dbwrites"

    def __str__(self) -> str:
        return f"{self.receiver} wrote {self.entry_id}"
