"""Who may use which workspace, and which agent sessions exist: what a real project keeps."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

identifier = RegexValidator(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$",
    "1 to 128 characters: ASCII letters, digits, '.', '_' and '-', starting alphanumeric.",
)


class Membership(models.Model):
    """``user`` may view, send, retry and dismiss in ``workspace_id`` (see ``policy.py``)."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="workspace_memberships"
    )
    workspace_id = models.CharField(max_length=128, validators=[identifier])

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "workspace_id"], name="unique_membership")
        ]
        ordering = ["workspace_id"]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace_id}"


class AgentSession(models.Model):
    """An opencode session (``ses_...``) made for a workspace; the outbox's session ID."""

    workspace_id = models.CharField(max_length=128, validators=[identifier])
    session_id = models.CharField(max_length=128, unique=True, validators=[identifier])
    title = models.CharField(max_length=200, blank=True)
    agent = models.CharField(max_length=20, help_text="fake or opencode")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        permissions = [
            # README "The demo": the fake agent's knobs are shared by every workspace.
            ("control_agent", "Can read every prompt count and change the fake agent's knobs"),
        ]

    def __str__(self) -> str:
        return self.title or self.session_id
