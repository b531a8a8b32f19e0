"""One person's prompt over REST (docs/howto/access-policy.md#one-persons-prompt): a policy
that takes ``entry`` sees the prompt an action is about; under the documented member
policy a member acts on their own prompts only, and every edit, move, cancel and Stop
records who did it (docs/explanation/storage.md#who-changed-an-entry)."""

from __future__ import annotations

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox import get_outbox, policy
from django_outbox.signals import entry_updated
from example_project.demo.models import AgentSession, Membership

pytestmark = pytest.mark.django_db

WS, SES = "wo", "so"
BASE = f"/outbox/api/workspaces/{WS}/sessions/{SES}/"
MESSAGES = f"{BASE}messages/"
DEMO = {
    "ACCESS_POLICY": "example_project.demo.policy.workspace_members",
    "ABORTER": "tests.support.agents.abort",
}
#: The policy the documentation's sample writes, as a project would (its own module here).
SAMPLE = {**DEMO, "ACCESS_POLICY": "tests.django.api.test_own_prompts.sample_policy"}


def is_member(user, workspace_id):
    return Membership.objects.filter(user=user, workspace_id=workspace_id).exists()


def session_in_workspace(workspace_id, session_id):
    return AgentSession.objects.filter(workspace_id=workspace_id, session_id=session_id).exists()


@policy.session_scoped(session_in_workspace)
def sample_policy(user, workspace_id, session_id, action, entry=None):
    """docs/howto/access-policy.md's member policy, word for word."""
    if policy.has_outbox_permission(user, action):  # staff: their model permissions
        return True
    if not is_member(user, workspace_id):
        return False
    if action in {"retry", "dismiss", "edit", "move", "cancel", "interrupt"}:
        return entry is not None and entry.user_id == str(user.pk)  # their own prompt
    return action in {"view", "accept"}


def legacy(user, workspace_id, session_id, action):
    """A policy of the first form: four arguments, no ``entry``."""
    return getattr(user, "username", None) in ("alice", "bob")


@pytest.fixture
def people(django_user_model):
    AgentSession.objects.create(workspace_id=WS, session_id=SES, agent="fake")
    make = django_user_model.objects.create_user
    found = {}
    for name in ("alice", "bob"):
        found[name] = make(name, password=None)
        Membership.objects.create(user=found[name], workspace_id=WS)
    found["outsider"] = make("outsider", password=None)
    found["root"] = django_user_model.objects.create_superuser("root", password=None)
    return found


def client_of(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client


def accept(client, cmid: str) -> str:
    """The client's user accepts a prompt (as a member, under the demo policy)."""
    with override_settings(OUTBOX=DEMO):
        response = client.post(MESSAGES, {"clientMessageID": cmid, "text": cmid}, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def put_in_flight() -> str:
    """The head of the queue in flight under a live lease, as a worker leaves it."""
    outbox = get_outbox()
    kind, claimed, _ = outbox._run(outbox._claim_plan(WS, SES, "holder", []))
    assert kind == "deliver"
    return claimed.id


def stored() -> tuple[int, list[tuple[str, str, str, bool]]]:
    snapshot = get_outbox().snapshot(WS, SES)
    return snapshot.version, [
        (e.id, e.text, str(e.status), e.interrupted) for e in snapshot.entries
    ]


#: action on another member's prompt -> (method, path from the entry ID, body)
ON_ONE_PROMPT = {
    "edit": ("patch", lambda e: f"{MESSAGES}{e}/", {"text": "bob's words"}),
    "move": ("post", lambda e: f"{MESSAGES}{e}/move/", {"to": "last"}),
    "cancel": ("post", lambda e: f"{MESSAGES}{e}/cancel/", None),
    "retry": ("post", lambda e: f"{MESSAGES}{e}/retry/", None),
    "dismiss": ("delete", lambda e: f"{MESSAGES}{e}/", None),
    "send-now": ("post", lambda e: f"{MESSAGES}{e}/send-now/", None),
}
ACTION_OF = {"send-now": "interrupt"}


@pytest.mark.parametrize("settings_name", ["demo", "sample"])
@pytest.mark.parametrize("route", list(ON_ONE_PROMPT))
def test_a_member_is_refused_another_members_prompt_naming_the_action(people, route, settings_name):
    alice, bob = client_of(people["alice"]), client_of(people["bob"])
    accept(alice, "first")
    hers = accept(alice, "hers")
    method, path, body = ON_ONE_PROMPT[route]
    before = stored()
    with override_settings(OUTBOX=DEMO if settings_name == "demo" else SAMPLE):
        response = getattr(bob, method)(path(hers), body, format="json")
    assert response.status_code == 403, response.content
    action = ACTION_OF.get(route, route)
    data = response.json()
    assert (data["code"], data["action"]) == ("permission_denied", action)
    assert repr(action) in data["detail"]
    assert stored() == before


@pytest.mark.parametrize("settings_name", ["demo", "sample"])
def test_a_member_may_not_stop_another_members_turn_nor_a_turn_unnamed(people, settings_name):
    alice, bob = client_of(people["alice"]), client_of(people["bob"])
    hers = accept(alice, "hers")
    assert put_in_flight() == hers
    before = stored()
    with override_settings(OUTBOX=DEMO if settings_name == "demo" else SAMPLE):
        named = bob.post(f"{BASE}interrupt/", {"entryID": hers}, format="json")
        unnamed = bob.post(f"{BASE}interrupt/", format="json")
        cancel = bob.post(f"{MESSAGES}{hers}/cancel/")  # cancel of the one in flight cuts
    for response in (named, unnamed, cancel):
        assert response.status_code == 403, response.content
    assert [r.json()["action"] for r in (named, unnamed, cancel)] == [
        "interrupt",
        "interrupt",
        "cancel",
    ]
    assert stored() == before  # nothing cut


@override_settings(OUTBOX=DEMO)
def test_a_member_edits_moves_and_cancels_her_own_prompt_and_is_recorded(people):
    alice = people["alice"]
    client = client_of(alice)
    first, second = accept(client, "first"), accept(client, "second")
    me = f"user:{alice.pk}"
    response = client.patch(f"{MESSAGES}{first}/", {"text": "first, better"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["editedBy"] == me
    response = client.post(f"{MESSAGES}{first}/move/", {"to": "last"}, format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["movedBy"], response.json()["editedBy"]) == (me, me)
    cancelled = []

    def receiver(entry, state, **kwargs):
        cancelled.append((state, entry.id, entry.to_dict().get("cancelledBy")))

    entry_updated.connect(receiver)
    try:
        assert client.post(f"{MESSAGES}{second}/cancel/").status_code == 204
    finally:
        entry_updated.disconnect(receiver)
    assert cancelled == [("cancelled", second, me)]
    # What the author reads of her queue over REST names who changed it.
    [listed] = client.get(MESSAGES).json()["entries"]
    assert (listed["id"], listed["editedBy"], listed["movedBy"]) == (first, me, me)


@override_settings(OUTBOX=DEMO)
def test_a_member_stops_her_own_turn_and_the_stop_is_recorded(people):
    alice = people["alice"]
    client = client_of(alice)
    hers = accept(client, "hers")
    assert put_in_flight() == hers
    response = client.post(f"{BASE}interrupt/", {"entryID": hers}, format="json")
    assert (response.status_code, response.json()) == (202, {"result": "cut"})
    [listed] = client.get(MESSAGES).json()["entries"]
    assert (listed["interrupted"], listed["stoppedBy"]) == (True, f"user:{alice.pk}")


@override_settings(OUTBOX=DEMO)
def test_staff_act_on_anyones_prompt_under_their_own_name(people):
    alice, root = people["alice"], people["root"]
    hers = accept(client_of(alice), "hers")
    response = client_of(root).patch(f"{MESSAGES}{hers}/", {"text": "fixed"}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["userID"], data["editedBy"]) == (str(alice.pk), f"user:{root.pk}")


@override_settings(OUTBOX=DEMO)
def test_a_prompt_that_is_gone_answers_404_to_members_and_403_to_others(people):
    alice = client_of(people["alice"])
    hers = accept(alice, "hers")
    get_outbox().dismiss(WS, SES, hers)
    assert alice.post(f"{MESSAGES}{hers}/cancel/").status_code == 404
    response = alice.post(f"{BASE}interrupt/", {"entryID": hers}, format="json")
    assert (response.status_code, response.json()["code"]) == (409, "not_in_flight")
    response = client_of(people["outsider"]).post(f"{MESSAGES}{hers}/cancel/")
    assert (response.status_code, response.json()["action"]) == (403, "cancel")


def test_a_policy_of_the_first_form_is_asked_as_before(people):
    """Four arguments, no ``entry``: called as it always was, without the entry being read;
    it cannot tell one member's prompt from another's."""
    alice, bob = client_of(people["alice"]), client_of(people["bob"])
    hers = accept(alice, "hers")
    with override_settings(OUTBOX={"ACCESS_POLICY": "tests.django.api.test_own_prompts.legacy"}):
        response = bob.patch(f"{MESSAGES}{hers}/", {"text": "bob's words"}, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["editedBy"] == f"user:{people['bob'].pk}"
        refused = client_of(people["outsider"]).post(f"{MESSAGES}{hers}/cancel/")
    assert (refused.status_code, refused.json()["action"]) == (403, "cancel")


def test_which_policies_take_the_entry():
    def four(user, workspace_id, session_id, action):
        return True

    def keyword(user, workspace_id, session_id, action, *, entry):
        return True

    def anything(user, workspace_id, session_id, action, **kwargs):
        return True

    assert not policy.takes_entry(four)
    assert policy.takes_entry(keyword)
    assert policy.takes_entry(anything)
    assert policy.takes_entry(sample_policy)
    assert not policy.takes_entry(policy.session_scoped(session_in_workspace)(four))
    assert not policy.takes_entry(policy.staff_only)


@pytest.mark.parametrize("settings_name", ["demo", "sample"])
def test_a_member_may_not_cut_another_members_turn_with_her_own_prompt(people, settings_name):
    """Send-now and an accept with ``ifBusy: "interrupt"`` cut whatever turn runs: a member
    is refused them while another member's prompt is in flight, and nothing changes."""
    alice, bob = client_of(people["alice"]), client_of(people["bob"])
    hers = accept(alice, "hers")
    his = accept(bob, "his")
    assert put_in_flight() == hers
    before = stored()
    with override_settings(OUTBOX=DEMO if settings_name == "demo" else SAMPLE):
        now = bob.post(f"{MESSAGES}{his}/send-now/")
        interrupting = bob.post(
            MESSAGES, {"clientMessageID": "k", "text": "now", "ifBusy": "interrupt"}, format="json"
        )
    for response in (now, interrupting):
        assert response.status_code == 403, response.content
        assert response.json()["action"] == "interrupt"
    assert stored() == before  # nothing moved, cut or stored
    # Her own turn she may cut by sending her next prompt now.
    later = accept(alice, "later")
    with override_settings(OUTBOX=DEMO if settings_name == "demo" else SAMPLE):
        response = alice.post(f"{MESSAGES}{later}/send-now/")
    assert (response.status_code, response.json()) == (202, {"result": "cut"})


@override_settings(OUTBOX=DEMO)
def test_a_send_now_cuts_only_the_turn_it_was_allowed_to_cut(people):
    """``cut_only``: the turn is cut only while it is that entry's, checked and cut in one
    script; ``""`` cuts none. Whatever started since the policy was asked is not cut."""
    outbox = get_outbox()
    alice = client_of(people["alice"])
    hers, queued, other = accept(alice, "hers"), accept(alice, "queued"), accept(alice, "b")
    assert put_in_flight() == hers
    assert outbox.send_now(WS, SES, queued, cut_only=other).value == "moved"
    assert outbox.send_now(WS, SES, queued, cut_only="").value == "moved"
    assert [e[3] for e in stored()[1]] == [False, False, False]  # nothing cut
    assert outbox.send_now(WS, SES, other, cut_only=hers).value == "cut"
    with pytest.raises(ValueError):
        outbox.send_now(WS, SES, queued, cut_only="..")


@override_settings(OUTBOX=DEMO)
def test_an_accept_interrupting_cuts_only_the_turn_it_was_allowed_to_cut(people):
    outbox = get_outbox()
    alice = client_of(people["alice"])
    hers = accept(alice, "hers")
    assert put_in_flight() == hers
    _, result = outbox.accept_interrupting(
        WS, SES, user_id="1", client_message_id="x", text="x", cut_only="someone-else"
    )
    assert result.value == "moved"
    assert not get_outbox().snapshot(WS, SES).entries[0].interrupted
    with pytest.raises(ValueError):
        outbox.accept_interrupting(
            WS, SES, user_id="1", client_message_id="y", text="y", cut_only=".."
        )
    assert [e.text for e in outbox.snapshot(WS, SES).entries] == ["hers", "x"]
