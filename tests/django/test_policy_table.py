"""Who may do what, one row per action x kind of user x surface
(docs/howto/access-policy.md; the access table in :mod:`django_outbox.policy`).

Kinds of user: anonymous; an inactive superuser and an inactive member reaching the
outbox through an authentication that keeps inactive users (DRF's
``force_authenticate``, a WebSocket scope set by a token middleware,
``AllowAllUsersModelBackend`` in the admin); an active member of the workspace; a
member of another workspace; staff without permissions; staff with ``view_outboxentry``
only; staff with only the action's own permission (no ``view_outboxentry``); staff
with both; a superuser. Policies: the default (Django model permissions), the example
project's workspace membership, and a custom policy that allows everything (so that
only the outbox's own gates refuse). Surfaces: every REST route, the WebSocket
connect and its ``resync`` command, and every admin action. Each expects exactly
"allowed" or its refusal (403 ``not_authenticated``/``permission_denied``, close 4403,
the admin's login page or 403), and a refusal changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client, override_settings
from django.utils.module_loading import import_string
from rest_framework.test import APIClient

from django_outbox import policy
from django_outbox.models import OutboxEntry
from django_outbox.outbox import get_outbox
from example_project.demo.models import AgentSession, Membership
from tests.support.ws_session import IN_MEMORY_LAYERS, connect_and_resync

pytestmark = pytest.mark.django_db

WS, SES, OTHER_WS, FOREIGN_SES = "wp", "sp", "wq", "sq"


def allow_everything(user: Any, workspace_id: str, session_id: str | None, action: str) -> bool:
    """A custom policy that says yes to every question it is asked."""
    return True


#: The policy :func:`switchable` asks (changed while a socket is open, with no settings
#: change that would replace the outbox under the socket).
_DELEGATE: list[Any] = [allow_everything]


def switchable(user: Any, workspace_id: str, session_id: str | None, action: str) -> bool:
    """A custom policy that answers what the policy now in :data:`_DELEGATE` answers."""
    return _DELEGATE[0](user, workspace_id, session_id, action)


POLICIES = {
    "default": "django_outbox.policy.staff_only",
    "demo": "example_project.demo.policy.workspace_members",
    "allow-all": "tests.django.test_policy_table.allow_everything",
}
KINDS = (
    "anonymous",
    "inactive-superuser",
    "inactive-member",
    "member",
    "other-workspace-member",
    "staff-no-permissions",
    "staff-view-only",
    "staff-action-permission-only",
    "staff-view-and-action-permission",
    "superuser",
)
ALL = frozenset(policy.ACTIONS)
NONE: frozenset[str] = frozenset()
VIEW = frozenset({"view"})
#: A member under the demo policy, on a prompt someone else accepted (the seeded one): the
#: session's queue only; the actions on one prompt are for its author (and a Stop that
#: names no prompt cuts whosever turn runs: refused too).
MEMBER = frozenset({"view", "accept"})
STAFF = {
    "staff-no-permissions": NONE,
    "staff-view-only": VIEW,
    # without view_outboxentry only the view action (whose permission it is) is granted
    "staff-action-permission-only": VIEW,
    "staff-view-and-action-permission": ALL,
    "superuser": ALL,
}

#: policy -> kind -> the actions allowed on (WS, SES); None: not authenticated.
ALLOWED: dict[str, dict[str, frozenset[str] | None]] = {
    "default": {
        "anonymous": None,
        "inactive-superuser": NONE,
        "inactive-member": NONE,
        "member": NONE,  # the default policy knows no members
        "other-workspace-member": NONE,
        **STAFF,
    },
    "demo": {
        "anonymous": None,
        "inactive-superuser": NONE,
        "inactive-member": NONE,
        "member": MEMBER,
        "other-workspace-member": NONE,
        **STAFF,
    },
    "allow-all": {
        "anonymous": None,
        "inactive-superuser": NONE,  # the outbox refuses an inactive user itself
        "inactive-member": NONE,
        **{kind: ALL for kind in KINDS[3:]},
    },
}


#: The permission each action needs besides ``view_outboxentry`` (written out, not read
#: from the access table, so that a wrong row there shows here).
PERMISSION = {
    "view": "view_outboxentry",
    "accept": "add_outboxentry",
    "retry": "retry_outboxentry",
    "dismiss": "dismiss_outboxentry",
    "edit": "add_outboxentry",
    "move": "retry_outboxentry",
    "cancel": "dismiss_outboxentry",
    "park": "park_workspace",
    "cleanup": "cleanup_workspace",
    "interrupt": "add_outboxentry",
}


def permission_of(action: str) -> str:
    return PERMISSION[action]


def grant(user: Any, *codenames: str) -> None:
    ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
    user.user_permissions.add(
        *Permission.objects.filter(content_type=ct, codename__in=list(codenames))
    )


def make_user(kind: str, action: str) -> Any:
    """A real user of ``kind``, its permissions chosen for ``action``; None: anonymous."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    AgentSession.objects.get_or_create(workspace_id=WS, session_id=SES, agent="fake")
    AgentSession.objects.get_or_create(workspace_id=OTHER_WS, session_id=FOREIGN_SES, agent="f")
    if kind == "anonymous":
        return None
    if kind in ("superuser", "inactive-superuser"):
        return users.create_superuser(kind, password=None, is_active=kind == "superuser")
    if kind in ("member", "inactive-member", "other-workspace-member"):
        user = users.create_user(kind, password=None, is_active=kind != "inactive-member")
        Membership.objects.create(
            user=user, workspace_id=OTHER_WS if kind.startswith("other") else WS
        )
        return user
    user = users.create_user(kind, password=None, is_staff=True)
    grant(
        user,
        *{
            "staff-no-permissions": (),
            "staff-view-only": ("view_outboxentry",),
            "staff-action-permission-only": (permission_of(action),),
            "staff-view-and-action-permission": ("view_outboxentry", permission_of(action)),
        }[kind],
    )
    return user


def seed():
    return get_outbox().accept(WS, SES, user_id="seed", client_message_id="k0", text="x")


def stored() -> tuple[int, list[tuple[str, str, str]]]:
    snap = get_outbox().snapshot(WS, SES)
    return snap.version, [(e.id, str(e.status), e.text) for e in snap.entries]


# --- REST ---------------------------------------------------------------------------------

BASE = f"/outbox/api/workspaces/{WS}/"
MESSAGES = f"{BASE}sessions/{SES}/messages/"

#: route -> (method, path from the seeded entry's ID, JSON body, action, status when allowed)
ROUTES: dict[str, tuple[str, Callable[[str], str], Any, str, int]] = {
    "list": ("get", lambda e: MESSAGES, None, "view", 200),
    "list-head": ("head", lambda e: MESSAGES, None, "view", 200),  # asked as GET
    "worker": ("get", lambda e: f"{BASE}sessions/{SES}/worker/", None, "view", 200),
    "accept": ("post", lambda e: MESSAGES, {"clientMessageID": "n", "text": "hi"}, "accept", 202),
    "retry": ("post", lambda e: f"{MESSAGES}{e}/retry/", None, "retry", 200),
    "dismiss": ("delete", lambda e: f"{MESSAGES}{e}/", None, "dismiss", 204),
    "edit": ("patch", lambda e: f"{MESSAGES}{e}/", {"text": "new"}, "edit", 200),
    "move": ("post", lambda e: f"{MESSAGES}{e}/move/", {"to": "last"}, "move", 200),
    "cancel": ("post", lambda e: f"{MESSAGES}{e}/cancel/", None, "cancel", 204),
    "park": ("post", lambda e: f"{BASE}park/", {"reason": "maint"}, "park", 200),
    "unpark": ("post", lambda e: f"{BASE}unpark/", {}, "park", 200),
    "cleanup": ("delete", lambda e: BASE, None, "cleanup", 200),
    # no aborter is configured: an allowed cut answers 409 not_supported, never 403
    "interrupt": ("post", lambda e: f"{BASE}sessions/{SES}/interrupt/", None, "interrupt", 409),
    "send-now": ("post", lambda e: f"{MESSAGES}{e}/send-now/", None, "interrupt", 409),
}

REST_ROWS = {
    f"rest-{policy_name}-{kind}-{route}": (policy_name, kind, route)
    for policy_name in POLICIES
    for kind in KINDS
    for route in ROUTES
}


@pytest.mark.parametrize("row", list(REST_ROWS))
def test_rest(row):
    policy_name, kind, route = REST_ROWS[row]
    method, path, body, action, success = ROUTES[route]
    user = make_user(kind, action)
    entry = seed()
    client = APIClient()
    if user is not None:
        client.force_authenticate(user)  # as a token authentication: inactive users too
    before = stored()
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}):
        response = getattr(client, method)(path(entry.id), body, format="json")
    allowed = ALLOWED[policy_name][kind]
    if allowed is not None and action in allowed:
        assert response.status_code == success, response.content
        return
    assert response.status_code == 403, response.content
    if method != "head":
        code = "not_authenticated" if allowed is None else "permission_denied"
        assert response.json()["code"] == code
    assert stored() == before


#: Under the demo policy, a session of another workspace named under this one is
#: refused to everyone, a superuser too; the default policy cannot tell.
@pytest.mark.parametrize(
    ("policy_name", "kind", "status"),
    [
        ("demo", "superuser", 403),
        ("demo", "member", 403),
        ("default", "superuser", 200),
        ("allow-all", "member", 200),
    ],
    ids=["demo-superuser-refused", "demo-member-refused", "default-allowed", "allow-all-allowed"],
)
def test_rest_a_session_of_another_workspace(policy_name, kind, status):
    client = APIClient()
    client.force_authenticate(make_user(kind, "view"))
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}):
        response = client.get(f"{BASE}sessions/{FOREIGN_SES}/messages/")
    assert response.status_code == status, response.content


# --- WebSocket ----------------------------------------------------------------------------


def ws_session(user: Any, between: Callable[[], Any] | None = None) -> tuple[Any, Any]:
    """``connect_and_resync`` on this module's session."""
    return connect_and_resync(WS, SES, user, between)


CONNECT_ROWS = {
    f"ws-connect-{policy_name}-{kind}": (policy_name, kind)
    for policy_name in POLICIES
    for kind in KINDS
}


@pytest.mark.parametrize("row", list(CONNECT_ROWS))
def test_websocket_connect(row):
    policy_name, kind = CONNECT_ROWS[row]
    user = make_user(kind, "view")
    with override_settings(
        OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}, CHANNEL_LAYERS=IN_MEMORY_LAYERS
    ):
        outcome = ws_session(user)
    allowed = ALLOWED[policy_name][kind]
    if allowed is not None and "view" in allowed:
        assert outcome == ("snapshot", "snapshot")
    else:
        assert outcome == (4403, None)


#: The resync command asks again: connected while the custom policy allowed everything,
#: it is answered as the policy switched to now answers for this kind of user.
RESYNC_ROWS = {
    f"ws-resync-{policy_name}-{kind}": (policy_name, kind)
    for policy_name in POLICIES
    for kind in KINDS
    if kind != "anonymous" and not kind.startswith("inactive")
}


@pytest.mark.parametrize("row", list(RESYNC_ROWS))
def test_websocket_resync(row):
    policy_name, kind = RESYNC_ROWS[row]
    user = make_user(kind, "view")
    target = import_string(POLICIES[policy_name])
    everything = f"{__name__}.switchable"
    with override_settings(OUTBOX={"ACCESS_POLICY": everything}, CHANNEL_LAYERS=IN_MEMORY_LAYERS):
        try:
            outcome = ws_session(user, between=lambda: _DELEGATE.__setitem__(0, target))
        finally:
            _DELEGATE[0] = allow_everything
    allowed = ALLOWED[policy_name][kind]
    expected = "snapshot" if allowed is not None and "view" in allowed else 4403
    assert outcome == ("snapshot", expected)


DEACTIVATED = [
    ("default", "superuser"),
    ("demo", "superuser"),
    ("demo", "member"),
    ("allow-all", "superuser"),
    ("allow-all", "member"),
]


@pytest.mark.parametrize(
    ("policy_name", "kind"), DEACTIVATED, ids=[f"{p}-{k}" for p, k in DEACTIVATED]
)
def test_websocket_resync_after_the_user_is_deactivated(policy_name, kind):
    """A user deactivated while connected is refused at the next resync, whatever the
    policy would say (the outbox reads the user afresh and refuses an inactive one)."""
    user = make_user(kind, "view")
    assert "view" in (ALLOWED[policy_name][kind] or ())

    def deactivate():
        type(user).objects.filter(pk=user.pk).update(is_active=False)

    with override_settings(
        OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}, CHANNEL_LAYERS=IN_MEMORY_LAYERS
    ):
        assert ws_session(user, between=deactivate) == ("snapshot", 4403)


# --- admin --------------------------------------------------------------------------------

CHANGELIST = "/admin/django_outbox/outboxentry/"
LOGIN = "/admin/login/"
KEEPS_INACTIVE = "django.contrib.auth.backends.AllowAllUsersModelBackend"
ADMIN_ACTIONS = {name: row.name for row in policy.ACCESS_TABLE for name in row.admin_actions}
ADMIN_ROWS = {f"admin-{kind}-{name}": (kind, name) for kind in KINDS for name in ADMIN_ACTIONS}


@pytest.mark.parametrize("row", list(ADMIN_ROWS))
def test_admin_action(row):
    """The admin never asks the access policy: its own gate (active staff) and the
    default policy's permissions decide, under every configured policy."""
    kind, name = ADMIN_ROWS[row]
    action = ADMIN_ACTIONS[name]
    user = make_user(kind, action)
    entry = seed()
    before = stored()
    data = {"action": name, "_selected_action": [f"{WS}/{SES}/{entry.id}"], "post": "yes"}
    if name == "park_workspaces":
        data["reason"] = "maint"
    with override_settings(
        AUTHENTICATION_BACKENDS=[KEEPS_INACTIVE],
        OUTBOX={"ACCESS_POLICY": POLICIES["allow-all"]},
    ):
        client = Client()
        if user is not None:
            client.force_login(user, backend=KEEPS_INACTIVE)
        response = client.post(CHANGELIST, data)
    if user is None or not (user.is_active and user.is_staff):
        assert response.status_code == 302 and response["Location"].startswith(LOGIN)
    elif action in ALLOWED["default"][kind]:
        assert response.status_code == 302 and response["Location"] == CHANGELIST
        return
    else:
        assert response.status_code == 403
    assert stored() == before


# --- the policy's own gates, asked directly ----------------------------------------------


PERMISSION_ROWS = {
    f"has-outbox-permission-{kind}-{action}": (kind, action)
    for kind in KINDS
    for action in policy.ACTIONS
}


@pytest.mark.parametrize("row", list(PERMISSION_ROWS))
def test_has_outbox_permission(row):
    """The admin's rule, asked directly as a custom policy may ask it: active staff with
    the action's permissions; an inactive superuser gets nothing."""
    kind, action = PERMISSION_ROWS[row]
    user = make_user(kind, action)
    expected = ALLOWED["default"][kind]
    assert policy.has_outbox_permission(user, action) is (
        expected is not None and action in expected
    )


class GrantsWhateverTheAccountsState:
    """A permission backend that, like some third-party ones, grants permissions
    without looking at ``is_active`` (Django's ``ModelBackend`` does look)."""

    def authenticate(self, request: Any, **credentials: Any) -> None:
        return None

    def has_perm(self, user_obj: Any, perm: str, obj: Any = None) -> bool:
        return perm.startswith("django_outbox.")


@pytest.mark.parametrize("active", [True, False], ids=["active-staff", "inactive-staff"])
def test_has_outbox_permission_refuses_an_inactive_account_whatever_its_backend(active):
    """The admin's rule needs an active account itself: a backend that grants an
    inactive one its permissions does not let it act."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("s", password=None, is_staff=True)
    user.is_active = active
    backend = f"{__name__}.GrantsWhateverTheAccountsState"
    with override_settings(AUTHENTICATION_BACKENDS=[backend]):
        assert policy.has_outbox_permission(user, "retry") is active


def test_every_action_is_in_a_row():
    """The rows above cover every action the policy knows and every REST route of it."""
    assert {ROUTES[r][3] for r in ROUTES} == set(policy.ACTIONS) == set(PERMISSION)
    assert sum(len(row.rest) for row in policy.ACCESS_TABLE) == len(ROUTES) - 1  # HEAD
    assert set(ADMIN_ACTIONS) == {n for row in policy.ACCESS_TABLE for n in row.admin_actions}


@pytest.mark.parametrize(
    ("action", "session_id", "expected"),
    [
        ("view", SES, True),
        ("view", None, False),
        ("park", None, True),
        ("park", SES, False),
        ("cleanup", None, True),
        ("cleanup", SES, False),
        ("nope", SES, False),
        ("operate", None, False),
    ],
    ids=[
        "session-action-with-session",
        "session-action-without-session",
        "park-without-session",
        "park-with-session",
        "cleanup-without-session",
        "cleanup-with-session",
        "unknown-action",
        "operate-is-not-an-action",
    ],
)
def test_is_allowed_refuses_a_question_of_the_wrong_shape(action, session_id, expected):
    user = make_user("superuser", "view")
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICIES["allow-all"]}):
        assert policy.is_allowed(user, WS, session_id, action) is expected
