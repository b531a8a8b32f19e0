"""The REST API's permission: an authenticated user whom ``OUTBOX["ACCESS_POLICY"]`` allows.

The policy is a callable ``(user, workspace_id, session_id, action) -> bool``, asked
through :func:`django_outbox.policy.is_allowed`; which action each endpoint needs is
in :data:`django_outbox.policy.ACCESS_TABLE` (docs/howto/access-policy.md), and
``session_id`` is None for the workspace actions. It is asked before Valkey is
touched, with identifiers already validated, so a refusal (403
``permission_denied``) is the same whether or not the workspace, session or entry
exists: it reveals nothing about stored data.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from ..policy import is_allowed


class OutboxAccessPolicy(BasePermission):
    """Grant a request when the user is authenticated and the access policy allows the
    view's action (one of :data:`django_outbox.policy.ACTIONS`) on its workspace and
    session.

    Anonymous users are refused the way DRF refuses them (401 with
    ``WWW-Authenticate`` when the first authentication class sends one, else 403
    ``not_authenticated``). The view supplies ``outbox_action(request)`` (None
    for a method it does not serve, which then answers 405) and
    ``outbox_target()`` -> ``(workspace_id, session_id)``, which raises
    :class:`~django_outbox.errors.InvalidIdentifier` for a malformed ID.
    """

    message = "The access policy does not allow this action here."
    code = "permission_denied"

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        action = view.outbox_action(request)
        if action is None:
            return True  # the view answers 405
        workspace_id, session_id = view.outbox_target()
        return is_allowed(user, workspace_id, session_id, action)
