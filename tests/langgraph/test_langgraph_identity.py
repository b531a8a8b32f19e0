"""The LangGraph backend's agent contract against a REAL ``langgraph dev``
(docs/howto/langgraph.md): the thread and run a prompt became are kept on the delivered
entry; each prompt's run options come from the app's hook, which sees the entry; the
worker's start asks the server whether it knows the assistant; and the thread of a session
carries the project's identity, so two projects on one server never share one, while an
upgraded deployment still finds the runs it made on its former threads.
"""

from __future__ import annotations

import asyncio
import io
import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_outbox import Verdict
from django_outbox.core.agents import Agent, probe_agents
from django_outbox.delivery import langgraph
from django_outbox.delivery.langgraph import (
    ENTRY_KEY,
    REQUEST_KEY,
    LangGraphClient,
    session_thread,
    thread_id_for,
)
from django_outbox.errors import AgentMisconfigured
from django_outbox.outbox import key_space_owner
from django_outbox.testing import free_port
from tests.support.helpers import WS, make_entry
from tests.support.langgraph_server import ASSISTANT, LangGraphServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lg = LangGraphServer(tmp_path_factory.mktemp("langgraph")).start()
    yield lg
    lg.stop()


def block(server, **more):
    return {"URL": server.url, "ASSISTANT_ID": ASSISTANT, "TIMEOUT": 30, **more}


def deliver(lg: LangGraphClient, entry, ses: str):
    return lg.deliver(entry, workspace_id=WS, session_id=ses, attempt=1)


# --- the thread and run on the delivered entry ----------------------------------------------


async def test_the_delivered_entry_names_its_thread_and_run(server, make_outbox, signals_log):
    lg = LangGraphClient(server.url, ASSISTANT, timeout=30.0)
    outbox = make_outbox(deliverer=lg.deliver, verifier=lg.verify)
    ses = "lg-ref"
    try:
        accepted = await outbox.aaccept(WS, ses, user_id="u", client_message_id="k", text="hi")
        assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()
        await lg.aclose()
    [(entry, kwargs)] = signals_log.calls["delivered"]
    [run] = server.runs(thread_id_for(WS, ses))
    assert entry.id == accepted.id and run["metadata"][ENTRY_KEY] == accepted.id
    expected = {"threadID": thread_id_for(WS, ses), "runID": run["run_id"]}
    assert entry.agent_ref == kwargs["agent_ref"] == expected
    assert entry.to_dict()["agentRef"] == expected


async def test_the_verifier_names_the_run_it_found(server):
    lg = LangGraphClient(server.url, ASSISTANT, timeout=30.0)
    entry, ses = make_entry("found later"), "lg-ref-verify"
    try:
        sent = await deliver(lg, entry, ses)
        found = await lg.verify(entry, workspace_id=WS, session_id=ses)
        absent = await lg.verify(make_entry("never sent"), workspace_id=WS, session_id=ses)
    finally:
        await lg.aclose()
    assert found == (Verdict.DELIVERED, sent)
    assert absent is Verdict.ABSENT


# --- per-prompt run options -----------------------------------------------------------------


def options_from_the_entry(entry, *, workspace_id, session_id):
    """A sync hook (run in a thread): the prompt's own options ride in its model."""
    tone = (entry.model or {}).get("tone", "plain")
    return {
        "context": {"tone": tone},
        "config": {"tags": [f"mode:{entry.mode}"]},
        "metadata": {"tone": tone, REQUEST_KEY: "forged", ENTRY_KEY: "forged"},
    }


async def test_each_prompt_gets_its_own_run_options_and_the_outbox_keys_stay(server, make_outbox):
    lg = LangGraphClient(server.url, ASSISTANT, timeout=30.0, run_options=options_from_the_entry)
    outbox = make_outbox(deliverer=lg.deliver, verifier=lg.verify)
    ses = "lg-options"
    try:
        brief = await outbox.aaccept(
            WS, ses, user_id="u", client_message_id="a", text="one", model={"tone": "brief"}
        )
        plain = await outbox.aaccept(WS, ses, user_id="u", client_message_id="b", text="two")
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()
        await lg.aclose()
    runs = {r["metadata"][ENTRY_KEY]: r for r in server.runs(thread_id_for(WS, ses))}
    assert set(runs) == {brief.id, plain.id}
    assert runs[brief.id]["kwargs"]["context"] == {"tone": "brief", "model": {"tone": "brief"}}
    assert runs[plain.id]["kwargs"]["context"] == {"tone": "plain"}
    assert runs[brief.id]["metadata"]["tone"] == "brief"
    assert runs[brief.id]["metadata"][REQUEST_KEY] == brief.request_key
    assert "mode:queue" in runs[plain.id]["kwargs"]["config"]["tags"]


# --- the start-up probe -----------------------------------------------------------------------


async def test_the_probe_knows_the_graph_and_refuses_an_unknown_assistant(server):
    known = LangGraphClient(server.url, ASSISTANT)
    by_name = LangGraphClient(server.url, "no-such-graph")
    by_uuid = LangGraphClient(server.url, "00000000-0000-4000-8000-000000000000")
    try:
        await known.probe()
        for client in (by_name, by_uuid):
            with pytest.raises(AgentMisconfigured, match="check ASSISTANT_ID"):
                await client.probe()
    finally:
        for client in (known, by_name, by_uuid):
            await client.aclose()


def test_the_worker_refuses_to_start_for_an_assistant_the_server_does_not_know(
    server, valkey, settings
):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "DELIVERER": "django_outbox.delivery.langgraph.deliver",
        "LANGGRAPH": block(server, ASSISTANT_ID="no-such-graph"),
    }
    with pytest.raises(CommandError) as refused:
        call_command("outbox_worker", "--once", stdout=io.StringIO(), stderr=io.StringIO())
    said = str(refused.value)
    assert "refuses to start" in said and "'no-such-graph'" in said and "ASSISTANT_ID" in said


def test_the_worker_starts_for_a_known_assistant(server, valkey, settings):
    settings.OUTBOX = {
        **settings.OUTBOX,
        "DELIVERER": "django_outbox.delivery.langgraph.deliver",
        "LANGGRAPH": block(server),
    }
    out = io.StringIO()
    call_command("outbox_worker", "--once", stdout=out, stderr=io.StringIO())
    assert "outbox_worker stopped" in out.getvalue()


async def test_an_unreachable_server_is_a_warning_within_the_probes_bound():
    url = f"http://127.0.0.1:{free_port()}"
    agent = Agent("graph", langgraph.deliver)
    with override_settings(OUTBOX={"LANGGRAPH": {"URL": url, "ASSISTANT_ID": ASSISTANT}}):
        started = time.monotonic()
        warnings = await probe_agents([agent], seconds=5.0)
        await langgraph.aclose()
    assert time.monotonic() - started < 5.0
    [warning] = warnings
    assert "agent 'graph'" in warning and "starting anyway" in warning


async def test_a_probe_that_never_answers_is_cut_at_its_bound():
    async def hangs():
        await asyncio.Event().wait()

    async def deliverer(entry, **kwargs):
        return None

    deliverer.outbox_probe = hangs
    started = time.monotonic()
    [warning] = await probe_agents([Agent("slow", deliverer)], seconds=0.3)
    assert time.monotonic() - started < 3.0
    assert "no answer within 0.3s" in warning


# --- the project's identity in the thread -----------------------------------------------------


def test_two_projects_on_one_server_get_their_own_threads(server):
    """The same workspace and session in two projects (their own SECRET_KEY, or their own
    KEY_PREFIX) make two threads; the same project makes the same one every time."""
    threads = []
    for secret, prefix in (("project-one", "outbox"), ("project-two", "outbox"), ("a", "p2")):
        with override_settings(
            SECRET_KEY=secret, OUTBOX={"KEY_PREFIX": prefix, "LANGGRAPH": block(server)}
        ):
            threads.append(session_thread(WS, "shared-session"))
            assert session_thread(WS, "shared-session") == threads[-1]
            owner = key_space_owner().id
            assert threads[-1] == thread_id_for(WS, "shared-session", project=owner)
    assert len(set(threads)) == 3
    assert thread_id_for(WS, "shared-session") not in threads
    with override_settings(OUTBOX={"LANGGRAPH": block(server, PROJECT_THREADS=False)}):
        assert session_thread(WS, "shared-session") == thread_id_for(WS, "shared-session")


async def test_a_run_made_on_the_former_thread_is_still_found_after_the_upgrade(server):
    """Delivered before the upgrade (no project in the thread ID), its outcome unknown: the
    upgraded verifier finds the run on the former thread, and the abort cuts it there."""
    ses = "lg-upgraded"
    before = LangGraphClient(server.url, ASSISTANT, timeout=30.0)
    after = LangGraphClient(server.url, ASSISTANT, timeout=30.0, project="a" * 64)
    entry = make_entry("sent before the upgrade")
    try:
        await deliver(before, entry, ses)
        assert after.thread_id(WS, ses) != before.thread_id(WS, ses)
        verdict, ref = Verdict.split(await after.verify(entry, workspace_id=WS, session_id=ses))
        never = await after.verify(make_entry("never sent"), workspace_id=WS, session_id=ses)
        assert await after.abort(entry, workspace_id=WS, session_id=ses) is False  # finished
    finally:
        await before.aclose()
        await after.aclose()
    assert verdict is Verdict.DELIVERED and ref["threadID"] == thread_id_for(WS, ses)
    assert never is Verdict.ABSENT
    assert server.runs(after.thread_id(WS, ses)) == []  # nothing made on the new one
