"""Adds ``PendingAccept``: prompts accepted with ``accept_on_commit`` that have not moved into
the outbox yet (docs/howto/transactions.md)."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_outbox", "0004_outboxdashboard"),
    ]

    operations = [
        migrations.CreateModel(
            name="PendingAccept",
            fields=[
                (
                    "id",
                    models.AutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("workspace_id", models.CharField(max_length=128, verbose_name="workspace")),
                ("session_id", models.CharField(max_length=128, verbose_name="session")),
                (
                    "client_message_id",
                    models.CharField(max_length=128, verbose_name="clientMessageID"),
                ),
                (
                    "payload",
                    models.TextField(
                        help_text="The prompt as JSON: user_id, text, model, options."
                    ),
                ),
                (
                    "created",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(), db_index=True
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[
                            ("waiting", "waiting for its move"),
                            ("failed", "failed: staff decide"),
                        ],
                        default="waiting",
                        max_length=8,
                    ),
                ),
                (
                    "attempts",
                    models.PositiveIntegerField(
                        default=0,
                        help_text="Moves refused so far (a move that succeeds deletes the row).",
                    ),
                ),
                (
                    "next_attempt",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "last_error",
                    models.TextField(
                        blank=True,
                        default="",
                        help_text="Why the last move was refused.",
                        verbose_name="last refusal",
                    ),
                ),
            ],
            options={
                "verbose_name": "pending accept",
                "verbose_name_plural": "pending accepts",
                "default_permissions": (),
                "indexes": [
                    models.Index(fields=["state", "next_attempt"], name="django_outbox_pending_due")
                ],
            },
        ),
    ]
