"""``outbox_worker`` processes delivering to two HTTP agents by a router, with a SIGKILL while
one agent holds a prompt it has taken (docs/howto/agents.md#the-http-agent): the next worker
verifies it and finds it, nothing is sent twice, and order holds per session."""

from __future__ import annotations

import signal
import time

import pytest

from tests.support.http_agent import AgentServer
from tests.support.valkey import wait_until
from tests.support.workers import Workers

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

WS = "w1"


@pytest.fixture
def servers():
    north, south = AgentServer().start(), AgentServer().start()
    yield north, south
    north.stop()
    south.stop()


def test_a_worker_killed_while_an_agent_holds_the_prompt_never_sends_it_twice(
    make_outbox, valkey, tmp_path, servers
):
    north, south = servers
    north.plan = ["slow"]  # takes the first prompt, then answers nothing
    outbox = make_outbox()
    sessions = ("n1", "s1", "n2")
    for i in range(3):
        for ses in sessions:
            outbox.accept(WS, ses, user_id="u", client_message_id=f"{ses}-{i}", text=f"{ses}-{i}")
    workers = Workers(
        valkey,
        tmp_path,
        DJANGO_SETTINGS_MODULE="tests.support.settings.http_agents",
        OUTBOX_TEST_NORTH=north.url,
        OUTBOX_TEST_SOUTH=south.url,
        OUTBOX_TEST_LOCK_TTL="1",
    )
    try:
        first = workers.start("--tick", "0.2")
        wait_until(lambda: len(north.runs) >= 1, 30, message="north took a prompt")
        held = next(iter(north.stored.values()))["session_id"]
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        workers.start("--tick", "0.2")
        deadline = time.monotonic() + 60
        while any(outbox.list(WS, ses) for ses in sessions):
            assert time.monotonic() < deadline, workers.logs()
            time.sleep(0.1)
        workers.stop_all()
    finally:
        workers.stop_all()
    texts = {
        name: [server.stored[key]["text"] for key in server.runs]
        for name, server in (("north", north), ("south", south))
    }
    for ses in sessions:
        ran = texts["north" if ses.startswith("n") else "south"]
        assert [t for t in ran if t.startswith(ses)] == [f"{ses}-{i}" for i in range(3)]
    # The prompt the agent held when the worker died was sent once: the next worker asked.
    keys = [headers["idempotency-key"] for _, headers, _ in north.prompts()]
    held_key = north.runs[0]
    assert keys.count(held_key) == 1, keys
    assert any(method == "GET" and held_key in path for method, path, _, _ in north.requests)
    assert held.startswith("n") and sorted(texts["south"]) == [f"s1-{i}" for i in range(3)]
