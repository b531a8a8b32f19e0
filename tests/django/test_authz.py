"""Who may do what, on every surface: the authorisation matrix (README "Access policy",
"Security").

Users (anonymous, a non-member, a member, staff without permissions, staff with view
only, staff with view and park, a superuser) x every REST endpoint and method, the
WebSocket connect and resync, and every admin page and action — under the default
policy (``django_outbox.policy.staff_only``: Django model permissions) and under the
example project's workspace-membership policy; each expects the documented answer.
"""

from __future__ import annotations

import json

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client, RequestFactory, override_settings
from django.urls import reverse
from rest_framework.test import APIClient

from django_outbox import policy
from django_outbox.admin import OutboxEntryAdmin
from django_outbox.models import OutboxEntry
from django_outbox.outbox import get_outbox
from django_outbox.ws.routing import websocket_urlpatterns
from example_project.demo.models import AgentSession, Membership
from tests.support.ws_session import IN_MEMORY_LAYERS, connect_and_resync

pytestmark = pytest.mark.django_db

WS, SES = "wa", "ses_a"
DEFAULT = "django_outbox.policy.staff_only"
DEMO = "example_project.demo.policy.workspace_members"
POLICIES = {"default": DEFAULT, "demo": DEMO}
ROLES = ("anonymous", "nonmember", "member", "staff", "viewer", "parker", "superuser")
EVERYTHING = frozenset(
    {"view", "accept", "retry", "dismiss", "park", "cleanup", "cancel", "interrupt"}
)
#: A member under the demo policy, on a prompt someone else accepted (the seeded one).
MEMBER = frozenset({"view", "accept"})

#: policy -> role -> the actions it allows on (WS, SES); None: not authenticated.
ALLOWED: dict[str, dict[str, frozenset[str] | None]] = {
    "default": {
        "anonymous": None,
        "nonmember": frozenset(),
        "member": frozenset(),  # the default policy knows no members
        "staff": frozenset(),  # staff without permissions: nothing (was: everything)
        "viewer": frozenset({"view"}),
        "parker": frozenset({"view", "park"}),
        "superuser": EVERYTHING,
    },
    "demo": {
        "anonymous": None,
        "nonmember": frozenset(),
        "member": MEMBER,
        "staff": frozenset(),
        "viewer": frozenset({"view"}),
        "parker": frozenset({"view", "park"}),
        "superuser": EVERYTHING,
    },
}

CHANGELIST = "/admin/django_outbox/outboxentry/"
LOGIN = "/admin/login/"


def grant(user, *codenames: str) -> None:
    ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
    user.user_permissions.add(
        *Permission.objects.filter(content_type=ct, codename__in=list(codenames))
    )


@pytest.fixture
def people(django_user_model):
    make = django_user_model.objects.create_user
    member = make("member", password=None)
    Membership.objects.create(user=member, workspace_id=WS)
    viewer = make("viewer", password=None, is_staff=True)
    grant(viewer, "view_outboxentry")
    parker = make("parker", password=None, is_staff=True)
    grant(parker, "view_outboxentry", "park_workspace")
    AgentSession.objects.create(workspace_id=WS, session_id=SES, agent="fake")
    return {
        "anonymous": None,
        "nonmember": make("nonmember", password=None),
        "member": member,
        "staff": make("staff", password=None, is_staff=True),
        "viewer": viewer,
        "parker": parker,
        "superuser": django_user_model.objects.create_superuser("root", password=None),
    }


def api_client(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_login(user)
    return client


def seed():
    return get_outbox().accept(WS, SES, user_id="seed", client_message_id="k0", text="x")


def stored():
    return [(e.id, str(e.status)) for e in get_outbox().list(WS, SES)]


# --- REST ---------------------------------------------------------------------------------

MESSAGES = f"/outbox/api/workspaces/{WS}/sessions/{SES}/messages/"
WORKSPACE = f"/outbox/api/workspaces/{WS}/"

#: name -> (method, path (entry ID filled in), JSON body, action, status when allowed)
ENDPOINTS = {
    "list": ("get", lambda e: MESSAGES, None, "view", 200),
    "head": ("head", lambda e: MESSAGES, None, "view", 200),
    "accept": (
        "post",
        lambda e: MESSAGES,
        {"clientMessageID": "new", "text": "hi"},
        "accept",
        202,
    ),
    "retry": ("post", lambda e: f"{MESSAGES}{e}/retry/", None, "retry", 200),
    "dismiss": ("delete", lambda e: f"{MESSAGES}{e}/", None, "dismiss", 204),
    "park": ("post", lambda e: f"{WORKSPACE}park/", {"reason": "maint"}, "park", 200),
    "unpark": ("post", lambda e: f"{WORKSPACE}unpark/", {}, "park", 200),
    "cleanup": ("delete", lambda e: WORKSPACE, None, "cleanup", 200),
}


@pytest.mark.parametrize("policy_name", list(POLICIES))
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_rest_matrix(people, policy_name, role, endpoint):
    entry = seed()
    method, url, data, action, success = ENDPOINTS[endpoint]
    allowed = ALLOWED[policy_name][role]
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}):
        response = getattr(api_client(people[role]), method)(url(entry.id), data, format="json")
    if allowed is not None and action in allowed:
        assert response.status_code == success, response.content
        return
    assert response.status_code == 403, response.content
    if method != "head":
        expected = "not_authenticated" if allowed is None else "permission_denied"
        assert response.json()["code"] == expected
    assert stored() == [(entry.id, "pending")]  # a refusal changes nothing


# --- WebSocket ----------------------------------------------------------------------------


def ws_session(user, revoke=None) -> tuple[object, object]:
    """``connect_and_resync`` on this module's session; ``revoke`` runs before the resync."""
    return connect_and_resync(WS, SES, user, revoke)


@pytest.mark.parametrize("policy_name", list(POLICIES))
@pytest.mark.parametrize("role", ROLES)
def test_websocket_connect_and_resync_matrix(people, policy_name, role):
    allowed = ALLOWED[policy_name][role]
    with override_settings(
        OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}, CHANNEL_LAYERS=IN_MEMORY_LAYERS
    ):
        outcome = ws_session(people[role])
    if allowed is not None and "view" in allowed:
        assert outcome == ("snapshot", "snapshot")
    else:
        assert outcome == (4403, None)


def _revocations(people):
    def membership():
        Membership.objects.filter(user=people["member"]).delete()

    def permission():
        people["viewer"].user_permissions.clear()

    def deactivate():
        type(people["superuser"]).objects.filter(pk=people["superuser"].pk).update(is_active=False)

    return {"member": membership, "viewer": permission, "superuser": deactivate}


@pytest.mark.parametrize(
    ("policy_name", "role"),
    [("demo", "member"), ("default", "viewer"), ("demo", "viewer"), ("default", "superuser")],
)
def test_a_resync_asks_again_and_closes_4403_once_access_is_gone(people, policy_name, role):
    revoke = _revocations(people)[role]
    with override_settings(
        OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}, CHANNEL_LAYERS=IN_MEMORY_LAYERS
    ):
        assert ws_session(people[role], revoke) == ("snapshot", 4403)


# --- admin -------------------------------------------------------------------------------

#: admin action -> the policy action whose permission it needs
ADMIN_ACTIONS = {
    "retry_entries": "retry",
    "dismiss_entries": "dismiss",
    "park_workspaces": "park",
    "unpark_workspaces": "park",
    "cleanup_workspaces": "cleanup",
    "cancel_entries": "cancel",
    "cut_entries": "interrupt",
}


def admin_client(user) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def entry_page(entry_id: str) -> str:
    return reverse("admin:django_outbox_outboxentry_change", args=[quote(f"{WS}/{SES}/{entry_id}")])


@pytest.mark.parametrize("policy_name", list(POLICIES))
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("page", ["changelist", "entry"])
def test_admin_pages_matrix(people, policy_name, role, page):
    entry = seed()
    url = CHANGELIST if page == "changelist" else entry_page(entry.id)
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}):
        response = admin_client(people[role]).get(url)
    user = people[role]
    if user is None or not user.is_staff:
        assert response.status_code == 302 and response["Location"].startswith(LOGIN)
    elif "view" in ALLOWED["default"][role]:  # the admin never asks the access policy
        assert response.status_code == 200
    else:
        assert response.status_code == 403


@pytest.mark.parametrize("policy_name", list(POLICIES))
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("action", list(ADMIN_ACTIONS))
def test_admin_actions_matrix(people, policy_name, role, action):
    entry = seed()
    data = {"action": action, "_selected_action": [f"{WS}/{SES}/{entry.id}"], "post": "yes"}
    if action == "park_workspaces":
        data["reason"] = "maint"
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICIES[policy_name]}):
        response = admin_client(people[role]).post(CHANGELIST, data)
    user = people[role]
    if user is None or not user.is_staff:
        assert response.status_code == 302 and response["Location"].startswith(LOGIN)
        assert stored() == [(entry.id, "pending")]
    elif ADMIN_ACTIONS[action] in ALLOWED["default"][role]:
        assert response.status_code == 302 and response["Location"] == CHANGELIST
    else:
        assert response.status_code == 403
        assert stored() == [(entry.id, "pending")]


# --- one table, three surfaces ---------------------------------------------------------------


@pytest.mark.parametrize("role", ["staff", "viewer", "parker", "superuser"])
def test_the_default_policy_answers_what_the_admin_answers(people, role):
    user = people[role]
    request = RequestFactory().get(CHANGELIST)
    request.user = user
    model_admin = OutboxEntryAdmin(OutboxEntry, None)
    for action in ("view", "retry", "dismiss", "park", "cleanup", "cancel", "interrupt"):
        in_admin = getattr(model_admin, f"has_{action}_permission")(request)
        assert policy.staff_only(user, WS, None, action) is in_admin, action
        assert policy.staff_only(user, WS, SES, action) is in_admin, action


def test_the_table_names_every_rest_route_and_admin_action():
    from django.urls import get_resolver

    from django_outbox.admin import actions as admin_actions
    from django_outbox.api.base import OutboxAPIView

    def routes(patterns, prefix=""):
        for pattern in patterns:
            if hasattr(pattern, "url_patterns"):
                yield from routes(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), getattr(pattern.callback, "view_class", None)

    served = {
        (f"{method} {route}", action)
        for route, view in routes(get_resolver("django_outbox.urls").url_patterns)
        if view is not None and issubclass(view, OutboxAPIView)
        for method, action in view.actions.items()
    }
    assert len(served) == 13
    tabled = {(route, row.name) for row in policy.ACCESS_TABLE for route in row.rest}
    assert served == tabled
    for row in policy.ACCESS_TABLE:
        for name in row.admin_actions:
            assert list(getattr(admin_actions, name).allowed_permissions) == [row.name]
    assert {n for row in policy.ACCESS_TABLE for n in row.admin_actions} == set(ADMIN_ACTIONS)
    assert tuple(row.name for row in policy.ACCESS_TABLE) == policy.ACTIONS
    ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
    codenames = set(Permission.objects.filter(content_type=ct).values_list("codename", flat=True))
    assert {row.permission for row in policy.ACCESS_TABLE} == codenames


def test_an_unknown_action_is_refused_even_to_a_superuser(people):
    assert policy.has_outbox_permission(people["superuser"], "nope") is False
    assert policy.staff_only(people["superuser"], WS, SES, "nope") is False


def test_custom_policies_are_asked_operate_and_can_tell_park_from_cleanup(people):
    """The pinned contract: park, unpark and cleanup reach a policy as ``operate``;
    ``current_operation()`` (and has_outbox_permission with "operate") tell them apart."""
    seen = []

    def custom(user, workspace_id, session_id, action):
        seen.append((action, policy.current_operation()))
        return policy.has_outbox_permission(user, action)

    with override_settings(OUTBOX={"ACCESS_POLICY": custom}):
        parker = people["parker"]
        assert policy.is_allowed(parker, WS, None, "park") is True
        assert policy.is_allowed(parker, WS, None, "cleanup") is False
    assert seen == [("operate", "park"), ("operate", "cleanup")]
    assert policy.current_operation() is None
    # outside an operation, "operate" needs both permissions
    assert policy.has_outbox_permission(parker, "operate") is False
    assert policy.has_outbox_permission(people["superuser"], "operate") is True


def test_operate_outside_an_operation_needs_each_permission_and_sessions_name_none(
    people, django_user_model
):
    """Asked ``operate`` outside a workspace operation, a user needs park's permission and
    cleanup's: holding either alone is not enough. A session action is no workspace
    operation: ``current_operation()`` is None while a policy is asked it
    (docs/howto/access-policy.md)."""
    cleaner = django_user_model.objects.create_user("cleaner", password=None, is_staff=True)
    grant(cleaner, "view_outboxentry", "cleanup_workspace")
    assert policy.has_outbox_permission(cleaner, "cleanup") is True
    assert policy.has_outbox_permission(cleaner, "operate") is False
    seen = []

    def custom(user, workspace_id, session_id, action):
        seen.append((action, policy.current_operation()))
        return True

    with override_settings(OUTBOX={"ACCESS_POLICY": custom}):
        assert policy.is_allowed(people["viewer"], WS, SES, "view") is True
        assert policy.is_allowed(people["viewer"], WS, SES, "accept") is True
    assert seen == [("view", None), ("accept", None)]


def test_a_session_check_that_answers_an_awaitable_refuses():
    """``session_scoped``'s check must answer a plain yes or no: a coroutine (truthy
    whatever it would decide) refuses, as an ``async`` policy's does
    (docs/howto/access-policy.md)."""

    async def belongs(workspace_id, session_id):
        return False

    @policy.session_scoped(lambda ws, ses: belongs(ws, ses))
    def everyone(user, workspace_id, session_id, action):
        return True

    assert everyone(object(), WS, SES, "view") is False
    assert everyone(object(), WS, None, "park") is True


def test_an_inactive_or_non_staff_superuser_gets_nothing(people, django_user_model):
    root = django_user_model.objects.create_user("r2", is_superuser=True, is_staff=False)
    assert not any(policy.staff_only(root, WS, SES, a) for a in policy.ACTIONS)
    root.is_staff, root.is_active = True, False
    assert not any(policy.staff_only(root, WS, SES, a) for a in policy.ACTIONS)


async def _async_allow_nothing(user, workspace_id, session_id, action):
    return False


async def _async_allow_all(user, workspace_id, session_id, action):
    return True


@pytest.mark.parametrize("policy", [_async_allow_nothing, _async_allow_all])
def test_an_async_policy_is_refused_not_waved_through(policy, caplog):
    # An async def policy returns a coroutine, which is truthy: it used to allow everything.
    from django.contrib.auth.models import User

    from django_outbox.policy import is_allowed

    user = User(username="x", is_active=True)
    with override_settings(OUTBOX={"ACCESS_POLICY": policy}):
        assert is_allowed(user, "w1", "s1", "view") is False
    assert "returned an awaitable" in caplog.text


def test_an_async_policy_is_a_check_error():
    from django.core import checks

    with override_settings(OUTBOX={"ACCESS_POLICY": _async_allow_all}):
        found = [m for m in checks.run_checks(tags=["outbox"]) if m.id == "django_outbox.E002"]
    assert len(found) == 1 and "async" in found[0].msg


def test_session_scoped_refuses_async_parts():
    from django_outbox.policy import session_scoped

    with pytest.raises(TypeError):
        session_scoped(lambda ws, ses: True)(_async_allow_all)

    async def in_workspace(ws, ses):
        return True

    with pytest.raises(TypeError):
        session_scoped(in_workspace)


# --- the less-travelled rules ---------------------------------------------------------------

ACTION_PERMISSIONS = (
    "add_outboxentry",
    "retry_outboxentry",
    "dismiss_outboxentry",
    "park_workspace",
    "cleanup_workspace",
)


def test_every_action_permission_without_view_gives_nothing(people, django_user_model):
    """``view_outboxentry`` is needed besides each action's own permission, as in the
    admin: a staff user holding every action permission but not view gets nothing."""
    actor = django_user_model.objects.create_user("actor", password=None, is_staff=True)
    grant(actor, *ACTION_PERMISSIONS)
    assert not any(policy.has_outbox_permission(actor, a) for a in policy.ACTIONS)
    entry = seed()
    client = api_client(actor)
    for method, url, data, _action, _success in ENDPOINTS.values():
        response = getattr(client, method)(url(entry.id), data, format="json")
        assert response.status_code == 403, (method, url(entry.id))
    assert stored() == [(entry.id, "pending")]
    with override_settings(CHANNEL_LAYERS=IN_MEMORY_LAYERS):
        assert ws_session(actor) == (4403, None)
    grant(actor, "view_outboxentry")  # the same user with view: everything its permissions say
    actor = django_user_model.objects.get(pk=actor.pk)
    assert all(policy.has_outbox_permission(actor, a) for a in policy.ACTIONS)


def allow_everyone(user, workspace_id, session_id, action):
    """A custom policy that lets every authenticated user through: the outbox itself
    must still keep inactive users out."""
    return True


ALLOW_ALL_BACKEND = "django.contrib.auth.backends.AllowAllUsersModelBackend"


def test_an_inactive_user_kept_by_the_authentication_is_refused_over_rest(
    people, django_user_model
):
    """``AllowAllUsersModelBackend`` keeps an inactive user logged in: a custom policy
    that never looks at ``is_active`` must not let it in."""
    gone = django_user_model.objects.create_user("gone", password=None, is_active=False)
    entry = seed()
    with override_settings(
        AUTHENTICATION_BACKENDS=[ALLOW_ALL_BACKEND],
        OUTBOX={"ACCESS_POLICY": allow_everyone},
    ):
        client = APIClient()
        client.force_login(gone)
        for method, url, data, _action, _success in ENDPOINTS.values():
            response = getattr(client, method)(url(entry.id), data, format="json")
            assert response.status_code == 403, (method, url(entry.id))
        active = django_user_model.objects.create_user("active", password=None)
        client = APIClient()
        client.force_login(active)  # the same policy lets an active user in
        assert client.get(MESSAGES).status_code == 200
    assert stored() == [(entry.id, "pending")]


class TokenAuthMiddleware:
    """docs/howto/clients.md "Tokens on the WebSocket": ``scope["user"]`` from an
    ``Authorization: Token <username>`` header, with no look at ``is_active``."""

    def __init__(self, inner):
        self.inner = inner

    async def __call__(self, scope, receive, send):
        from channels.db import database_sync_to_async
        from django.contrib.auth import get_user_model

        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if header.startswith("Token "):
            name = header[6:].strip()
            user = await database_sync_to_async(
                lambda: get_user_model().objects.filter(username=name).first()
            )()
            if user is not None:
                scope = {**scope, "user": user}
        return await self.inner(scope, receive, send)


def ws_connect_with_token(username: str) -> object:
    """Connect through the token middleware; answer ``"snapshot"`` or the close code."""

    async def run():
        app = TokenAuthMiddleware(URLRouter(websocket_urlpatterns))
        comm = WebsocketCommunicator(
            app,
            f"/ws/outbox/workspaces/{WS}/sessions/{SES}/",
            headers=[(b"authorization", f"Token {username}".encode())],
        )
        try:
            connected, _ = await comm.connect()
            assert connected
            output = await comm.receive_output(5)
            if output["type"] == "websocket.close":
                return output["code"]
            return json.loads(output["text"])["type"]
        finally:
            await comm.disconnect()
            await get_outbox().aclose()

    return async_to_sync(run)()


def test_an_inactive_user_set_by_a_token_middleware_is_refused_on_the_websocket(
    people, django_user_model
):
    django_user_model.objects.create_user("gone", password=None, is_active=False)
    django_user_model.objects.create_user("active", password=None)
    with override_settings(
        OUTBOX={"ACCESS_POLICY": allow_everyone}, CHANNEL_LAYERS=IN_MEMORY_LAYERS
    ):
        assert ws_connect_with_token("gone") == 4403
        assert ws_connect_with_token("active") == "queue.snapshot"


def test_a_session_action_without_a_session_or_a_workspace_action_with_one_is_refused(people):
    """The shape of a question is checked before any policy is asked: ``view`` needs a
    session, ``park`` must not name one; even a policy that allows everything refuses."""
    root = people["superuser"]
    with override_settings(OUTBOX={"ACCESS_POLICY": allow_everyone}):
        assert policy.is_allowed(root, WS, SES, "view") is True
        assert policy.is_allowed(root, WS, None, "park") is True
        assert policy.is_allowed(root, WS, None, "view") is False
        assert policy.is_allowed(root, WS, SES, "park") is False
        assert policy.is_allowed(root, WS, SES, "cleanup") is False


@pytest.mark.parametrize("action", ["view", "retry", "park", "cleanup", "operate"])
def test_an_inactive_staff_account_holds_no_outbox_permission_whatever_its_backend_grants(action):
    """The admin's own gate is an *active* staff account: a backend that grants
    permissions to inactive users too (a rules backend, a token scheme) does not let a
    deactivated account act (docs/howto/access-policy.md)."""
    from types import SimpleNamespace

    def grants_all(perm: str) -> bool:
        return True

    active = SimpleNamespace(is_active=True, is_staff=True, has_perm=grants_all)
    inactive = SimpleNamespace(is_active=False, is_staff=True, has_perm=grants_all)
    assert policy.has_outbox_permission(active, action) is True
    assert policy.has_outbox_permission(inactive, action) is False
