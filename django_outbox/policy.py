"""Who may do what: the access table, the default policy and the helpers
(docs/howto/access-policy.md).

An access policy is a callable ``(user, workspace_id, session_id, action) -> bool``,
set as ``OUTBOX["ACCESS_POLICY"]``; one that also takes a keyword ``entry`` is given the
entry an action is about (:class:`EntryRef`: its ID, author and status) for the actions on
one prompt (:data:`ENTRY_ACTIONS`), so it can let members act on their own prompts only
(:func:`takes_entry`). The REST API and the WebSocket ask it through
:func:`is_allowed`; the admin asks :func:`has_outbox_permission` (Django model
permissions). :data:`ACCESS_TABLE` is the one place that says which action each
REST endpoint, WebSocket frame and admin action needs, and which permission of
:class:`~django_outbox.models.OutboxEntry` grants it.

``session_id`` is given for every session action (``view``, ``accept``, ``retry``,
``dismiss``) and is None for the workspace operations, park/unpark and cleanup, which a
policy is asked as the one action ``operate`` (the contract since the first release);
:func:`current_operation` tells a policy which of the two it is, and the built-in policy
asks each its own permission (``park_workspace`` or ``cleanup_workspace``). The outbox
hands prompts to the agent by session ID alone, so a policy must check that the
session belongs to the workspace: :func:`session_scoped` does it, and a system check
(``W007``) warns about a policy that does not say it does. What a viewer reads of a
failed delivery follows the admin's rule too (:func:`reads_error_excerpts`).
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .conf import outbox_settings
from .core.transport import is_async_callable

logger = logging.getLogger("django_outbox.policy")

Policy = Callable[..., bool]

#: The attribute that says a policy checks that a session belongs to its workspace
#: (set by :func:`session_scoped`; read by system check ``W007``).
CHECKS_SESSION = "checks_session_in_workspace"
#: The attribute that says whether a policy takes the keyword ``entry`` (set by
#: :func:`session_scoped` on the policy it wraps; else read from the signature).
TAKES_ENTRY = "takes_entry"


@dataclass(frozen=True, slots=True)
class EntryRef:
    """The entry an action is about, as an access policy is given it (keyword ``entry``;
    docs/howto/access-policy.md#one-persons-prompt): ``id``; ``user_id``, its author (the
    ``userID`` its accept stored: the REST API stores the user's pk as a string, so
    ``entry.user_id == str(user.pk)`` is "the user's own prompt"); ``status`` as stored
    when the policy is asked (``pending``, ``delivering``, ``verifying``, ``error``,
    ``parked``, ``expired``). Never its text."""

    id: str
    user_id: str
    status: str

    @classmethod
    def of(cls, entry: Any) -> EntryRef:
        """The reference of an :class:`~django_outbox.core.entry.Entry`."""
        return cls(id=entry.id, user_id=entry.user_id, status=str(entry.status))


@dataclass(frozen=True, slots=True)
class AccessRow:
    """One action: its ``name``, the ``OutboxEntry`` permission codename that grants it
    (``view_outboxentry`` is needed besides, as in the admin), and where it is asked:
    REST routes as ``"METHOD route"`` (under the mount; HEAD is asked like GET), the
    WebSocket frames, and the admin's actions (function names in
    :mod:`django_outbox.admin.actions`)."""

    name: str
    permission: str
    rest: tuple[str, ...] = ()
    websocket: tuple[str, ...] = ()
    admin_actions: tuple[str, ...] = ()


_SESSION = "api/workspaces/<str:workspace_id>/sessions/<str:session_id>/messages/"
_ENTRY = _SESSION + "<str:entry_id>/"
_WORKSPACE = "api/workspaces/<str:workspace_id>/"

#: The access table (docs/howto/access-policy.md). The admin's pages (changelist, entry)
#: need ``view``; the admin never accepts prompts.
ACCESS_TABLE: tuple[AccessRow, ...] = (
    AccessRow(
        "view",
        "view_outboxentry",
        rest=(
            f"GET {_SESSION}",
            "GET api/workspaces/<str:workspace_id>/sessions/<str:session_id>/worker/",
        ),
        websocket=("connect", "resync"),
    ),
    AccessRow("accept", "add_outboxentry", rest=(f"POST {_SESSION}",)),
    AccessRow(
        "retry",
        "retry_outboxentry",
        rest=(f"POST {_ENTRY}retry/",),
        admin_actions=("retry_entries",),
    ),
    AccessRow(
        "dismiss",
        "dismiss_outboxentry",
        rest=(f"DELETE {_ENTRY}",),
        admin_actions=("dismiss_entries",),
    ),
    # Steering the queue (docs/howto/steering.md) asks for the permissions that already
    # say as much: editing a prompt is writing one (add), reordering is scheduling its
    # delivery (retry), cancelling a prompt is taking work away (dismiss). No new
    # permission rows, so no migration.
    AccessRow("edit", "add_outboxentry", rest=(f"PATCH {_ENTRY}",)),
    AccessRow("move", "retry_outboxentry", rest=(f"POST {_ENTRY}move/",)),
    AccessRow(
        "cancel",
        "dismiss_outboxentry",
        rest=(f"POST {_ENTRY}cancel/",),
        admin_actions=("cancel_entries",),
    ),
    AccessRow(
        "park",
        "park_workspace",
        rest=(f"POST {_WORKSPACE}park/", f"POST {_WORKSPACE}unpark/"),
        admin_actions=("park_workspaces", "unpark_workspaces"),
    ),
    AccessRow(
        "cleanup",
        "cleanup_workspace",
        rest=(f"DELETE {_WORKSPACE}",),
        admin_actions=("cleanup_workspaces",),
    ),
    # Cutting the running turn (docs/howto/cutting.md): whoever may send prompts into a
    # session may stop its turn, so it is granted with the accept permission.
    AccessRow(
        "interrupt",
        "add_outboxentry",
        rest=(
            "POST api/workspaces/<str:workspace_id>/sessions/<str:session_id>/interrupt/",
            f"POST {_ENTRY}send-now/",
        ),
        admin_actions=("cut_entries",),
    ),
)

#: Every action, in table order.
ACTIONS: tuple[str, ...] = tuple(row.name for row in ACCESS_TABLE)
#: The actions on a workspace as a whole: their ``session_id`` is None.
WORKSPACE_ACTIONS = frozenset({"park", "cleanup"})
#: What a policy is asked for each action: the workspace operations are all ``operate``.
POLICY_ACTION = {"park": "operate", "cleanup": "operate"}
#: The actions on one prompt: a policy that takes ``entry`` is given it (an
#: :class:`EntryRef`) for these; ``interrupt`` names one in ``send-now/``, in a Stop sent
#: with its ``entryID`` and in the admin's Stop, and none (``entry`` None) in a Stop sent
#: without.
ENTRY_ACTIONS = frozenset({"retry", "dismiss", "edit", "move", "cancel", "interrupt"})
_operation: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "outbox_operation", default=None
)


def current_operation() -> str | None:
    """While a policy is asked ``operate``: which workspace operation it is, ``"park"``
    (park or unpark) or ``"cleanup"``; None otherwise."""
    return _operation.get()


#: action -> the permissions (``"app_label.codename"``) it needs in the default policy.
PERMISSIONS: dict[str, tuple[str, ...]] = {
    row.name: tuple(
        dict.fromkeys(("django_outbox.view_outboxentry", f"django_outbox.{row.permission}"))
    )
    for row in ACCESS_TABLE
}


def has_outbox_permission(user: Any, action: str) -> bool:
    """True when ``user`` may do ``action`` in every workspace, as the admin would let
    it: an active staff account (the admin's own gate) holding ``PERMISSIONS[action]``
    (active superusers hold every permission). False for an unknown action."""
    if action == "operate":  # a policy asked for a workspace operation passes it on
        operation = current_operation()
        operations = (operation,) if operation else tuple(sorted(WORKSPACE_ACTIONS))
        return all(has_outbox_permission(user, op) for op in operations)
    needed = PERMISSIONS.get(action)
    if needed is None:
        return False
    if not (getattr(user, "is_active", False) and getattr(user, "is_staff", False)):
        return False
    has_perm = getattr(user, "has_perm", None)
    return has_perm is not None and all(has_perm(p) for p in needed)


def staff_only(user: Any, workspace_id: str, session_id: str | None, action: str) -> bool:
    """The default policy: Django model permissions (:func:`has_outbox_permission`), in
    every workspace; nobody else gets anything. It cannot know which sessions belong to
    which workspace: it suits operators only (system check ``W001``)."""
    return has_outbox_permission(user, action)


def reads_error_excerpts(user: Any) -> bool:
    """Whether ``user`` reads an entry's ``lastError`` as stored over REST and the
    WebSocket: the redacted excerpt of what failed, which may quote the agent's answer
    and name its internal URL. Everyone else reads a short text that holds nothing the
    agent wrote, beside ``errorKind`` and ``errorStatus`` (docs/explanation/security.md).
    The admin's own rule for viewing entries, whatever the access policy allows:
    :func:`has_outbox_permission` for ``view`` (an active staff account holding
    ``view_outboxentry``). False when asking fails."""
    try:
        return has_outbox_permission(user, "view")
    except Exception:
        logger.exception("outbox: cannot tell whether a user reads error excerpts; no")
        return False


def decision(answer: Any, what: str) -> bool:
    """A policy's ``answer`` as allowed (True) or refused. An awaitable is refused: an
    ``async def`` policy's coroutine is truthy whatever it would decide, so it must
    not count as a yes (fail closed; check ``django_outbox.E002`` names such a policy)."""
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()
        logger.error(
            "outbox: the %s returned an awaitable; it must be a plain function (it runs in a "
            "thread and may use the ORM); refused",
            what,
        )
        return False
    return bool(answer)


def takes_entry(policy: Any) -> bool:
    """Whether ``policy`` takes the keyword ``entry`` (a parameter named ``entry`` that
    may be passed by keyword, or ``**kwargs``): it is then called
    ``policy(user, workspace_id, session_id, action, entry=...)``, and the outbox reads
    the entry an action on one prompt is about before asking it. A policy of the first
    form, ``(user, workspace_id, session_id, action)``, is called as it always was: it
    cannot tell one member's prompt from another's (docs/howto/access-policy.md#upgrading).
    The mark
    :data:`TAKES_ENTRY` (set by :func:`session_scoped`) wins over the signature."""
    marked = getattr(policy, TAKES_ENTRY, None)
    if marked is not None:
        return bool(marked)
    try:
        parameters = inspect.signature(policy).parameters
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        return False
    named = parameters.get("entry")
    if named is not None and named.kind in (named.POSITIONAL_OR_KEYWORD, named.KEYWORD_ONLY):
        return True
    return any(p.kind is p.VAR_KEYWORD for p in parameters.values())


def session_scoped(
    session_in_workspace: Callable[[str, str], bool],
) -> Callable[[Policy], Policy]:
    """Decorator for a policy: refuse every session action (``session_id`` not None)
    whose session does not belong to the workspace, for every user, before the policy
    is asked. ``session_in_workspace(workspace_id, session_id) -> bool`` answers from the
    project's own records. Workspace actions (``park``, ``cleanup``) go straight to the
    policy. The result is marked for system check ``W007``, and passes ``entry`` on to a
    policy that takes it (:func:`takes_entry`)::

        @session_scoped(lambda ws, ses: AgentSession.objects.filter(
            workspace_id=ws, session_id=ses).exists())
        def may_use_outbox(user, workspace_id, session_id, action, entry=None): ...
    """

    if is_async_callable(session_in_workspace):
        raise TypeError("session_scoped needs a plain function, not an async one")

    def decorate(policy: Policy) -> Policy:
        if is_async_callable(policy):
            raise TypeError("an outbox access policy must be a plain function, not an async one")

        with_entry = takes_entry(policy)

        @functools.wraps(policy)
        def checked(
            user: Any,
            workspace_id: str,
            session_id: str | None,
            action: str,
            entry: EntryRef | None = None,
        ) -> bool:
            if session_id is not None and not decision(
                session_in_workspace(workspace_id, session_id), "session_in_workspace"
            ):
                return False
            extra = {"entry": entry} if with_entry else {}
            return decision(
                policy(user, workspace_id, session_id, action, **extra), "access policy"
            )

        setattr(checked, CHECKS_SESSION, True)
        setattr(checked, TAKES_ENTRY, with_entry)
        return checked

    return decorate


def configured_policy() -> Policy:
    """``OUTBOX["ACCESS_POLICY"]`` resolved (the default when unset). Raises
    ``ImproperlyConfigured`` when it does not import."""
    return outbox_settings().resolve("ACCESS_POLICY") or staff_only


def policy_takes_entry() -> bool:
    """Whether the configured policy :func:`takes_entry`: the surfaces then read the entry
    an action on one prompt is about before asking it. False when the policy does not
    import (:func:`is_allowed` refuses everything then)."""
    try:
        return takes_entry(configured_policy())
    except Exception:
        return False


def is_allowed(
    user: Any,
    workspace_id: str,
    session_id: str | None,
    action: str,
    *,
    entry: EntryRef | None = None,
) -> bool:
    """Ask the configured policy whether ``user`` may do ``action`` (one of
    :data:`ACTIONS`) on ``workspace_id`` / ``session_id`` (None for workspace actions),
    and, for an action on one prompt, on ``entry`` (passed to a policy that
    :func:`takes_entry`; docs/howto/access-policy.md#one-persons-prompt).

    Refused without asking: no user, an unauthenticated or inactive one, an unknown
    action, a workspace action with a session or a session action without one, an
    ``entry`` for an action not on one prompt. A policy that raises is logged and
    refuses. IDs must already be valid identifiers.
    """
    if user is None or not getattr(user, "is_authenticated", False):
        return False
    if not getattr(user, "is_active", True):
        return False
    if action not in ACTIONS or (action in WORKSPACE_ACTIONS) != (session_id is None):
        return False
    if entry is not None and action not in ENTRY_ACTIONS:
        return False
    try:
        policy = configured_policy()
        if policy is staff_only:  # the built-in policy tells park from cleanup
            return has_outbox_permission(user, action)
        extra = {"entry": entry} if takes_entry(policy) else {}
        token = _operation.set(action if action in WORKSPACE_ACTIONS else None)
        try:
            answer = policy(
                user, workspace_id, session_id, POLICY_ACTION.get(action, action), **extra
            )
        finally:
            _operation.reset(token)
        return decision(answer, "access policy")
    except Exception:
        logger.exception("outbox: the access policy failed (action %s); refused", action)
        return False
