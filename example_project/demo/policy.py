"""The demo's ``OUTBOX["ACCESS_POLICY"]``: workspace membership (staff may do everything)."""

from __future__ import annotations

from typing import Any

from .models import AgentSession, Membership


def workspace_members(user: Any, workspace_id: str, session_id: str | None, action: str) -> bool:
    """Staff: everything. Members of ``workspace_id``: view, accept, retry and dismiss in
    the workspace's own agent sessions. Nobody else: nothing. ``operate`` (park, unpark,
    cleanup) is staff only."""
    if not getattr(user, "is_active", False) or not getattr(user, "is_authenticated", False):
        return False
    if user.is_staff:
        return True
    if action == "operate":
        return False
    if not Membership.objects.filter(user=user, workspace_id=workspace_id).exists():
        return False
    if session_id is None:
        return True
    return AgentSession.objects.filter(workspace_id=workspace_id, session_id=session_id).exists()
