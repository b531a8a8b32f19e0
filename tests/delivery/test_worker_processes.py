"""outbox_worker processes against one Valkey: order, crashes, signals."""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.support.helpers import NO_USER_BOUNDS
from tests.support.valkey import wait_until
from tests.support.workers import (
    Workers,
    accept_many,
    check_invariants,
    delivered_signals,
    wait_delivered,
)

# The worker processes' settings (tests.support.settings.worker) name a standalone server.
pytestmark = [pytest.mark.slow, pytest.mark.standalone]


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


def test_200_messages_over_20_sessions_two_workers(make_outbox, r, workers):
    outbox = make_outbox(**NO_USER_BOUNDS)  # "u" stands in for many users
    ids = accept_many(outbox, 20, 10)
    w = workers(OUTBOX_TEST_TURN="0.005")
    w.start("--tick", "0.2")
    w.start("--tick", "0.2")
    wait_delivered(r, 200, 60)
    w.wait_running(outbox)  # on a loaded host one may still be starting when the other is done
    w.stop_all()
    assert [p.returncode for p in w.procs] == [0, 0], w.logs()
    check_invariants(outbox, r, ids)


@pytest.mark.parametrize("count", [2, 3])
def test_random_sigkills_lose_nothing(make_outbox, r, workers, count):
    outbox = make_outbox(**NO_USER_BOUNDS)  # "u" stands in for many users
    rng = random.Random(count)
    ids = accept_many(outbox, 20, 15)
    w = workers(
        OUTBOX_TEST_TURN="0.25",
        OUTBOX_TEST_LOCK_TTL="1",
        OUTBOX_TEST_FAULTS="fail=0.05,ambiguous=0.05,transient=0.05",
    )
    for _ in range(count):
        w.start("--tick", "0.1")
    kills = 0
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(delivered_signals(r)) < 300:
        time.sleep(rng.uniform(0.3, 1.0))
        victim = rng.choice(w.live())
        victim.kill()
        victim.wait(5)
        kills += 1
        w.start("--tick", "0.1")
    wait_delivered(r, 300, 60)
    w.stop_all()
    assert kills > 3
    replays = check_invariants(outbox, r, ids, sigkills=True)
    assert replays <= kills
    print(f"{count} workers: {kills} SIGKILLs, 300 delivered, {replays} entry_delivered replays")


def test_sigterm_finishes_the_delivery_and_exits_0(outbox, r, workers):
    first = outbox.accept("w1", "s1", user_id="u", client_message_id="a", text="0")
    outbox.accept("w1", "s1", user_id="u", client_message_id="b", text="1")
    w = workers(OUTBOX_TEST_TURN="1.0")
    proc = w.start("--grace", "10")
    wait_until(lambda: r.llen("test:log") == 1, 20, message="delivery started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(15) == 0, w.logs()
    assert [i for i, _ in delivered_signals(r)] == [first.id]
    assert [e.text for e in outbox.list("w1", "s1")] == ["1"]
    assert "SIGTERM received" in w.logs()


def test_killed_workers_session_resumes_within_lock_ttl_plus_a_tick(outbox, r, workers):
    # a stale lease end to end: LOCK_TTL 2 s, tick 0.2 s
    m1 = outbox.accept("w1", "s1", user_id="u", client_message_id="a", text="0")
    m2 = outbox.accept("w1", "s1", user_id="u", client_message_id="b", text="1")
    slow = workers(OUTBOX_TEST_TURN="30", OUTBOX_TEST_LOCK_TTL="2")
    fast = workers(OUTBOX_TEST_TURN="0", OUTBOX_TEST_LOCK_TTL="2")
    victim = slow.start("--tick", "0.2")
    wait_until(lambda: r.llen("test:log") == 1, 20, message="m1 in its turn")
    fast.start("--tick", "0.2")
    # The survivor runs (its heartbeat is out) while the dead lease still stands: a loaded
    # host's seconds of importing Django are not part of what is measured.
    fast.wait_running(outbox)
    victim.kill()
    victim.wait(5)
    killed_at = time.monotonic()
    entry = next(e for e in outbox.list("w1", "s1") if e.id == m2.id)
    assert entry.blocked_by_in_flight
    wait_until(lambda: len(delivered_signals(r)) == 2, 10, 0.02, message="both delivered")
    elapsed = time.monotonic() - killed_at
    assert elapsed < 2 + 0.2 + 1.5, f"resumed after {elapsed:.2f}s"
    assert [i for i, _ in delivered_signals(r)] == [m1.id, m2.id]
    assert r.lrange("test:log", 0, -1) == ["s1 0", "s1 1"]  # m1 verified, not resent


def test_refuses_to_start_on_an_evicting_valkey(r, workers):
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        w = workers()
        proc = w.start("--once")
        assert proc.wait(30) != 0
        assert "noeviction" in w.logs()
        proc = w.start("--once", "--allow-eviction")
        assert proc.wait(30) == 0, w.logs()
        assert "WARNING" in w.logs()
    finally:
        r.config_set("maxmemory-policy", "noeviction")


def test_grace_zero_is_a_valid_grace_and_a_negative_one_is_refused(outbox, r, workers):
    """``--grace 0`` stops without waiting for a delivery in flight: a valid choice, the
    worker starts and delivers; only a negative grace is refused, exit 1
    (docs/reference/commands.md#outbox_worker)."""
    outbox.accept("w1", "s1", user_id="u", client_message_id="a", text="0")
    w = workers()
    assert w.start("--once", "--grace", "-1").wait(30) == 1
    assert "--grace must not be negative" in w.logs()
    assert w.start("--once", "--grace", "0").wait(30) == 0, w.logs()
    assert r.lrange("test:log", 0, -1) == ["s1 0"]


def test_check_reports_live_workers(outbox, r, workers):
    w = workers()
    assert w.start("--check").wait(30) == 1
    w.start()
    wait_until(lambda: r.zcard("outboxworkers") == 1, 20, message="heartbeat")
    assert w.start("--check").wait(30) == 0
