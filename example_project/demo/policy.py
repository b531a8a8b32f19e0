"""The demo's ``OUTBOX["ACCESS_POLICY"]``: workspace membership, and staff within their
Django model permissions (README "Access policy": this is the reference policy).

Two questions, kept apart:

- *Does the session belong to the workspace?* The outbox hands a prompt to the agent
  by session ID alone, so a policy that checked only the workspace would let a member
  of workspace A send prompts into workspace B's agent session by naming it under A.
  :func:`session_in_workspace` answers from :class:`~.models.AgentSession`, and
  :func:`~django_outbox.policy.session_scoped` asks it first, for every user.
- *May this user do this here?* Staff: what their model permissions allow, in every
  workspace, exactly as in the admin. Members of the workspace: ``MEMBER_ACTIONS``, and
  ``OWN_PROMPT_ACTIONS`` on their own prompts only: the policy takes ``entry``, the prompt
  an action is about, and compares its author with the user
  (docs/howto/access-policy.md#one-persons-prompt). Nobody else: nothing.
"""

from __future__ import annotations

from typing import Any

from django_outbox.policy import EntryRef, has_outbox_permission, session_scoped

from .models import AgentSession, Membership

#: What membership of a workspace allows in its sessions (an allow-list: actions added
#: later are refused).
MEMBER_ACTIONS = frozenset({"view", "accept"})
#: What a member may do to a prompt of their own, and to nobody else's: retry, dismiss,
#: edit, move, cancel it, send it now, and Stop its turn (``interrupt`` naming it).
OWN_PROMPT_ACTIONS = frozenset({"retry", "dismiss", "edit", "move", "cancel", "interrupt"})


def session_in_workspace(workspace_id: str, session_id: str) -> bool:
    """True when ``session_id`` is an agent session made for ``workspace_id``."""
    return AgentSession.objects.filter(workspace_id=workspace_id, session_id=session_id).exists()


def is_member(user: Any, workspace_id: str) -> bool:
    """True when ``user`` (active, authenticated) is a member of ``workspace_id``."""
    if not (getattr(user, "is_active", False) and getattr(user, "is_authenticated", False)):
        return False
    return Membership.objects.filter(user=user, workspace_id=workspace_id).exists()


def is_own(user: Any, entry: EntryRef | None) -> bool:
    """True when ``entry`` is ``user``'s prompt: the REST API stores the accepting user's
    pk as its ``userID``. False for no entry (a Stop that names none)."""
    return entry is not None and entry.user_id == str(user.pk)


@session_scoped(session_in_workspace)
def workspace_members(
    user: Any,
    workspace_id: str,
    session_id: str | None,
    action: str,
    entry: EntryRef | None = None,
) -> bool:
    """Staff: what their outbox permissions allow, on anyone's prompts. Members of
    ``workspace_id``, in the workspace's own agent sessions: view and accept, and retry,
    dismiss, edit, move, cancel, send now and Stop (docs/howto/steering.md,
    docs/howto/cutting.md) their own prompts, never another member's. Nobody else:
    nothing. ``park`` and ``cleanup`` are for staff holding those permissions."""
    if has_outbox_permission(user, action):
        return True
    if not is_member(user, workspace_id):
        return False
    if action in OWN_PROMPT_ACTIONS:
        return is_own(user, entry)
    return action in MEMBER_ACTIONS
