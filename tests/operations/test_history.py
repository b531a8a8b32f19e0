"""Per-minute history in Valkey (README "Dashboard"): what the scripts count on
accept and park, what workers count from their settles and write off the delivery path,
the minute's depth sample, the TTL bound, and that a window of 0 writes nothing."""

from __future__ import annotations

import asyncio

import pytest
import redis

from django_outbox import LEDGER_STATE_TURN_ENDED, Verdict
from django_outbox.core.errors import Duplicate, OutboxFull, OutboxUnavailable
from django_outbox.core.heartbeats import WorkerHeartbeat
from django_outbox.core.history import (
    LATENCY_BUCKETS,
    MAX_PENDING_MINUTES,
    History,
    HistoryCounter,
    HistoryMinute,
    latency_bucket,
)
from django_outbox.core.keys import KeySpace
from django_outbox.core.worker import Worker
from tests.conftest import ON_CLUSTER
from tests.support.helpers import NO_USER_BOUNDS, SES, WS, accept
from tests.support.scenarios import ambiguous
from tests.support.valkey import wait_until
from tests.support.workers import Workers, accept_many

T0 = 1_900_000_020.0  # an injected clock: 20 s into minute 31,666,667
MINUTE = int(T0) // 60


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def sample(outbox, worker_id: str = "a") -> bool:
    """``outbox.asample_history(worker_id)`` in its own event loop (closed after)."""

    async def run() -> bool:
        try:
            return await outbox.asample_history(worker_id)
        finally:
            await outbox.aclose()

    return asyncio.run(run())


def hist(r, minute: int, ws: str | None = None) -> dict[str, int]:
    key = f"outboxhist:{{{ws}}}:{minute}" if ws else f"outboxhist:{minute}"
    return {k: int(v) for k, v in r.hgetall(key).items()}


# -- counted by the scripts ------------------------------------------------------------------


def test_accepts_are_counted_once_in_the_minute_of_valkeys_clock(make_outbox, r):
    clock = Clock()
    outbox = make_outbox(clock=clock, cap=3, **NO_USER_BOUNDS)
    for n in range(3):
        accept(outbox, f"k{n}", f"text {n}")
    with pytest.raises(Duplicate):
        accept(outbox, "k0", "text 0")  # a resend of the same key: not a new accept
    with pytest.raises(OutboxFull):
        accept(outbox, "k9", "one too many")  # refused: nothing counted
    accept(outbox, "k0", "text 0", ses="s2")
    clock.now += 60  # the next minute
    accept(outbox, "k1", "text 1", ses="s2")

    assert hist(r, MINUTE, WS) == {"a": 4}
    assert hist(r, MINUTE + 1, WS) == {"a": 1}
    if not ON_CLUSTER:  # the total lives in another slot there (see the sampler test)
        assert hist(r, MINUTE, None) == {"a": 4}
    history = outbox.history(minutes=3, workspace_id=WS)
    assert [m.minute for m in history.minutes] == [MINUTE - 1, MINUTE, MINUTE + 1]
    assert [m.get("a") for m in history.minutes] == [0, 4, 1]
    assert history.total("a") == 5


def test_history_keys_expire_after_the_window(make_outbox, r):
    outbox = make_outbox(clock=Clock(), history_window=600)
    accept(outbox, "k1", "hello")
    keys = [f"outboxhist:{{w1}}:{MINUTE}"] + ([] if ON_CLUSTER else [f"outboxhist:{MINUTE}"])
    for key in keys:
        assert 600_000 < r.pttl(key) <= 720_000  # the window + 2 minutes


def test_a_window_of_zero_writes_no_history(make_outbox, r):
    outbox = make_outbox(clock=Clock(), history_window=0)
    accept(outbox, "k1", "hello")
    outbox.park_workspace(WS, reason="maintenance")
    assert hist(r, MINUTE, WS) == {} and hist(r, MINUTE, None) == {}
    assert outbox.history(minutes=5, workspace_id=WS).total("a") == 0


def test_a_ledger_confirmation_counts_as_delivered(make_outbox, r):
    clock = Clock()

    async def probe(**kwargs):
        return LEDGER_STATE_TURN_ENDED

    outbox = make_outbox(clock=clock, ledger_probe=probe, max_attempts=1)
    accept(outbox, "k1", "hello")

    async def fail_then_sweep():
        async def refused(entry, **kwargs):
            raise RuntimeError("refused")

        try:
            await outbox.adeliver_once(WS, SES, deliverer=refused)
            assert await outbox.asweep_workspace_parked_errors(WS) == 1
            await outbox.aflush_history(outbox.history_counter)
        finally:
            await outbox.aclose()

    asyncio.run(fail_then_sweep())
    assert hist(r, MINUTE, WS) == {"a": 1, "o:failed": 1, "e": 1, "vl": 1}
    (minute,) = [m for m in outbox.history(3, WS).minutes if m.minute == MINUTE]
    assert minute.delivered == 1 and minute.failed == 1


def test_parking_counts_the_entries_it_parks(make_outbox, r):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    accept(outbox, "k1", "one")
    accept(outbox, "k2", "two")
    outbox.park_workspace(WS, reason="maintenance")
    accept(outbox, "k3", "held by the park")
    assert hist(r, MINUTE, WS) == {"a": 3, "p": 3}


# -- counted by the worker -----------------------------------------------------------------


def test_the_worker_writes_outcomes_and_latency(make_outbox, r):
    outbox = make_outbox(
        max_attempts=2, retry_backoff=0, verify_delay=0, verifier=lambda *a, **k: Verdict.DELIVERED
    )

    async def agent(entry, **kwargs):
        if entry.text == "always fails":
            raise RuntimeError("refused")
        if entry.text == "unknown":
            await ambiguous(entry)

    accept(outbox, "k1", "delivered")
    accept(outbox, "k2", "always fails", ses="s2")
    accept(outbox, "k3", "unknown", ses="s3")

    async def run():
        stop = asyncio.Event()
        worker = Worker(outbox, agent, concurrency=4, tick=0.05, stop=stop, once=True)
        await worker.run()
        await outbox.aclose()

    asyncio.run(run())
    history = outbox.history(minutes=2, workspace_id=WS)
    total = outbox.history(minutes=2)
    for h in (history, total):
        assert h.total("d") == 1  # by the deliverer
        assert h.total("v") == 1  # the ambiguous one, confirmed by the verifier
        assert h.total("o:failed") == 2  # both attempts of the failing one
        assert h.total("e") == 1  # ... which then went to error
        assert h.total("o:ambiguous") == 1
        assert sum(h.latency_counts()) == 2  # every delivery has a latency
        assert h.latency_quantile(0.5) in LATENCY_BUCKETS[:8]  # seconds here, not minutes
    assert not outbox.history_counter.pending


def test_deliveries_settled_with_the_next_claim_are_counted(make_outbox):
    # Nobody listens to entry_delivered here, so the worker settles each delivery in the
    # script that claims the session's next entry (settle_next.lua): counted all the same.
    outbox = make_outbox(**NO_USER_BOUNDS)
    for n in range(8):
        accept(outbox, f"k{n}", f"prompt {n}")
    scripts = []
    outbox.step_listeners.append(lambda *args: scripts.append(args))

    async def run():
        worker = Worker(outbox, lambda entry, **kw: None, concurrency=2, tick=0.05,
                        stop=asyncio.Event(), once=True)  # fmt: skip
        await worker.run()
        await outbox.aclose()

    asyncio.run(run())
    assert len(scripts) == 8
    history = outbox.history(minutes=2, workspace_id=WS)
    assert history.total("d") == 8 and sum(history.latency_counts()) == 8


def test_a_settle_that_lost_its_lease_is_not_counted(make_outbox, r):
    outbox = make_outbox()
    accept(outbox, "k1", "hello")
    lock = outbox.keys.session(WS, SES).lock

    async def steal_the_lease(entry, **kwargs):
        r.delete(lock)  # as if it expired and another worker's claim took it

    async def run():
        try:
            await outbox.adeliver_once(WS, SES, deliverer=steal_the_lease)
            await outbox.aflush_history(outbox.history_counter)
        finally:
            await outbox.aclose()

    asyncio.run(run())
    counted = outbox.history(minutes=2, workspace_id=WS)
    # the settle recorded nothing (the outcome is left to verification): nothing counted
    assert sum(sum(m.fields.values()) for m in counted.minutes) == counted.total("a") == 1


def test_a_failed_write_keeps_the_counts_for_the_next(make_outbox, valkey):
    outbox = make_outbox(url="redis://127.0.0.1:1/0")  # nothing listens there
    counter = outbox.history_counter
    counter.add(WS, "d", 2)

    async def flush():
        await outbox.aflush_history(counter)

    with pytest.raises(OutboxUnavailable):
        asyncio.run(flush())
    assert counter.pending
    assert sum(c["d"] for c in counter.take().values()) == 2


def test_the_counter_uses_valkeys_clock_and_the_deliveries_own_time():
    now = {"us": 1_900_000_000_000_000}
    counter = HistoryCounter(KeySpace(), ttl_ms=60_000, clock=lambda: now["us"])
    counter.offset_us = 90_000_000  # Valkey is 90 s ahead of this process
    counter.add("w1", "o:failed")
    ((minute, ws),) = counter.take()
    assert ws == "w1"
    assert minute == (now["us"] + 90_000_000) // 60_000_000
    assert latency_bucket(0.05) == 0 and latency_bucket(7200) == len(LATENCY_BUCKETS) - 1


def test_settles_without_a_worker_are_written_by_adeliver_once(make_outbox):
    # adeliver_once in a loop of its own (no Worker writes the counts): each step writes
    # its own counts before it returns, so nothing piles up in memory.
    clock = Clock()
    outbox = make_outbox(clock=clock, retry_backoff=0, max_attempts=1000, **NO_USER_BOUNDS)

    async def refuse(entry, **kwargs):
        raise RuntimeError("refused")

    async def run(minutes: int) -> None:
        try:
            for _ in range(minutes):
                assert await outbox.adeliver_once(WS, "s1", deliverer=refuse)
                clock.now += 60
        finally:
            await outbox.aclose()

    accept(outbox, "k1", "always refused")
    asyncio.run(run(5))
    assert outbox.history_counter.take() == {}


def test_counts_no_one_writes_are_held_for_a_bounded_number_of_minutes():
    # When the writes fail (Valkey away), a counter given its counts back minute after
    # minute keeps at most MAX_PENDING_MINUTES of them, the newest.
    now = [MINUTE * 60_000_000]
    counter = HistoryCounter(KeySpace(), ttl_ms=60_000, clock=lambda: now[0])
    for _ in range(MAX_PENDING_MINUTES + 30):
        counter.add(WS, "o:failed")
        counter.give_back(counter.take())
        now[0] += 60_000_000
    held = counter.take()
    assert len(held) <= MAX_PENDING_MINUTES + 1
    assert min(minute for minute, _ in held) >= MINUTE + 30 - 1  # the newest are kept
    assert sum(c["o:failed"] for c in held.values()) == len(held)


def test_off_counter_counts_nothing():
    counter = HistoryCounter(KeySpace(), ttl_ms=0)
    counter.add("w1", "d")
    assert not counter.pending


# -- the minute's sample ------------------------------------------------------------------


def test_one_worker_samples_depth_each_minute(make_outbox, r):
    # On the injected clock: on Valkey's, the two samples could fall either side of a
    # minute's turn, and b would rightly sample the next minute.
    outbox = make_outbox(clock=Clock())
    accept(outbox, "k1", "one")
    accept(outbox, "k2", "two", ses="s2")

    assert [sample(outbox, "a"), sample(outbox, "b")] == [True, False]  # b finds it done
    last = outbox.history(minutes=1).minutes[-1]
    assert last.sampled
    assert last.depth() == {"pending": 2}
    assert last.get("workers") == 0
    assert last.get("oldest") >= 0


@pytest.mark.standalone  # (counts the server's script calls)
def test_a_minute_without_changes_reuses_the_last_walk_of_every_session(make_outbox, r):
    # The depth sample walks every session's statuses (one script call each). An idle
    # worker over 100,000 parked sessions did so every minute: make bench measured 13,000
    # commands/s and 10 % of a core where the idle bar is 20 commands/s and 1 %. With no
    # change counted since the last walk, that walk's counts are written again.
    clock = Clock()
    outbox = make_outbox(clock=clock, **NO_USER_BOUNDS)
    for s in range(120):
        accept(outbox, "k", f"text {s}", ses=f"s{s}")

    def script_calls() -> int:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    def the_minutes_sample() -> tuple[int, dict[str, int]]:
        before = script_calls()
        assert sample(outbox)
        return script_calls() - before, hist(r, int(clock.now) // 60)

    calls, fields = the_minutes_sample()
    assert calls >= 120 and fields["n:pending"] == 120  # the first walk
    clock.now += 60
    calls, fields = the_minutes_sample()
    assert calls <= 2 and fields["n:pending"] == 120  # nothing changed: no walk
    clock.now += 60
    busy = WorkerHeartbeat(id="w-busy", last_seen=clock.now, in_flight=1, concurrency=8)

    async def beat():
        try:
            await outbox.abeat(busy, 30)
        finally:
            await outbox.aclose()

    asyncio.run(beat())  # a delivery in flight: its claim is not counted until it settles
    calls, fields = the_minutes_sample()
    assert calls >= 120 and fields["workers"] == 1
    r.delete("outboxworkers", "outboxworker:w-busy")
    clock.now += 60
    outbox.dismiss(WS, "s7", outbox.list(WS, "s7")[0].id)  # an operator's change
    calls, fields = the_minutes_sample()
    assert calls >= 119 and fields["n:pending"] == 119
    clock.now += 60
    accept(outbox, "k2", "one more", ses="s8")  # an accept
    calls, fields = the_minutes_sample()
    assert calls >= 120 and fields["n:pending"] == 120
    clock.now += 60 * 60  # an hour without changes: walked all the same
    calls, fields = the_minutes_sample()
    assert calls >= 120 and fields["n:pending"] == 120


@pytest.mark.standalone  # (a cluster's total learns of accepts a minute later, rolled up)
def test_a_change_counted_while_the_depth_walk_runs_is_walked_again(make_outbox):
    # The mark of a walk holds the changes counted before it started: an accept that
    # lands while the sessions are being read (after its session was) is not in the
    # walk's counts, so the next minute must walk again rather than reuse them.
    clock = Clock()
    outbox = make_outbox(clock=clock, **NO_USER_BOUNDS)
    accept(outbox, "k0", "first")
    walk = outbox.entry_counts

    def entry_counts_with_an_accept_meanwhile(*args, **kwargs):
        counts = walk(*args, **kwargs)
        if outbox.history(minutes=1).minutes[-1].get("a") == 1:
            accept(outbox, "k1", "second", ses="s2")
        return counts

    outbox.entry_counts = entry_counts_with_an_accept_meanwhile

    assert sample(outbox)
    assert outbox.history(minutes=1).minutes[-1].depth() == {"pending": 1}  # read before
    clock.now += 60
    assert sample(outbox)
    assert outbox.history(minutes=1).minutes[-1].depth() == {"pending": 2}


def test_on_a_cluster_the_sampler_adds_accepts_into_the_total(cluster_outbox, cluster_node_url):
    clock = Clock()
    outbox = cluster_outbox(clock=clock)
    r = redis.Redis.from_url(cluster_node_url, decode_responses=True)
    accept(outbox, "k1", "one")
    accept(outbox, "k2", "two", ws="w2")
    outbox.park_workspace("w2", reason="maintenance")
    r.hset(f"outboxhist:{{w2}}:{MINUTE}", "vl", 1)  # as the ledger sweep's script writes it
    clock.now += 60

    assert sample(outbox)
    assert hist(r, MINUTE, None) == {"a": 2, "p": 1, "vl": 1}
    r.close()


def test_on_a_cluster_the_rollup_keeps_the_cleanups_counted_in_the_total(
    cluster_outbox, cluster_node_url
):
    # A cleanup counts 'x' straight into the total (the workspace's HASH goes with
    # it); the sampler a minute later adds the workspaces' counts of that minute into
    # the total. Written over rather than added, the cleanups' 'x' was lost, and the
    # minute's count of changes could come out as the walk saw it though an accept
    # and a retry landed after it: the last walk was reused for up to an hour.
    clock = Clock()
    outbox = cluster_outbox(clock=clock, **NO_USER_BOUNDS)
    r = redis.Redis.from_url(cluster_node_url, decode_responses=True)
    accept(outbox, "k1", "one", ws="w1")
    accept(outbox, "k2", "two", ws="w2")
    accept(outbox, "k3", "three", ws="w3")

    clock.now += 60
    outbox.cleanup_workspace("w2")
    outbox.cleanup_workspace("w3")
    assert sample(outbox)  # walked: the cleanups were counted before
    minute = int(clock.now) // 60
    assert hist(r, minute)["n:pending"] == 1
    accept(outbox, "k4", "four", ws="w1", ses="s2")  # after the walk
    outbox.retry("w1", SES, outbox.list("w1", SES)[0].id)  # a pending entry: due now
    for _ in range(2):
        clock.now += 60
        assert sample(outbox)
    assert hist(r, int(clock.now) // 60)["n:pending"] == 2
    assert hist(r, minute)["x"] == 3  # two cleanups and the retry
    r.close()


# -- real worker processes ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.standalone  # the processes' settings name a standalone server
def test_worker_processes_write_every_delivery(make_outbox, r, valkey, tmp_path):
    outbox = make_outbox(**NO_USER_BOUNDS)
    accept_many(outbox, 10, 6)  # 60 prompts over 10 sessions
    w = Workers(valkey, tmp_path, OUTBOX_TEST_TURN="0.002")
    try:
        w.start("--tick", "0.2")
        w.start("--tick", "0.2")
        wait_until(
            lambda: outbox.history(minutes=3).total("d") == 60,
            30,
            0.1,
            message="60 deliveries in the history",
        )
        # one of them samples depth, FIRST_SAMPLE_AFTER (5 s) after it started
        wait_until(
            lambda: any(m.sampled for m in outbox.history(minutes=3).minutes),
            30,
            0.2,
            message="a minute sampled",
        )
    finally:
        w.stop_all()
    history = outbox.history(minutes=3)
    assert history.total("a") == 60
    assert sum(history.latency_counts()) == 60
    per_ws = outbox.history(minutes=3, workspace_id=WS)
    assert per_ws.total("d") == 60 and per_ws.total("a") == 60


# -- the edges of the window, the buckets and the held minutes ---------------------------------


def test_a_latency_exactly_at_a_bucket_bound_counts_in_that_bucket():
    # Prometheus' "le": a bucket holds every latency up to and including its bound.
    bounded = [b for b in LATENCY_BUCKETS if b != float("inf")]
    assert [latency_bucket(b) for b in bounded] == list(range(len(bounded)))
    assert [latency_bucket(b * 1.001) for b in bounded] == list(range(1, len(bounded) + 1))


def test_a_quantile_whose_rank_ends_a_bucket_is_that_buckets_bound():
    # Two deliveries, one in the first bucket and one in the third: the median's rank
    # (1 of 2) is reached at the end of the first bucket, so the median is its bound.
    minute = HistoryMinute(MINUTE, {"l0": 1, "l2": 1})
    history = History([minute], None, T0)
    assert history.latency_quantile(0.5) == LATENCY_BUCKETS[0]
    assert history.latency_quantile(1.0) == LATENCY_BUCKETS[2]


def test_a_window_of_exactly_31_days_is_read_and_one_minute_more_is_refused(outbox):
    assert len(outbox.history(minutes=44_640).minutes) == 44_640
    assert len(outbox.history(minutes=1).minutes) == 1
    for minutes in (0, 44_641):
        with pytest.raises(ValueError, match="1 to 44640"):
            outbox.history(minutes=minutes)


def test_held_counts_keep_the_oldest_minute_of_the_bound_and_drop_the_one_before():
    now = MINUTE * 60_000_000
    counter = HistoryCounter(KeySpace(), ttl_ms=60_000, clock=lambda: now)
    edge = (MINUTE - MAX_PENDING_MINUTES) * 60_000_000
    counter.add(WS, "o:failed", at_us=edge)  # the oldest minute still held
    counter.add(WS, "o:failed", at_us=edge - 60_000_000)  # one minute older: dropped
    assert list(counter.take()) == [(MINUTE - MAX_PENDING_MINUTES, WS)]
