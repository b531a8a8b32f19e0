"""The REST endpoints that cut a turn: ``interrupt/`` and ``send-now/`` (docs/howto/cutting.md).

In-process for the refusals (no aborter, access, malformed IDs); through a live uvicorn
and an ``outbox_worker`` process for the cut itself: the request is answered by the web
process and carried out by the worker holding the lease.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox import get_outbox
from tests.support.disconnects import AUTH, asgi_server
from tests.support.valkey import wait_until
from tests.support.workers import Workers

pytestmark = pytest.mark.django_db

BASE = "/outbox/api/workspaces/alice/sessions/s1/"
ABORTER = "tests.support.agents.abort"


def _client(django_user_model, **flags) -> APIClient:
    client = APIClient()
    client.force_login(django_user_model.objects.create_user("alice", **flags))
    return client


@pytest.fixture
def alice(django_user_model):
    return _client(django_user_model)


def _accept(client, cmid: str, text: str) -> str:
    response = client.post(
        f"{BASE}messages/", {"clientMessageID": cmid, "text": text}, format="json"
    )
    assert response.status_code == 202, response.content
    return response.json()["id"]


OWN = {"ACCESS_POLICY": "tests.support.policies.own_workspace"}


@override_settings(OUTBOX=OWN)
def test_without_an_aborter_both_answer_409_not_supported_and_change_nothing(alice):
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    for url in (f"{BASE}interrupt/", f"{BASE}messages/{second}/send-now/"):
        response = alice.post(url)
        assert response.status_code == 409, response.content
        assert response.json()["code"] == "not_supported"
    assert [e.id for e in get_outbox().list("alice", "s1")] == [first, second]


@override_settings(OUTBOX={**OWN, "ABORTER": ABORTER})
def test_with_nothing_in_flight_stop_is_idle_and_send_now_only_moves(alice):
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    response = alice.post(f"{BASE}interrupt/")
    assert (response.status_code, response.json()) == (200, {"result": "idle"})
    response = alice.post(f"{BASE}messages/{second}/send-now/")
    assert (response.status_code, response.json()) == (200, {"result": "moved"})
    assert [e.id for e in get_outbox().list("alice", "s1")] == [second, first]
    assert alice.post(f"{BASE}messages/nope/send-now/").status_code == 404
    response = alice.post("/outbox/api/workspaces/alice/sessions/s%201/interrupt/")
    assert (response.status_code, response.json()["code"]) == (400, "invalid_identifier")


@override_settings(OUTBOX={**OWN, "ABORTER": ABORTER})
def test_a_turn_cut_before_answers_202_already_and_send_now_of_the_prompt_in_flight_409(alice):
    """A second Stop of the same turn is still being cut: 202 ``already`` (not 200, which
    says nothing was cut). Send-now of the prompt in flight is no queued prompt: 409
    ``busy``, not 404 (it is there)."""
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    outbox = get_outbox()
    kind, claimed, _ = outbox._run(outbox._claim_plan("alice", "s1", "holder", []))
    assert (kind, claimed.id) == ("deliver", first)  # in flight under a live lease
    response = alice.post(f"{BASE}interrupt/")
    assert (response.status_code, response.json()) == (202, {"result": "cut"})
    response = alice.post(f"{BASE}interrupt/")
    assert (response.status_code, response.json()) == (202, {"result": "already"})
    response = alice.post(f"{BASE}messages/{first}/send-now/")
    assert (response.status_code, response.json()["code"]) == (409, "busy")
    assert [e.id for e in outbox.list("alice", "s1")] == [first, second]


def _deliver_first_and_start_the_next(outbox) -> str:
    """The head is delivered (its turn ended) and the next prompt is claimed: in flight
    under a live lease, as a worker that goes straight on leaves the session. Returns the
    ID of the prompt in flight."""

    async def deliver_head():
        await outbox.adeliver_once("alice", "s1", deliverer=lambda entry, **kw: None)
        await outbox.aclose()

    asyncio.run(deliver_head())
    kind, claimed, _ = outbox._run(outbox._claim_plan("alice", "s1", "holder", []))
    assert kind == "deliver"
    return claimed.id


@override_settings(OUTBOX={**OWN, "ABORTER": ABORTER})
def test_a_stop_naming_a_prompt_whose_turn_ended_is_409_not_in_flight_and_cuts_nothing(alice):
    """A stale Stop over REST: the page showed "one" in flight and sends Stop with its ID; by
    then "one" was delivered and the worker runs "two". The answer is 409 ``not_in_flight``
    and "two" is not cut; a Stop naming "two" cuts it (docs/howto/cutting.md)."""
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    outbox = get_outbox()
    assert _deliver_first_and_start_the_next(outbox) == second
    response = alice.post(f"{BASE}interrupt/", {"entryID": first}, format="json")
    assert response.status_code == 409, response.content
    assert response.json()["code"] == "not_in_flight"
    assert "nothing was cut" in response.json()["detail"]
    [running] = outbox.list("alice", "s1")
    assert (running.id, running.interrupted) == (second, False)
    assert not outbox.client.exists(outbox.keys.cut("alice", "s1"))
    response = alice.post(f"{BASE}interrupt/", {"entryID": second}, format="json")
    assert (response.status_code, response.json()) == (202, {"result": "cut"})
    response = alice.post(f"{BASE}interrupt/", {"entryID": second}, format="json")
    assert (response.status_code, response.json()) == (202, {"result": "already"})
    assert outbox.list("alice", "s1")[0].interrupted


@override_settings(OUTBOX={**OWN, "ABORTER": ABORTER})
def test_a_stop_naming_a_queued_or_unknown_prompt_is_409_not_in_flight(alice):
    """Only the entry in flight can be stopped by name: a queued prompt behind it, one
    never seen, or any name while nothing is in flight answers 409 and cuts nothing; an
    ID that breaks the ID rule is a 400 before anything is read; an empty body keeps the
    old meaning."""
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    outbox = get_outbox()
    for name in (first, second, "never-seen"):  # nothing in flight
        response = alice.post(f"{BASE}interrupt/", {"entryID": name}, format="json")
        assert (response.status_code, response.json()["code"]) == (409, "not_in_flight")
    outbox._run(outbox._claim_plan("alice", "s1", "holder", []))  # "one" in flight
    for name in (second, "never-seen"):
        response = alice.post(f"{BASE}interrupt/", {"entryID": name}, format="json")
        assert (response.status_code, response.json()["code"]) == (409, "not_in_flight")
    for body in ({"entryID": ".."}, {"entryID": "a/b"}, {"entryID": 3}, {"entryID": None}, []):
        response = alice.post(f"{BASE}interrupt/", body, format="json")
        assert (response.status_code, response.json()["code"]) == (400, "invalid"), body
    assert not any(e.interrupted for e in outbox.list("alice", "s1"))
    response = alice.post(f"{BASE}interrupt/", {}, format="json")  # no entry: the old Stop
    assert (response.status_code, response.json()) == (202, {"result": "cut"})
    assert [e.interrupted for e in outbox.list("alice", "s1")] == [True, False]


@override_settings(OUTBOX={**OWN, "ABORTER": ABORTER})
def test_interrupt_needs_the_interrupt_action_in_the_workspace(django_user_model):
    bob = APIClient()
    bob.force_login(django_user_model.objects.create_user("bob"))
    response = bob.post(f"{BASE}interrupt/")
    assert (response.status_code, response.json()["code"]) == (403, "permission_denied")
    assert bob.post(f"{BASE}messages/x/send-now/").status_code == 403


@override_settings(
    OUTBOX={"ACCESS_POLICY": "tests.support.policies.all_but_interrupt", "ABORTER": ABORTER}
)
def test_stop_and_send_now_need_interrupt_itself_not_another_action(alice):
    """A user who may accept, move, cancel and edit but not ``interrupt`` can cut nothing:
    Stop, send-now and an interrupting accept answer 403 and change nothing."""
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    for url in (f"{BASE}interrupt/", f"{BASE}messages/{second}/send-now/"):
        response = alice.post(url)
        assert (response.status_code, response.json()["code"]) == (403, "permission_denied")
    assert (
        alice.post(f"{BASE}messages/{second}/move/", {"to": "next"}, format="json").status_code
        == 200
    )
    assert [e.id for e in get_outbox().list("alice", "s1")] == [second, first]


def _interrupting(client, cmid: str, text: str):
    body = {"clientMessageID": cmid, "text": text, "ifBusy": "interrupt"}
    return client.post(f"{BASE}messages/", body, format="json")


@override_settings(OUTBOX=OWN)
def test_an_interrupting_accept_without_an_aborter_is_409_and_stores_nothing(alice):
    first = _accept(alice, "k1", "one")
    response = _interrupting(alice, "k2", "now")
    assert (response.status_code, response.json()["code"]) == (409, "not_supported")
    assert [e.id for e in get_outbox().list("alice", "s1")] == [first]
    assert _accept(alice, "k2", "now")  # no marker was written: the key is free


@override_settings(OUTBOX={**OWN, "ABORTER": ABORTER})
def test_an_interrupting_accept_goes_ahead_of_the_queued_prompts(alice):
    first, second = _accept(alice, "k1", "one"), _accept(alice, "k2", "two")
    response = _interrupting(alice, "k3", "now")
    assert response.status_code == 202, response.content
    entry = response.json()
    assert (entry["status"], entry["mode"]) == ("pending", "interrupt")
    assert [e.id for e in get_outbox().list("alice", "s1")] == [entry["id"], first, second]
    again = _interrupting(alice, "k3", "now")  # a client's retry: the same entry
    assert (again.status_code, again.json()) == (200, {"id": entry["id"], "duplicate": True})
    assert [e.id for e in get_outbox().list("alice", "s1")] == [entry["id"], first, second]
    response = _interrupting(alice, "k4", "")  # bad input is a 400 before anything
    assert response.status_code == 400, response.content


def test_a_refused_interrupting_accept_is_409_not_supported_never_a_500():
    from django_outbox.api.errors import outbox_exception_handler
    from django_outbox.errors import CutNotSupported

    response = outbox_exception_handler(CutNotSupported("no aborter"), {})
    assert (response.status_code, response.data["code"]) == (409, "not_supported")


@pytest.mark.slow
@pytest.mark.standalone
def test_stop_and_send_now_through_a_live_server_cut_the_worker_s_turn(valkey, tmp_path, r):
    workers = Workers(
        valkey,
        tmp_path / "workers",
        OUTBOX_TEST_DELIVERER="tests.support.agents.deliver_until_aborted",
        OUTBOX_TEST_ABORTER=ABORTER,
    )
    (tmp_path / "workers").mkdir()
    with asgi_server(valkey, tmp_path / "web", OUTBOX_TEST_ABORTER=ABORTER) as server:
        with httpx.Client(base_url=server.base + BASE, headers={"Authorization": AUTH}) as http:
            ids = []
            for key, text in (("k1", "one"), ("k2", "two"), ("k3", "three")):
                answer = http.post("messages/", json={"clientMessageID": key, "text": text})
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])
            try:
                workers.start("--tick", "0.2")
                wait_until(lambda: r.sismember("test:sent", ids[0]), 30, message="no turn")
                # Send "three" now: the turn of "one" is cut, "three" goes before "two".
                answer = http.post(f"messages/{ids[2]}/send-now/")
                assert (answer.status_code, answer.json()) == (202, {"result": "cut"})
                wait_until(lambda: r.sismember("test:sent", ids[2]), 30, message=workers.logs)
                answer = http.post("interrupt/")  # Stop "three"
                assert (answer.status_code, answer.json()) == (202, {"result": "cut"})
                wait_until(lambda: r.sismember("test:sent", ids[1]), 30, message=workers.logs)
                assert http.post("interrupt/").status_code == 202  # Stop "two"
                wait_until(lambda: r.llen("test:delivered") == 3, 30, message=workers.logs)
            finally:
                workers.stop_all()
            assert r.lrange("test:log", 0, -1) == ["s1 one", "s1 three", "s1 two"]
            assert len(r.lrange("test:aborts", 0, -1)) >= 3
            listed = http.get("messages/").json()
            assert listed["entries"] == []


@pytest.mark.slow
@pytest.mark.standalone
def test_an_interrupting_accept_through_a_live_server_cuts_the_worker_s_turn(valkey, tmp_path, r):
    workers = Workers(
        valkey,
        tmp_path / "workers",
        OUTBOX_TEST_DELIVERER="tests.support.agents.deliver_until_aborted",
        OUTBOX_TEST_ABORTER=ABORTER,
    )
    (tmp_path / "workers").mkdir()
    with asgi_server(valkey, tmp_path / "web", OUTBOX_TEST_ABORTER=ABORTER) as server:
        with httpx.Client(base_url=server.base + BASE, headers={"Authorization": AUTH}) as http:
            ids = []
            for key, text in (("k1", "one"), ("k2", "two")):
                answer = http.post("messages/", json={"clientMessageID": key, "text": text})
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])
            try:
                workers.start("--tick", "0.2")
                wait_until(lambda: r.sismember("test:sent", ids[0]), 30, message="no turn")
                body = {"clientMessageID": "k3", "text": "three", "ifBusy": "interrupt"}
                answer = http.post("messages/", json=body)
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])
                assert answer.json()["mode"] == "interrupt"
                # The turn of "one" is cut and "three" goes before "two".
                wait_until(lambda: r.sismember("test:sent", ids[2]), 30, message=workers.logs)
                resent = http.post("messages/", json=body)  # a retry cuts nothing more
                assert (resent.status_code, resent.json()) == (
                    200,
                    {"id": ids[2], "duplicate": True},
                )
                assert http.post("interrupt/").status_code == 202  # Stop "three"
                wait_until(lambda: r.sismember("test:sent", ids[1]), 30, message=workers.logs)
                assert http.post("interrupt/").status_code == 202  # Stop "two"
                wait_until(lambda: r.llen("test:delivered") == 3, 30, message=workers.logs)
            finally:
                workers.stop_all()
            assert r.lrange("test:log", 0, -1) == ["s1 one", "s1 three", "s1 two"]
            listed = http.get("messages/").json()
            assert listed["entries"] == []
