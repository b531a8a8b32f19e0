"""The demo's ``OUTBOX["ACCESS_POLICY"]``: workspace membership, and staff within their
Django model permissions (README "Access policy": this is the reference policy).

Two questions, kept apart:

- *Does the session belong to the workspace?* The outbox hands a prompt to the agent
  by session ID alone, so a policy that checked only the workspace would let a member
  of workspace A send prompts into workspace B's agent session by naming it under A.
  :func:`session_in_workspace` answers from :class:`~.models.AgentSession`, and
  :func:`~django_outbox.policy.session_scoped` asks it first, for every user.
- *May this user do this here?* Staff: what their model permissions allow, in every
  workspace, exactly as in the admin. Members of the workspace: ``MEMBER_ACTIONS``.
  Nobody else: nothing.
"""

from __future__ import annotations

from typing import Any

from django_outbox.policy import has_outbox_permission, session_scoped

from .models import AgentSession, Membership

#: What membership of a workspace allows (an allow-list: actions added later are refused).
MEMBER_ACTIONS = frozenset({"view", "accept", "retry", "dismiss", "interrupt"})


def session_in_workspace(workspace_id: str, session_id: str) -> bool:
    """True when ``session_id`` is an agent session made for ``workspace_id``."""
    return AgentSession.objects.filter(workspace_id=workspace_id, session_id=session_id).exists()


def is_member(user: Any, workspace_id: str) -> bool:
    """True when ``user`` (active, authenticated) is a member of ``workspace_id``."""
    if not (getattr(user, "is_active", False) and getattr(user, "is_authenticated", False)):
        return False
    return Membership.objects.filter(user=user, workspace_id=workspace_id).exists()


@session_scoped(session_in_workspace)
def workspace_members(user: Any, workspace_id: str, session_id: str | None, action: str) -> bool:
    """Staff: what their outbox permissions allow. Members of ``workspace_id``: view,
    accept, retry and dismiss in the workspace's own agent sessions. Nobody else:
    nothing. ``park`` and ``cleanup`` are for staff holding those permissions."""
    if has_outbox_permission(user, action):
        return True
    return action in MEMBER_ACTIONS and is_member(user, workspace_id)
