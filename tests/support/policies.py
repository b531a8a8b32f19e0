"""Access policies for tests."""

from django_outbox.policy import session_scoped

MEMBER_ACTIONS = frozenset({"view", "accept", "retry", "dismiss", "interrupt"})


def any_session(workspace_id, session_id):
    """The tests keep no session records: a session belongs to the workspace naming it."""
    return True


@session_scoped(any_session)
def own_workspace(user, workspace_id, session_id, action):
    """Staff may do everything; an active user may view, accept, retry, dismiss and interrupt in the
    workspace named like them."""
    if not getattr(user, "is_active", False):
        return False
    if getattr(user, "is_staff", False):
        return True
    return action in MEMBER_ACTIONS and getattr(user, "username", None) == workspace_id


@session_scoped(any_session)
def own_workspace_steering(user, workspace_id, session_id, action):
    """:func:`own_workspace`, and the steering actions (cancel, edit, move) there too."""
    if action in ("cancel", "edit", "move"):
        return own_workspace(user, workspace_id, session_id, "accept")
    return own_workspace(user, workspace_id, session_id, action)


@session_scoped(any_session)
def all_but_interrupt(user, workspace_id, session_id, action):
    """Any active user may do everything in any workspace except ``interrupt`` (cutting a
    running turn): the rarer action's own check is then the only thing refusing it."""
    return getattr(user, "is_active", False) and action != "interrupt"
