"""Access policies for tests."""


def own_workspace(user, workspace_id, session_id, action):
    """Staff may do everything; an active user may use the workspace named like them."""
    if not getattr(user, "is_active", False):
        return False
    if getattr(user, "is_staff", False):
        return True
    return action != "operate" and getattr(user, "username", None) == workspace_id
