"""Adds ``add_outboxentry``: the permission to accept prompts (docs/howto/access-policy.md)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_outbox", "0001_initial")]

    operations = [
        migrations.AlterModelOptions(
            name="outboxentry",
            options={
                "default_permissions": (),
                "managed": False,
                "permissions": [
                    ("view_outboxentry", "Can view outbox entries"),
                    ("add_outboxentry", "Can accept prompts into the outbox"),
                    ("retry_outboxentry", "Can retry outbox entries"),
                    ("dismiss_outboxentry", "Can dismiss outbox entries"),
                    ("park_workspace", "Can park and unpark outbox workspaces"),
                    ("cleanup_workspace", "Can delete an outbox workspace's data"),
                ],
                "verbose_name": "outbox entry",
                "verbose_name_plural": "outbox entries",
            },
        ),
    ]
