"""Cutting a turn across processes: the cut is requested in one process and carried out
by an ``outbox_worker`` process; a worker SIGKILLed mid-cut (docs/howto/cutting.md)."""

from __future__ import annotations

import time

import pytest

from django_outbox import InterruptResult
from tests.support.valkey import wait_until
from tests.support.workers import Workers

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

WS, SES = "w1", "s1"
AGENT = dict(
    OUTBOX_TEST_DELIVERER="tests.support.agents.deliver_until_aborted",
    OUTBOX_TEST_ABORTER="tests.support.agents.abort",
    OUTBOX_TEST_LOCK_TTL="2",
)


@pytest.fixture
def workers(valkey, tmp_path):
    made: list[Workers] = []

    def make(**env: str) -> Workers:
        w = Workers(valkey, tmp_path, **env)
        made.append(w)
        return w

    yield make
    for w in made:
        w.stop_all()


def _cutting_outbox(make_outbox):
    # This process only requests cuts: it needs an aborter configured to accept them,
    # never calls it (the lease holder, in the worker process, does).
    def never_here(entry, *, workspace_id, session_id):
        raise AssertionError("the aborter runs in the lease holder's process")

    return make_outbox(aborter=never_here, verify_delay=0)


def _delivered(r) -> list[str]:
    return [line.split()[0] for line in r.lrange("test:delivered", 0, -1)]


def test_stop_requested_here_is_carried_out_by_the_worker_process(make_outbox, r, workers):
    outbox = _cutting_outbox(make_outbox)
    entry = outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="stop me")
    later = outbox.accept(WS, SES, user_id="u", client_message_id="k2", text="later")
    w = workers(**AGENT)
    w.start("--tick", "0.2")
    wait_until(lambda: r.sismember("test:sent", entry.id), 30, message="the turn never started")

    started = time.monotonic()
    assert outbox.interrupt(WS, SES) is InterruptResult.CUT
    wait_until(lambda: r.lrange("test:aborts", 0, -1), 10, message="the worker never aborted")
    print(f"stop -> abort by the worker process: {time.monotonic() - started:.3f}s")
    wait_until(lambda: entry.id in _delivered(r), 20, message=w.logs)
    # The next prompt goes on as usual (and its turn is cut the same way to end the test).
    wait_until(lambda: r.sismember("test:sent", later.id), 20, message=w.logs)
    assert outbox.cut(WS, SES, later.id) is InterruptResult.CUT
    wait_until(lambda: later.id in _delivered(r), 20, message=w.logs)
    w.stop_all()
    assert r.lrange("test:log", 0, -1) == [f"{SES} stop me", f"{SES} later"]  # sent once each


def test_a_worker_sigkilled_mid_cut_leaves_the_cut_to_the_next_one(make_outbox, r, workers):
    """The holder dies with the turn running; the cut is marked on the staged entry. The
    next worker recovers it as verifying, aborts the turn first, and the verifier finds
    it: delivered, interrupted, never sent again."""
    outbox = _cutting_outbox(make_outbox)
    entry = outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="stop me")
    w = workers(**AGENT)
    first = w.start("--tick", "0.2")
    wait_until(lambda: r.sismember("test:sent", entry.id), 30, message="the turn never started")
    first.kill()
    first.wait(10)
    assert outbox.interrupt(WS, SES) is InterruptResult.CUT
    (listed,) = outbox.list(WS, SES)
    assert listed.interrupted

    w.start("--tick", "0.2")
    wait_until(lambda: entry.id in _delivered(r), 30, message=w.logs)
    aborts = r.lrange("test:aborts", 0, -1)
    assert aborts and all(a.endswith(entry.id) for a in aborts)
    assert r.lrange("test:log", 0, -1) == [f"{SES} stop me"]  # never sent again
    assert outbox.list(WS, SES) == []
