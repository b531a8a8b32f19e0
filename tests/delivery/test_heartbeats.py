"""What a worker's heartbeat says and how long it lasts (docs/reference/commands.md,
"outbox_worker"; the reads in django_outbox/core/heartbeats.py), on the test Valkey: a
worker's record lives ``HEARTBEAT_TTL`` (three beats), workers silent for ten of those are
forgotten at the next beat, the list shows the most recently seen first, an unreadable
record still means a live worker, and presence reports the latest beat of any worker."""

import asyncio

import pytest

from django_outbox.core.heartbeats import HEARTBEAT_INTERVAL, HEARTBEAT_TTL, WorkerHeartbeat
from tests.support.helpers import wait_for
from tests.support.scenarios import amake  # noqa: F401  (the fixture)


def valkey_now(r) -> float:
    seconds, micros = r.time()
    return seconds + micros / 1_000_000


async def test_a_workers_heartbeat_lives_three_beats(amake, r):  # noqa: F811
    outbox = amake(deliverer=lambda *a, **k: None)
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, tick=30))
    await wait_for(lambda: bool(r.zrange(outbox.keys.workers, 0, -1)), 5, interval=0.005)
    (worker_id,) = r.zrange(outbox.keys.workers, 0, -1)
    ttl_ms = r.pttl(outbox.keys.heartbeat(worker_id))
    stop.set()
    await asyncio.wait_for(run, 10)
    assert HEARTBEAT_TTL == 3 * HEARTBEAT_INTERVAL
    assert (HEARTBEAT_TTL - HEARTBEAT_INTERVAL) * 1000 < ttl_ms <= HEARTBEAT_TTL * 1000


async def test_a_beat_forgets_workers_silent_for_ten_ttls_and_keeps_the_others(amake, r):  # noqa: F811
    outbox = amake(deliverer=lambda *a, **k: None)
    now_ms = int(valkey_now(r) * 1000)
    ttl = 2.0
    r.zadd(outbox.keys.workers, {"recent": now_ms - 9 * 2000, "gone": now_ms - 11 * 2000})
    await outbox.abeat(WorkerHeartbeat("me", 0.0, host="h", pid=1), ttl)
    assert sorted(r.zrange(outbox.keys.workers, 0, -1)) == ["me", "recent"]
    assert 0 < r.pttl(outbox.keys.heartbeat("me")) <= 2000


async def test_workers_list_the_live_first_then_the_most_recently_seen(amake, r):  # noqa: F811
    outbox = amake(deliverer=lambda *a, **k: None)
    now_ms = int(valkey_now(r) * 1000)
    r.zadd(outbox.keys.workers, {"older": now_ms - 20_000, "newer": now_ms - 10_000})
    r.zadd(outbox.keys.workers, {"oldest": now_ms - 30_000})
    r.set(outbox.keys.heartbeat("oldest"), "not json {", px=60_000)  # live, record unreadable
    workers = outbox.workers()
    assert [w.id for w in workers] == ["oldest", "newer", "older"]
    assert [w.live for w in workers] == [True, False, False]
    assert workers[0].host is None and workers[0].pid is None
    presence = outbox.worker_presence()
    assert presence.alive
    assert presence.last_seen == pytest.approx((now_ms - 10_000) / 1000, abs=0.01)
    assert [w.id for w in outbox.live_workers()] == ["oldest"]


async def test_a_stopping_worker_takes_itself_off_the_list(amake, r):  # noqa: F811
    outbox = amake(deliverer=lambda *a, **k: None)
    await outbox.abeat(WorkerHeartbeat("me", 0.0), 15.0)
    await outbox.abeat(WorkerHeartbeat("other", 0.0), 15.0)
    await outbox.aforget_worker("me")
    assert r.zrange(outbox.keys.workers, 0, -1) == ["other"]
    assert r.exists(outbox.keys.heartbeat("me")) == 0
