"""Stop, cancel and ``ifBusy: "interrupt"`` end to end on a REAL LangGraph Agent Server
(``langgraph dev`` serving tests/support/langgraph_app), through the public API, carried out
by the lease holder: an ``outbox_worker`` process, or this process's own delivery step where
a test must decide when each step runs (docs/howto/cutting.md, docs/howto/langgraph.md).

Every cut is checked on the server: the run of the cut prompt ends ``interrupted`` (a run
that was started) or there is none (never sent), no prompt has two runs, and the next
prompt of the session is delivered after it (a ``sleep 600`` run that went on would hold it
back: runs of one thread wait their turn).
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from django_outbox import InterruptResult, Status
from django_outbox.delivery.langgraph import ENTRY_KEY, LangGraphClient, thread_id_for
from tests.support.disconnects import AUTH, asgi_server
from tests.support.helpers import WS, aaccept, accept, wait_for
from tests.support.langgraph_server import ASSISTANT, LangGraphServer, worker_thread
from tests.support.proxy import TcpProxy
from tests.support.valkey import wait_until
from tests.support.workers import Workers

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

ABORTER = "django_outbox.delivery.langgraph.abort"
LONG = "sleep 600"  # a turn that never ends within a test unless it is cut


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    lg = LangGraphServer(tmp_path_factory.mktemp("langgraph")).start()
    yield lg
    lg.stop()


@pytest.fixture
def workers(valkey, tmp_path, server):
    w = Workers(
        valkey,
        tmp_path,
        DJANGO_SETTINGS_MODULE="tests.support.settings.langgraph_worker",
        OUTBOX_TEST_LANGGRAPH_URL=server.url,
        OUTBOX_TEST_ABORTER=ABORTER,
    )
    yield w
    w.stop_all()


def runs_of(server, ws: str, ses: str, thread_of=worker_thread) -> list[tuple[str, str]]:
    """``(entry ID, status)`` of every run on the session's thread, oldest first (an entry
    sent twice appears twice). ``thread_of``: how the deliveries made the thread ID (a
    worker of the test settings, or, ``thread_id_for``, a client made in the test)."""
    runs = server.runs(thread_of(ws, ses))
    return [(run["metadata"].get(ENTRY_KEY), run["status"]) for run in runs]


def status_on_server(server, ws: str, ses: str, entry_id: str, thread_of=worker_thread):
    """The status of the newest run of ``entry_id``, or None when it has none."""
    runs = runs_of(server, ws, ses, thread_of)
    statuses = [status for run_entry, status in runs if run_entry == entry_id]
    return statuses[-1] if statuses else None


def took_its_prompt(server, ws: str, ses: str, entry_id: str, thread_of=worker_thread) -> bool:
    """Whether the graph took the prompt of ``entry_id``: a checkpoint of the session's thread
    carries its entry ID (a run that is ``running`` may not have written it yet)."""
    response = httpx.post(
        f"{server.url}/threads/{thread_of(ws, ses)}/history",
        json={"limit": 1, "metadata": {ENTRY_KEY: entry_id}},
    )
    return response.status_code == 200 and bool(response.json())


def delivered(r) -> list[str]:
    return [line.split()[0] for line in r.lrange("test:delivered", 0, -1)]


# --- through REST, a live uvicorn and an outbox_worker process ----------------------------


def test_stop_cancel_and_an_interrupting_prompt_cut_real_runs_through_rest(
    server, valkey, tmp_path, r, workers
):
    """Three ``sleep 600`` runs are cut in turn: by Stop (``interrupt/``), by cancelling the
    prompt in flight (``cancel/``) and by a prompt sent with ``ifBusy: "interrupt"``, which
    then runs. Each cut run ends ``interrupted`` on the server, its entry delivered once
    with ``interrupted: true``; nothing runs twice; the queue ends empty."""
    ses = "lg-rest-cuts"
    base = f"/outbox/api/workspaces/alice/sessions/{ses}/"
    env = {
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.langgraph_web",
        "OUTBOX_TEST_LANGGRAPH_URL": server.url,
    }
    with asgi_server(valkey, tmp_path / "web", **env) as web:
        http = httpx.Client(base_url=web.base + base, headers={"Authorization": AUTH})
        try:
            ids = []
            for key in ("k1", "k2", "k3"):
                answer = http.post("messages/", json={"clientMessageID": key, "text": LONG})
                assert answer.status_code == 202, answer.text
                ids.append(answer.json()["id"])

            def took(entry_id: str) -> bool:
                return took_its_prompt(server, "alice", ses, entry_id)

            workers.start("--tick", "0.2")
            wait_until(lambda: took(ids[0]), 60, message=workers.logs)
            answer = http.post("interrupt/")  # Stop
            assert (answer.status_code, answer.json()) == (202, {"result": "cut"})
            wait_until(lambda: took(ids[1]), 30, message=workers.logs)
            assert status_on_server(server, "alice", ses, ids[0]) == "interrupted"

            answer = http.post(f"messages/{ids[1]}/cancel/")  # the prompt in flight
            assert (answer.status_code, answer.json()) == (202, {"result": "cut"})
            wait_until(lambda: took(ids[2]), 30, message=workers.logs)

            body = {"clientMessageID": "k4", "text": "now", "ifBusy": "interrupt"}
            answer = http.post("messages/", json=body)
            assert answer.status_code == 202, answer.text
            assert answer.json()["mode"] == "interrupt"
            ids.append(answer.json()["id"])
            wait_until(lambda: len(delivered(r)) == 4, 30, message=workers.logs)
            assert http.get("messages/").json()["entries"] == []
        finally:
            http.close()
            workers.stop_all()

    # One run each, in order: nothing was sent twice.
    assert runs_of(server, "alice", ses) == [
        *((entry_id, "interrupted") for entry_id in ids[:3]),
        (ids[3], "success"),
    ]
    assert sorted(delivered(r)) == sorted(ids)  # entry_delivered once each
    assert sorted(r.lrange("test:interrupted", 0, -1)) == sorted(ids[:3])
    # The cut turns left their prompts on the thread, and no answer to them.
    assert server.messages(worker_thread("alice", ses)) == [
        ("human", LONG),
        ("human", LONG),
        ("human", LONG),
        ("human", "now"),
        ("ai", "echo: now"),
    ]


# --- through the Python API, an outbox_worker process: the time a Stop takes ------------------


def test_outbox_interrupt_stops_real_runs_and_how_long_it_takes(server, make_outbox, r, workers):
    """``Outbox.interrupt`` here, the cut carried out by the worker process; measured from
    the request to the run ``interrupted`` on the server, and to the entry settled
    (delivered, ``interrupted: true``: one verification later, ``VERIFY_DELAY`` 0.5 s here).
    docs/howto/langgraph.md#stop-and-interrupt states the figures."""
    outbox = make_outbox(aborter=_never_here, verify_delay=0.5)
    workers.start("--tick", "0.2")
    to_cancelled, to_settled = [], []
    try:
        for i in range(8):
            ses = f"lg-stop-{i}"
            entry = accept(outbox, f"k{i}", LONG, ses=ses)
            wait_until(
                lambda: took_its_prompt(server, WS, ses, entry.id),  # noqa: B023
                60,
                message=workers.logs,
            )
            started = time.monotonic()
            assert outbox.interrupt(WS, ses) is InterruptResult.CUT
            wait_until(
                lambda: status_on_server(server, WS, ses, entry.id) == "interrupted",  # noqa: B023
                20,
                0.005,
                message=workers.logs,
            )
            to_cancelled.append(time.monotonic() - started)
            wait_until(lambda: entry.id in delivered(r), 20, 0.005, message=workers.logs)  # noqa: B023
            to_settled.append(time.monotonic() - started)
            assert outbox.list(WS, ses) == []
    finally:
        workers.stop_all()
    assert len(r.lrange("test:interrupted", 0, -1)) == 8
    for figures, name in ((to_cancelled, "run interrupted"), (to_settled, "entry settled")):
        figures.sort()
        print(
            f"stop -> {name} over {len(figures)} runs: p50 {figures[len(figures) // 2]:.3f}s, "
            f"max {figures[-1]:.3f}s, min {figures[0]:.3f}s"
        )
    assert to_cancelled[-1] < 5


def _never_here(entry, *, workspace_id, session_id):
    raise AssertionError("the aborter runs in the lease holder's process")


def test_a_stop_after_its_holder_died_is_carried_out_by_the_next_worker(
    server, make_outbox, r, workers
):
    """The worker waiting for a running run is SIGKILLed, then Stop marks the staged entry.
    The next worker recovers it as verifying, aborts first (the run still goes on on the
    server) and verifies: delivered, ``interrupted: true``, one run, the next prompt after."""
    outbox = make_outbox(aborter=_never_here, verify_delay=0.5)
    ses = "lg-stop-after-kill"
    entry = accept(outbox, "k1", LONG, ses=ses)
    after = accept(outbox, "k2", "after the kill", ses=ses)
    workers.env["OUTBOX_TEST_LOCK_TTL"] = "2"  # the dead holder's lease ends soon
    first = workers.start("--tick", "0.2")
    try:
        wait_until(lambda: took_its_prompt(server, WS, ses, entry.id), 60, message=workers.logs)
        first.kill()
        first.wait(10)
        assert outbox.interrupt(WS, ses) is InterruptResult.CUT
        assert [e.interrupted for e in outbox.list(WS, ses)] == [True, False]
        workers.start("--tick", "0.2")
        wait_until(lambda: len(delivered(r)) == 2, 60, message=workers.logs)
    finally:
        workers.stop_all()
    assert runs_of(server, WS, ses) == [(entry.id, "interrupted"), (after.id, "success")]
    assert r.lrange("test:interrupted", 0, -1) == [entry.id]
    assert outbox.list(WS, ses) == []


# --- a Stop before the run exists: this process holds the lease, step by step --------------


def _stepping_outbox(make_outbox, client: LangGraphClient):
    return make_outbox(
        deliverer=client.deliver,
        verifier=client.verify,
        aborter=client.abort,
        verify_delay=0,
        verify_backoff=0.1,
        max_verify_backoff=0.5,
    )


@pytest.fixture
async def proxied(server):
    """A LangGraph client that reaches the server through a loopback proxy (which can hold
    one request), and the proxy."""
    proxy = TcpProxy(server.port).start()
    client = LangGraphClient(f"http://127.0.0.1:{proxy.port}", ASSISTANT, timeout=30)
    yield client, proxy
    proxy.release_held(forward=False)
    await client.aclose()
    proxy.close()


async def _stop_while_the_run_request_is_held(outbox, proxy, ses: str):
    """Accept a long prompt and one after it, hold the run's creation in the proxy, Stop;
    return both entries once the delivery step has ended."""
    cut = await aaccept(outbox, "k1", LONG, ses=ses)
    after = await aaccept(outbox, "k2", "after the stop", ses=ses)
    thread = thread_id_for(WS, ses)
    proxy.hold_request_to(f"POST /threads/{thread}/runs HTTP/1.1".encode())
    step = asyncio.ensure_future(outbox.adeliver_once(WS, ses))
    await wait_for(proxy.held.is_set, timeout=20, message="the run's creation never left")
    assert await outbox.ainterrupt(WS, ses) is InterruptResult.CUT
    assert await asyncio.wait_for(step, 20)
    (head, queued) = await outbox.alist(WS, ses)
    assert (head.id, head.status, head.interrupted) == (cut.id, Status.VERIFYING, True)
    assert queued.id == after.id
    return cut, after


async def test_a_stop_before_the_run_is_created_ends_cancelled_never_sent(
    server, make_outbox, proxied, signals_log
):
    """The Stop lands while the run's creation is still on its way, and it never arrives:
    verified absent, the entry ends ``cancelled``, no run carries it, and the next prompt
    is delivered."""
    client, proxy = proxied
    outbox = _stepping_outbox(make_outbox, client)
    ses = "lg-stop-before-run"
    try:
        cut, after = await _stop_while_the_run_request_is_held(outbox, proxy, ses)
        proxy.release_held(forward=False)
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()
    assert cut.id not in signals_log.ids("delivered")
    states = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == cut.id]
    assert states[-1] == "cancelled"
    assert runs_of(server, WS, ses, thread_id_for) == [(after.id, "success")]
    assert server.messages(thread_id_for(WS, ses)) == [
        ("human", "after the stop"),
        ("ai", "echo: after the stop"),
    ]


async def test_a_run_created_after_its_stop_is_cut_by_the_verification(
    server, make_outbox, proxied, signals_log
):
    """The Stop lands while the run's creation is on its way; the request reaches the
    server after the holder's abort found nothing to cut, and the run starts (the graph
    takes the prompt). The verification aborts first, so that run is cut too: delivered,
    ``interrupted: true``, one run, and the next prompt runs after it. (Had the run still
    been waiting its turn, the cut would leave it unstarted: cancelled, as below.)"""
    client, proxy = proxied
    outbox = _stepping_outbox(make_outbox, client)
    ses = "lg-run-after-stop"
    try:
        cut, after = await _stop_while_the_run_request_is_held(outbox, proxy, ses)
        proxy.release_held(forward=True)
        await wait_for(
            lambda: asyncio.to_thread(took_its_prompt, server, WS, ses, cut.id, thread_id_for),
            timeout=20,
            message="the late run to take its prompt",
        )
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
    finally:
        await outbox.aclose()
    (done,) = [e for e, _ in signals_log.calls["delivered"] if e.id == cut.id]
    assert done.interrupted is True
    assert runs_of(server, WS, ses, thread_id_for) == [
        (cut.id, "interrupted"),
        (after.id, "success"),
    ]
    assert server.messages(thread_id_for(WS, ses)) == [
        ("human", LONG),
        ("human", "after the stop"),
        ("ai", "echo: after the stop"),
    ]


# --- a Stop while the run waits its turn on the server ---------------------------------------


async def test_a_run_cut_while_it_waits_its_turn_ends_cancelled_never_sent(
    server, make_outbox, signals_log, tmp_path
):
    """Another run holds the thread (one of an earlier prompt whose wait timed out and that
    was verified delivered, or a run started from elsewhere), so the prompt's run waits
    behind it, ``pending``, when Stop cuts it. LangGraph marks that run ``interrupted``,
    but the graph never took its prompt (no checkpoint carries the entry ID): verified
    absent, the entry ends ``cancelled``, never sent, and the next prompt runs."""
    client = LangGraphClient(server.url, ASSISTANT, timeout=30)
    outbox = _stepping_outbox(make_outbox, client)
    ses = "lg-cut-pending"
    thread = thread_id_for(WS, ses)
    gate = tmp_path / "gate"
    async with httpx.AsyncClient(base_url=server.url) as http:
        (await http.post("/threads", json={"thread_id": thread})).raise_for_status()
        body = {
            "assistant_id": ASSISTANT,
            "input": {"messages": [{"role": "user", "content": f"hold {gate}"}]},
        }
        (await http.post(f"/threads/{thread}/runs", json=body)).raise_for_status()
    try:
        await wait_for(
            lambda: asyncio.to_thread(server.messages, thread),
            timeout=20,
            message="the run that holds the thread",
        )
        cut = await aaccept(outbox, "k1", "cut while waiting", ses=ses)
        after = await aaccept(outbox, "k2", "after", ses=ses)
        step = asyncio.ensure_future(outbox.adeliver_once(WS, ses))
        await wait_for(
            lambda: _is(
                asyncio.to_thread(status_on_server, server, WS, ses, cut.id, thread_id_for),
                "pending",
            ),
            timeout=20,
            message="the prompt's run waiting its turn",
        )
        assert await outbox.ainterrupt(WS, ses) is InterruptResult.CUT
        assert await asyncio.wait_for(step, 20)
        gate.touch()
        while await outbox.alist(WS, ses):
            assert await outbox.adeliver_once(WS, ses)
    finally:
        gate.touch()
        await outbox.aclose()
        await client.aclose()
    assert cut.id not in signals_log.ids("delivered")
    states = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == cut.id]
    assert states[-1] == "cancelled"
    assert runs_of(server, WS, ses, thread_id_for) == [
        (None, "success"),
        (cut.id, "interrupted"),
        (after.id, "success"),
    ]
    assert server.messages(thread) == [
        ("human", f"hold {gate}"),
        ("ai", f"echo: hold {gate}"),
        ("human", "after"),
        ("ai", "echo: after"),
    ]


async def _is(value, expected) -> bool:
    return await value == expected
