"""The example project's access rules (README "The demo", "Security"): a session belongs to
its workspace, and the fake agent's knobs are for their users only.

The demo's policy (``example_project/demo/policy.py``) is the reference policy: it checks
that the session named in a request is an agent session of the workspace named with it,
for every user, before anything else. ``/demo/api/agent/`` shows a member only what
belongs to their workspaces and lets them arm faults only for their own sessions; the
shared knobs and every prompt count are for staff with ``demo.control_agent``.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox.outbox import get_outbox
from django_outbox.policy import session_scoped
from django_outbox.ws.routing import websocket_urlpatterns
from example_project.demo.models import AgentSession, Membership
from example_project.demo.policy import workspace_members
from example_project.fake_agent import FakeAgent
from example_project.fake_server import Turn

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.urls("example_project.urls"),
]

DEMO = {"ACCESS_POLICY": "example_project.demo.policy.workspace_members"}
LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
AGENT_API = "/demo/api/agent/"


def messages(ws: str, ses: str) -> str:
    return f"/outbox/api/workspaces/{ws}/sessions/{ses}/messages/"


@pytest.fixture
def demo(django_user_model):
    """Workspaces ``wa`` (session ``ses_a``) and ``wb`` (session ``ses_b``); ``alice`` is a
    member of ``wa``, ``bob`` of ``wb``, ``carol`` of both; ``root`` is a superuser."""
    make = django_user_model.objects.create_user
    AgentSession.objects.create(workspace_id="wa", session_id="ses_a", agent="fake")
    AgentSession.objects.create(workspace_id="wb", session_id="ses_b", agent="fake")
    users = {
        "alice": make("alice", password=None),
        "bob": make("bob", password=None),
        "carol": make("carol", password=None),
        "eve": make("eve", password=None),
        "root": django_user_model.objects.create_superuser("root", password=None),
        "staff": make("staff", password=None, is_staff=True),
    }
    Membership.objects.create(user=users["alice"], workspace_id="wa")
    Membership.objects.create(user=users["bob"], workspace_id="wb")
    Membership.objects.create(user=users["carol"], workspace_id="wa")
    Membership.objects.create(user=users["carol"], workspace_id="wb")
    with override_settings(OUTBOX=DEMO, CHANNEL_LAYERS=LAYERS):
        yield users


def client(user) -> APIClient:
    c = APIClient()
    if user is not None:
        c.force_login(user)
    return c


def prompt(key: str = "k1") -> dict:
    return {"clientMessageID": key, "text": "hi"}


# --- a session belongs to its workspace ------------------------------------------------------


@pytest.mark.parametrize("who", ["alice", "carol", "root"])
def test_nobody_sends_into_another_workspaces_session_by_naming_it_under_their_own(demo, r, who):
    """ses_b is wb's agent session: naming it under wa is refused (403, not 500), for a
    member of wa, a member of both, and a superuser alike; nothing is stored."""
    response = client(demo[who]).post(messages("wa", "ses_b"), prompt(), format="json")
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert r.dbsize() == 0


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", ""),
        ("head", ""),
        ("post", "e_1/retry/"),
        ("delete", "e_1/"),
    ],
)
def test_every_session_endpoint_checks_the_session(demo, method, path):
    entry = get_outbox().accept("wb", "ses_b", user_id="b", client_message_id="k", text="x")
    url = messages("wa", "ses_b") + path.replace("e_1", entry.id)
    assert getattr(client(demo["alice"]), method)(url).status_code == 403
    assert [e.id for e in get_outbox().list("wb", "ses_b")] == [entry.id]


def test_an_unknown_session_is_refused(demo, r):
    response = client(demo["alice"]).post(messages("wa", "ses_nobody"), prompt(), format="json")
    assert response.status_code == 403
    assert r.dbsize() == 0


def test_the_sessions_own_workspace_is_fine(demo):
    assert (
        client(demo["alice"]).post(messages("wa", "ses_a"), prompt(), format="json").status_code
        == 202
    )
    assert (
        client(demo["carol"]).post(messages("wb", "ses_b"), prompt(), format="json").status_code
        == 202
    )
    assert (
        client(demo["bob"]).post(messages("wa", "ses_a"), prompt(), format="json").status_code
        == 403
    )


def _ws_connect(user, ws: str, ses: str):
    async def run():
        comm = WebsocketCommunicator(
            URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{ws}/sessions/{ses}/"
        )
        comm.scope["user"] = user
        try:
            connected, _ = await comm.connect()
            assert connected  # a refusal accepts, then closes with its code
            output = await comm.receive_output(5)
            if output["type"] == "websocket.close":
                return False, output["code"]
            return True, None
        finally:
            await comm.disconnect()
            await get_outbox().aclose()

    return async_to_sync(run)()


def test_the_websocket_checks_the_session(demo):
    assert _ws_connect(demo["alice"], "wa", "ses_b") == (False, 4403)
    assert _ws_connect(demo["root"], "wa", "ses_b") == (False, 4403)
    assert _ws_connect(demo["alice"], "wa", "ses_a") == (True, None)


def test_the_policy_gets_both_ids_and_workspace_actions_none(demo):
    """What the adapters pass: (ws, ses) for session actions, (ws, None) for park and
    cleanup — which only staff with those permissions get."""
    alice, root = demo["alice"], demo["root"]
    assert workspace_members(alice, "wa", "ses_a", "view")
    assert not workspace_members(alice, "wa", "ses_b", "view")
    assert not workspace_members(alice, "wa", None, "operate")
    assert workspace_members(root, "wa", None, "operate")
    assert client(alice).post("/outbox/api/workspaces/wa/park/", {"reason": "x"}).status_code == 403
    assert client(alice).delete("/outbox/api/workspaces/wa/").status_code == 403


def test_session_scoped_asks_first_and_lets_workspace_actions_through():
    asked = []

    def policy(user, ws, ses, action):
        asked.append((ws, ses, action))
        return True

    checked = session_scoped(lambda ws, ses: (ws, ses) == ("wa", "ses_a"))(policy)
    assert checked(None, "wa", "ses_a", "accept") is True
    assert checked(None, "wa", "ses_b", "accept") is False
    assert checked(None, "wa", None, "operate") is True
    assert asked == [("wa", "ses_a", "accept"), ("wa", None, "operate")]
    assert checked.checks_session_in_workspace is True
    assert checked.__name__ == "policy"


def test_the_demo_transcript_and_sessions_endpoints_check_too(demo):
    alice = client(demo["alice"])
    assert alice.get("/demo/api/workspaces/wa/sessions/ses_b/transcript/").status_code == 403
    assert alice.get("/demo/api/workspaces/wb/sessions/").status_code == 403
    assert client(demo["staff"]).get("/demo/api/workspaces/wb/sessions/").status_code == 403


# --- the fake agent's knobs -------------------------------------------------------------------


@pytest.fixture
def agent(demo):
    """The demo's fake agent on a free port, served from a thread; the demo points at it."""
    fake = FakeAgent(state_path=None, password="pw", latency=0.01)
    fake.posts = {"wb's secret prompt": 2}
    fake.rules = []
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box = {}

    def serve():
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(fake.serve, "127.0.0.1", 0))
        box["url"] = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        ready.set()
        loop.run_forever()
        server.close()
        loop.run_until_complete(fake.close_connections())
        loop.run_until_complete(server.wait_closed())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        with override_settings(AGENT_KIND="fake", AGENT_URL=box["url"], AGENT_PASSWORD="pw"):
            yield fake
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def post(user, body) -> object:
    return client(user).post(AGENT_API, json.dumps(body), content_type="application/json")


def arm(fake: FakeAgent, **rule) -> None:
    from example_project.fake_agent import Rule

    fake.rules.append(Rule.parse({"action": "error", **rule}))


def test_a_logged_in_stranger_gets_nothing(demo, agent):
    eve = demo["eve"]
    assert client(eve).get(AGENT_API).status_code == 403
    assert post(eve, {"errorRate": 1}).status_code == 403
    assert post(eve, {"rules": [{"action": "error", "match": ""}]}).status_code == 403
    assert agent.error_rate == 0 and agent.rules == []
    assert client(None).get(AGENT_API).status_code == 403  # not logged in


def test_staff_without_the_permission_get_nothing(demo, agent):
    staff = demo["staff"]
    assert client(staff).get(AGENT_API).status_code == 403
    assert post(staff, {"latency": 500}).status_code == 403
    assert agent.latency == 0.01


def test_a_member_sees_only_their_sessions_and_no_prompt_counts(demo, agent):
    arm(agent, session="ses_b", match="b-only")
    arm(agent, session="ses_a", match="a-only")
    arm(agent, match="anyone")
    knobs = client(demo["alice"]).get(AGENT_API).json()
    assert "posts" not in knobs
    assert [r["match"] for r in knobs["rules"]] == ["a-only"]
    assert knobs["latency"] == 0.01


@pytest.mark.parametrize(
    "body",
    [
        {"latency": 500},
        {"errorRate": 1},
        {"cutRate": 1},
        {"clearRules": True},
        {"rules": [{"action": "error", "match": ""}]},  # every session
        {"rules": [{"action": "error", "session": "ses_b"}]},  # another workspace's
        {"rules": [{"action": "error", "session": "ses_a"}, {"action": "error"}]},
        {"rules": "not a list"},
    ],
)
def test_a_member_cannot_touch_other_peoples_deliveries(demo, agent, body):
    arm(agent, session="ses_b")
    response = post(demo["alice"], body)
    assert response.status_code == 403
    assert response.json()["code"] == "permission_denied"
    assert agent.latency == 0.01 and agent.error_rate == 0 and agent.cut_rate == 0
    assert [(r.session, r.action) for r in agent.rules] == [("ses_b", "error")]


def test_a_member_arms_a_fault_for_their_own_session_only(demo, agent):
    response = post(demo["alice"], {"rules": [{"action": "error", "session": "ses_a"}]})
    assert response.status_code == 200
    assert [r["session"] for r in response.json()["rules"]] == ["ses_a"]
    assert isinstance(agent.plan_turn("ses_b", "hello"), Turn)  # wb's prompt goes through
    assert not isinstance(agent.plan_turn("ses_a", "hello"), Turn)  # the 500 it armed


def test_staff_with_control_agent_see_and_change_everything(demo, agent):
    staff = demo["staff"]
    staff.user_permissions.add(Permission.objects.get(codename="control_agent"))
    knobs = client(staff).get(AGENT_API).json()
    assert knobs["posts"] == {"wb's secret prompt": 2}
    assert post(staff, {"latency": 0.5}).status_code == 200
    assert agent.latency == 0.5
    assert client(demo["root"]).get(AGENT_API).status_code == 200


def test_members_steer_their_own_prompts_only(db, django_user_model):
    """Members may edit, move, cancel and Stop their own prompts in their workspace's
    sessions (docs/howto/steering.md), never another member's, and nothing elsewhere."""
    from django_outbox.policy import EntryRef
    from example_project.demo.models import AgentSession, Membership

    alice = django_user_model.objects.create_user("alice-steer", password=None)
    bob = django_user_model.objects.create_user("bob-steer", password=None)
    for member in (alice, bob):
        Membership.objects.create(user=member, workspace_id="wsteer")
    AgentSession.objects.create(workspace_id="wsteer", session_id="ses_s")
    hers = EntryRef(id="e1", user_id=str(alice.pk), status="pending")
    for action in ("edit", "move", "cancel", "retry", "dismiss", "interrupt"):
        assert workspace_members(alice, "wsteer", "ses_s", action, entry=hers)
        assert not workspace_members(bob, "wsteer", "ses_s", action, entry=hers)
        assert not workspace_members(alice, "other", "ses_s", action, entry=hers)
        assert not workspace_members(alice, "wsteer", "ses_s", action)  # names no prompt
