"""The REST API's permission: an authenticated user whom ``OUTBOX["ACCESS_POLICY"]`` allows.

The policy is a callable ``(user, workspace_id, session_id, action) -> bool``, asked
through :func:`django_outbox.policy.is_allowed`; which action each endpoint needs is
in :data:`django_outbox.policy.ACCESS_TABLE` (docs/howto/access-policy.md), and
``session_id`` is None for the workspace actions. It is asked with identifiers already
validated. A policy of that form is asked before Valkey is touched, so a refusal (403
``permission_denied``, with the refused ``action``) is the same whether or not the
workspace, session or entry exists: it reveals nothing about stored data.

A policy that takes the keyword ``entry`` (:func:`~django_outbox.policy.takes_entry`) is
given the entry an action on one prompt is about (an
:class:`~django_outbox.policy.EntryRef`, read from the session first): the path's entry,
or the ``entryID`` a Stop names. When that entry is not stored, the policy is asked
``view`` of the session instead (``entry`` None): who may see the queue learns nothing
from the 404 or 409 that follows, and nothing is changed
(docs/howto/access-policy.md#one-persons-prompt).
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from ..outbox import get_outbox
from ..policy import ENTRY_ACTIONS, EntryRef, is_allowed, policy_takes_entry


class OutboxAccessPolicy(BasePermission):
    """Grant a request when the user is authenticated and the access policy allows the
    view's action (one of :data:`django_outbox.policy.ACTIONS`) on its workspace and
    session.

    Anonymous users are refused the way DRF refuses them (401 with
    ``WWW-Authenticate`` when the first authentication class sends one, else 403
    ``not_authenticated``). The view supplies ``outbox_action(request)`` (None
    for a method it does not serve, which then answers 405),
    ``outbox_target()`` -> ``(workspace_id, session_id)``, which raises
    :class:`~django_outbox.errors.InvalidIdentifier` for a malformed ID, and
    ``outbox_entry_id(request)``, the entry an action on one prompt names (None: none).
    A refusal's message names the action.
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
        self.message = refusal_message(action)
        if action not in ENTRY_ACTIONS or not policy_takes_entry():
            allowed = is_allowed(user, workspace_id, session_id, action)
        elif (entry_id := view.outbox_entry_id(request)) is None:  # a Stop naming no entry
            allowed = is_allowed(user, workspace_id, session_id, action)
        elif (entry := stored_entry(stored(request, workspace_id, session_id), entry_id)) is None:
            allowed = is_allowed(user, workspace_id, session_id, "view")
        else:
            allowed = is_allowed(user, workspace_id, session_id, action, entry=entry)
        if allowed and policy_takes_entry() and view.outbox_cuts(request):
            self.message = refusal_message("interrupt")
            return may_cut(request, view, workspace_id, session_id or "")
        return allowed


def may_cut(request: Any, view: Any, workspace_id: str, session_id: str) -> bool:
    """For a request that cuts the running turn besides its own action
    (``view.outbox_cuts``) under a policy that takes ``entry``: whether the policy allows
    ``interrupt`` of the entry in flight now (True when none is). Sets
    ``request.outbox_cut_only`` to that entry's ID (``""``: none), which the view passes as
    ``cut_only`` so that only that turn can be cut, whatever starts meanwhile
    (docs/howto/access-policy.md#one-persons-prompt)."""
    running = running_entry(stored(request, workspace_id, session_id))
    request.outbox_cut_only = running.id if running else ""
    if running is None:
        return True
    allowed = is_allowed(request.user, workspace_id, session_id, "interrupt", entry=running)
    request.outbox_refused_cut = not allowed  # the 403 names "interrupt"
    return allowed


def stored(request: Any, workspace_id: str, session_id: str) -> list[Any]:
    """The session's entries as stored now, read once per request (the entry an action is
    about and the one in flight come from the same read): one atomic read, texts cut on
    the server. Raises :class:`~django_outbox.errors.OutboxUnavailable` (503)."""
    entries: list[Any] | None = getattr(request, "outbox_stored", None)
    if entries is None:
        read = get_outbox().snapshots([(workspace_id, session_id)], preview_chars=1)[0]
        entries = request.outbox_stored = list(read.entries)
    return entries


def running_entry(entries: list[Any]) -> EntryRef | None:
    """The entry in flight among the session's stored ``entries`` (:func:`stored`): the one
    being delivered, else the first whose outcome is being verified, as a policy is given
    it; None when none is."""
    for status in ("delivering", "verifying"):
        for entry in entries:
            if str(entry.status) == status:
                return EntryRef.of(entry)
    return None


def refusal_message(action: str) -> str:
    """The ``detail`` of a 403 ``permission_denied``: it names the refused ``action``."""
    return f"The access policy does not allow {action!r} here."


def stored_entry(entries: list[Any], entry_id: str) -> EntryRef | None:
    """The entry ``entry_id`` among the session's stored ``entries`` (:func:`stored`:
    queued or in flight), as an access policy is given it; None when it is not there."""
    for entry in entries:
        if entry.id == entry_id:
            return EntryRef.of(entry)
    return None
