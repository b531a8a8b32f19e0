"""The built-in LangGraph backend against a REAL LangGraph Agent Server (``langgraph dev``,
the in-memory runtime of ``langgraph-cli[inmem]``) serving a graph that needs no model
(tests/support/langgraph_app): a thread per session, a run per entry carrying the entry
ID in its metadata, the wait for the run, verification by finding the run, abort by
cancelling it, and a worker SIGKILLed mid-run (docs/howto/langgraph.md).
"""

from __future__ import annotations

import asyncio
import re
import signal

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox import Verdict
from django_outbox.conf import outbox_settings
from django_outbox.core.redaction import redact
from django_outbox.delivery.langgraph import (
    ENTRY_KEY,
    LangGraphClient,
    LangGraphError,
    LangGraphHTTPError,
    thread_id_for,
)
from django_outbox.errors import AmbiguousError, TransientDeliveryError
from django_outbox.testing import free_port
from tests.support.helpers import WS, accept, make_entry, wait_for
from tests.support.langgraph_server import ASSISTANT, LangGraphServer, worker_thread
from tests.support.workers import Workers

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lg = LangGraphServer(tmp_path_factory.mktemp("langgraph")).start()
    print(f"langgraph dev up on {lg.url} in {lg.startup_seconds:.2f}s")
    yield lg
    lg.stop()


@pytest.fixture
async def client(server):
    lg = LangGraphClient(server.url, ASSISTANT, timeout=30.0, request_timeout=10.0)
    yield lg
    await lg.aclose()
    assert not lg.has_clients, "a client of another event loop was left open"


def deliver(lg: LangGraphClient, entry, ses: str, attempt: int = 1):
    return lg.deliver(entry, workspace_id=WS, session_id=ses, attempt=attempt)


async def verify(lg: LangGraphClient, entry, ses: str) -> Verdict:
    verdict, _ = Verdict.split(await lg.verify(entry, workspace_id=WS, session_id=ses))
    return verdict


async def run_status(server, ses: str, entry_id: str) -> str | None:
    for run in await asyncio.to_thread(server.runs, thread_id_for(WS, ses)):
        if run["metadata"].get(ENTRY_KEY) == entry_id:
            return run["status"]
    return None


# --- delivering through the outbox ----------------------------------------------------------


async def test_each_entry_becomes_one_run_on_its_sessions_thread_in_order(
    server, client, make_outbox
):
    outbox = make_outbox(deliverer=client.deliver, verifier=client.verify)
    ses_a, ses_b = "lg-order-a", "lg-order-b"
    sent = {
        ses_a: [accept(outbox, f"k{i}", f"prompt {i}", ses=ses_a) for i in range(3)],
        ses_b: [accept(outbox, "k0", "other session", ses=ses_b)],
    }
    try:
        for ses in sent:
            while await outbox.alist(WS, ses):
                assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()  # its async Valkey client belongs to this test's loop

    for ses, entries in sent.items():
        thread = thread_id_for(WS, ses)
        runs = server.runs(thread)
        assert [r["metadata"][ENTRY_KEY] for r in runs] == [e.id for e in entries]
        assert {r["status"] for r in runs} == {"success"}
        assert all(r["metadata"]["outbox_session_id"] == ses for r in runs)
        assert all(r["metadata"]["outbox_attempt"] == 1 for r in runs)
        assert server.thread(thread)["metadata"]["outbox_session_id"] == ses
        texts = [e.text for e in entries]
        assert server.messages(thread) == [
            pair for text in texts for pair in (("human", text), ("ai", f"echo: {text}"))
        ]


async def test_a_merged_delivery_is_one_run_holding_every_prompt(server, client, make_outbox):
    """Merge prompts become one run whose input has a user message per prompt, in queue
    order: the thread holds every one of them, and the run carries the first's ID."""
    outbox = make_outbox(deliverer=client.deliver, verifier=client.verify)
    ses = "lg-merge"
    try:
        head = await outbox.aaccept(
            WS, ses, user_id="u", client_message_id="k1", text="alpha", if_busy="merge"
        )
        for key, text in (("k2", "beta"), ("k3", "gamma")):
            await outbox.aaccept(
                WS, ses, user_id="u", client_message_id=key, text=text, if_busy="merge"
            )
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()
    thread = thread_id_for(WS, ses)
    [run] = server.runs(thread)
    assert run["metadata"][ENTRY_KEY] == head.id
    assert server.messages(thread) == [
        ("human", "alpha"),
        ("human", "beta"),
        ("human", "gamma"),
        ("ai", "echo: gamma"),
    ]
    assert await verify(client, head, ses) is Verdict.DELIVERED


async def test_a_session_maps_to_an_existing_thread_and_its_run_gets_the_apps_options(server):
    """THREAD_ID maps a session to a thread the app made (verification looks there too);
    RUN_OPTIONS gives each prompt's run its config, context and metadata, never overriding
    the outbox's own keys; the run's metadata names the accepting user."""
    thread = await asyncio.to_thread(server.create_thread)
    seen = []

    async def run_options(entry, *, workspace_id, session_id):
        seen.append((entry.id, workspace_id, session_id))
        return {
            "config": {"tags": [f"user:{entry.user_id}"], "recursion_limit": 7},
            "context": {"tone": "brief"},
            "metadata": {"team": "blue", ENTRY_KEY: "not the outbox's"},
        }

    lg = LangGraphClient(
        server.url,
        ASSISTANT,
        timeout=30.0,
        thread_id=lambda ws, ses: thread if ses == "lg-mapped" else "",
        run_options=run_options,
    )
    entry = make_entry("to the app's thread")
    try:
        await deliver(lg, entry, "lg-mapped")
        assert await verify(lg, entry, "lg-mapped") is Verdict.DELIVERED
        with pytest.raises(LangGraphError, match="THREAD_ID"):
            await deliver(lg, make_entry("no thread"), "lg-unmapped")
        assert await verify(lg, entry, "lg-unmapped") is Verdict.INCONCLUSIVE
    finally:
        await lg.aclose()
    [run] = server.runs(thread)
    metadata = run["metadata"]
    assert metadata[ENTRY_KEY] == entry.id and metadata["team"] == "blue"
    assert metadata["outbox_user_id"] == entry.user_id
    assert run["kwargs"]["config"]["recursion_limit"] == 7
    assert run["kwargs"]["context"]["tone"] == "brief"
    assert seen == [(entry.id, WS, "lg-mapped")]
    assert server.messages(thread_id_for(WS, "lg-mapped")) == []  # nothing on the uuid5 one


# --- verify -------------------------------------------------------------------------------


async def test_verify_finds_the_entrys_run_and_calls_a_missing_one_absent(server, client):
    ses = "lg-verify"
    sent, unsent = make_entry("sent once"), make_entry("never sent")
    await deliver(client, sent, ses)

    assert await verify(client, sent, ses) is Verdict.DELIVERED
    assert await verify(client, unsent, ses) is Verdict.ABSENT
    # No thread at all for a session never delivered to: nothing was created there.
    assert await verify(client, unsent, "lg-no-such-session") is Verdict.ABSENT


async def test_verify_pages_through_the_threads_runs(server, client, monkeypatch):
    """The entry's run is found past the first page of the run search (newest first)."""
    import django_outbox.delivery.langgraph as module

    monkeypatch.setattr(module, "PAGE_SIZE", 2)
    ses = "lg-paging"
    entries = [make_entry(f"paged {i}") for i in range(5)]
    for entry in entries:
        await deliver(client, entry, ses)
    for entry in entries:
        assert await verify(client, entry, ses) is Verdict.DELIVERED
    assert await verify(client, make_entry("not there"), ses) is Verdict.ABSENT


async def test_a_run_that_outlasts_the_wait_is_ambiguous_and_then_verified_delivered(
    server, tmp_path
):
    impatient = LangGraphClient(server.url, ASSISTANT, timeout=0.5)
    gate = tmp_path / "release"
    entry = make_entry(f"hold {gate}")
    try:
        with pytest.raises(AmbiguousError, match="was created"):
            await deliver(impatient, entry, "lg-slow")
        assert await run_status(server, "lg-slow", entry.id) in ("pending", "running")
        assert await verify(impatient, entry, "lg-slow") is Verdict.DELIVERED
        gate.touch()
        await wait_for(
            lambda: _is(run_status(server, "lg-slow", entry.id), "success"),
            timeout=20,
            message="the held run to succeed",
        )
    finally:
        gate.touch()
        await impatient.aclose()


async def _is(status, expected: str) -> bool:
    return await status == expected


# --- abort ----------------------------------------------------------------------------------


async def test_abort_cancels_the_running_run_and_the_verifier_still_finds_it(
    server, client, tmp_path
):
    ses = "lg-abort"
    gate = tmp_path / "never"
    entry = make_entry(f"hold {gate}")
    delivery = asyncio.create_task(deliver(client, entry, ses))
    try:
        await wait_for(
            lambda: _is(run_status(server, ses, entry.id), "running"),
            timeout=20,
            message="the run to start",
        )
        assert await client.abort(entry, workspace_id=WS, session_id=ses) is True
        # The deliverer's wait ends with the run: the prompt had reached the agent.
        await asyncio.wait_for(delivery, 20)
        assert await run_status(server, ses, entry.id) == "interrupted"
        assert await verify(client, entry, ses) is Verdict.DELIVERED
        # Nothing left to cut: the run has ended, and an unsent entry has no run.
        assert await client.abort(entry, workspace_id=WS, session_id=ses) is False
        unsent = make_entry("never sent")
        assert await client.abort(unsent, workspace_id=WS, session_id=ses) is False
    finally:
        gate.touch()
        delivery.cancel()


async def test_the_next_prompt_waits_behind_a_run_still_going(server, client, tmp_path):
    """After an ambiguous wait the outbox may send the next prompt while the previous run
    still runs: it is enqueued on the server, never cutting the one before."""
    ses = "lg-enqueue"
    gate = tmp_path / "gate"
    first, second = make_entry(f"hold {gate}"), make_entry("second")
    impatient = LangGraphClient(server.url, ASSISTANT, timeout=0.3)
    try:
        with pytest.raises(AmbiguousError):
            await deliver(impatient, first, ses)
        later = asyncio.create_task(deliver(client, second, ses))
        await wait_for(
            lambda: _is(run_status(server, ses, second.id), "pending"),
            timeout=20,
            message="the second run to wait its turn",
        )
        gate.touch()
        await asyncio.wait_for(later, 20)
        assert await run_status(server, ses, first.id) == "success"
        texts = [content for kind, content in server.messages(thread_id_for(WS, ses))]
        assert texts == [first.text, f"echo: {first.text}", "second", "echo: second"]
    finally:
        gate.touch()
        await impatient.aclose()


# --- errors ---------------------------------------------------------------------------------


async def test_a_refused_connection_is_transient_and_verification_inconclusive():
    closed = LangGraphClient(f"http://127.0.0.1:{free_port()}", ASSISTANT, connect_timeout=1)
    entry = make_entry("nobody listens")
    try:
        with pytest.raises(TransientDeliveryError):
            await deliver(closed, entry, "lg-refused")
        assert await verify(closed, entry, "lg-refused") is Verdict.INCONCLUSIVE
    finally:
        await closed.aclose()


async def test_an_unknown_assistant_is_a_definitive_failure(server):
    wrong = LangGraphClient(server.url, "no-such-graph")
    entry = make_entry("to nobody")
    try:
        with pytest.raises(LangGraphHTTPError) as caught:
            await deliver(wrong, entry, "lg-wrong-assistant")
        assert 400 <= caught.value.status < 500
        assert await verify(wrong, entry, "lg-wrong-assistant") is Verdict.ABSENT
    finally:
        await wrong.aclose()


async def test_the_api_key_is_sent_and_never_shown(server):
    secret = "lg-key-" + "x7" * 12
    keyed = LangGraphClient(server.url, "no-such-graph", api_key=secret)
    try:
        with pytest.raises(LangGraphHTTPError) as caught:
            await deliver(keyed, make_entry("keyed"), "lg-keyed")
        assert secret not in str(caught.value)
        assert secret not in redact(f"a text that quotes {secret}")
    finally:
        await keyed.aclose()


# --- settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"ASSISTANT_ID": "agent"}, "OUTBOX['LANGGRAPH']['URL'] is required"),
        ({"URL": "http://127.0.0.1:2024"}, "OUTBOX['LANGGRAPH']['ASSISTANT_ID'] is required"),
        ({"URL": "ftp://x", "ASSISTANT_ID": "a"}, "must be an http(s) URL"),
        ({"URL": "http://u:p@h:1", "ASSISTANT_ID": "a"}, "must not carry credentials"),
        ({"URL": "http://h:1", "ASSISTANT_ID": " "}, "must be a non-empty string"),
        ({"URL": "http://h:1", "ASSISTANT_ID": "a", "TIMEOUT": 0}, "['TIMEOUT'] must be positive"),
        ({"URL": "http://h:1", "ASSISTANT_ID": "a", "THREAD_NAMESPACE": "x"}, "must be a UUID"),
        ({"URL": "http://h:1", "ASSISTANT_ID": "a", "THREAD_ID": 5}, "THREAD_ID'] must be a"),
        ({"URL": "http://h:1", "ASSISTANT_ID": "a", "RUN_OPTIONS": {}}, "RUN_OPTIONS'] must be"),
        ({"URL": "http://h:1", "ASSISTANT_ID": "a", "PORT": 1}, "unknown keys ['PORT']"),
        ("http://h:1", "OUTBOX['LANGGRAPH'] must be a dict"),
    ],
)
def test_a_bad_langgraph_block_is_reported_by_the_settings(block, message):
    with override_settings(OUTBOX={"LANGGRAPH": block}):
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            outbox_settings()


@pytest.mark.parametrize("api_key", ["k\r\nX-Other: 1", "k\n", ""], ids=["crlf", "lf", "empty"])
def test_an_api_key_that_is_not_one_line_is_refused(api_key):
    """The key is sent as the X-Api-Key header of every call (docs/howto/langgraph.md): one
    holding a line break would end that header and start another, so the settings refuse
    it, as they refuse an empty one."""
    block = {"URL": "http://h:1", "ASSISTANT_ID": "a", "API_KEY": api_key}
    with override_settings(OUTBOX={"LANGGRAPH": block}):
        with pytest.raises(ImproperlyConfigured, match="must be a non-empty string on one line"):
            outbox_settings()


def test_the_block_defaults_its_wait_to_the_delivery_timeout():
    block = {"URL": "http://127.0.0.1:2024/", "ASSISTANT_ID": "agent", "API_KEY": "k" * 20}
    with override_settings(OUTBOX={"LANGGRAPH": block, "DELIVERY_TIMEOUT": 42}):
        parsed = outbox_settings().langgraph
    assert parsed is not None
    assert (parsed.url, parsed.timeout, parsed.api_key) == ("http://127.0.0.1:2024", 42.0, "k" * 20)
    assert thread_id_for("w", "s") != thread_id_for(
        "w", "s", "12345678-1234-5678-1234-567812345678"
    )
    assert thread_id_for("w", "s") == thread_id_for("w", "s") != thread_id_for("w", "s2")


# --- as one of several agents (docs/howto/agents.md) -------------------------------------

LANGGRAPH_ENTRY = {
    "DELIVERER": "django_outbox.delivery.langgraph.deliver",
    "VERIFIER": "django_outbox.delivery.langgraph.verify",
    "ABORTER": "django_outbox.delivery.langgraph.abort",
}


async def test_an_agents_entry_carries_its_own_server_settings(server, make_outbox):
    entry_settings = {**LANGGRAPH_ENTRY, "URL": server.url, "ASSISTANT_ID": ASSISTANT}
    with override_settings(OUTBOX={"AGENTS": {"graphs": entry_settings}}):
        agents = outbox_settings().resolve_agents()
    outbox = make_outbox(agents=agents)
    ses = "lg-as-an-agent"
    sent = [accept(outbox, f"k{i}", f"routed {i}", ses=ses) for i in range(2)]
    try:
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
        assert outbox.aborter_for(WS, ses) is not None
    finally:
        await outbox.aclose()
    runs = server.runs(worker_thread(WS, ses))
    assert [r["metadata"][ENTRY_KEY] for r in runs] == [e.id for e in sent]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"URL": "ftp://x", "ASSISTANT_ID": "a"}, "OUTBOX['AGENTS']['graphs']['URL'] must be"),
        ({"URL": "http://h:1"}, "OUTBOX['AGENTS']['graphs']['ASSISTANT_ID'] is required"),
        ({"URL": "http://h:1", "ASSISTANT_ID": "a", "X": 1}, "unknown keys ['X']"),
        ({}, "OUTBOX['LANGGRAPH'] (or the AGENTS entry's own URL and ASSISTANT_ID) is required"),
    ],
)
def test_an_agents_entry_with_bad_settings_is_refused_at_start(options, message):
    with override_settings(OUTBOX={"AGENTS": {"graphs": {**LANGGRAPH_ENTRY, **options}}}):
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            outbox_settings().resolve_agents()


# --- a worker killed mid-run ----------------------------------------------------------------


def test_a_worker_killed_mid_run_is_verified_delivered_never_sent_twice(
    server, valkey, r, tmp_path, make_outbox
):
    ses = "lg-sigkill"
    gate = tmp_path / "gate"
    outbox = make_outbox()
    entries = [
        accept(outbox, "k0", f"hold {gate}", ses=ses),
        accept(outbox, "k1", "after the kill", ses=ses),
        accept(outbox, "k2", "and one more", ses=ses),
    ]
    workers = Workers(
        valkey,
        tmp_path,
        DJANGO_SETTINGS_MODULE="tests.support.settings.langgraph_worker",
        OUTBOX_TEST_LANGGRAPH_URL=server.url,
        OUTBOX_TEST_LOCK_TTL="2",
    )
    thread = worker_thread(WS, ses)
    try:
        first = workers.start()
        _wait(lambda: any(run["status"] == "running" for run in server.runs(thread)), 60)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        gate.touch()  # the run the killed worker waited for ends without it
        workers.start()
        _wait(lambda: not outbox.list(WS, ses), 60)
    finally:
        gate.touch()
        workers.stop_all()
    runs = server.runs(thread)
    assert [run["metadata"][ENTRY_KEY] for run in runs] == [e.id for e in entries]
    assert [run["status"] for run in runs] == ["success"] * 3


def _wait(predicate, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_the_test_server_answers_on_loopback_only(server):
    assert server.url.startswith("http://127.0.0.1:")
    assert httpx.get(f"{server.url}/ok").json()["ok"] is True
