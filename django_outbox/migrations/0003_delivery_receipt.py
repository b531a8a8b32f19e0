"""Adds ``DeliveryReceipt``: receipts of ``once=True`` receivers (docs/reference/signals.md)."""

import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0002_accept_permission"),
    ]

    operations = [
        migrations.CreateModel(
            name="DeliveryReceipt",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("entry_id", models.CharField(max_length=128)),
                ("delivered_at", models.CharField(max_length=40)),
                ("receiver", models.CharField(max_length=255)),
                ("created", models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
            ],
            options={
                "verbose_name": "delivery receipt",
                "verbose_name_plural": "delivery receipts",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("entry_id", "delivered_at", "receiver"),
                        name="django_outbox_receipt_once",
                    )
                ],
            },
        ),
    ]
