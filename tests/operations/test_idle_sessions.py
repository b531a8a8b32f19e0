"""An idle session costs nothing once its idempotency window has passed.

A chat UI opens a new session per prompt: each is delivered and goes idle. An empty
session is looked at again when the last of its dedupe markers expires (``DEDUPE_TTL``
after its last accept); the claim that finds it still empty then deletes its keys and
takes it out of its workspace's and the global indices. Until then a resend of one of its
prompts is still a duplicate; after it, a client that comes back starts at a version above
every one it was sent. docs/howto/valkey.md, "Capacity".
"""

from __future__ import annotations

import asyncio

import pytest

from django_outbox.errors import Duplicate
from django_outbox.testing import wait_until
from tests.support.helpers import accept

WS = "w1"
T0 = 1_764_466_959.0  # seconds


async def noop(entry, **kwargs):
    return None


def step(outbox, ses: str) -> bool:
    """One delivery step for the session, on a loop of its own (closed after)."""

    async def run() -> bool:
        try:
            return await outbox.adeliver_once(WS, ses)
        finally:
            await outbox.aclose()

    return asyncio.run(run())


def drain(outbox) -> None:
    """One worker run until nothing is due now, on a loop of its own (closed after)."""

    async def run() -> None:
        try:
            await outbox.arun(once=True, heartbeat=False)
        finally:
            await outbox.aclose()

    asyncio.run(run())


def idle_outbox(make_outbox, clock=None, dedupe_ttl=60):
    return make_outbox(
        deliverer=noop,
        dedupe_ttl=dedupe_ttl,
        history_window=0,  # the per-minute history keeps its own keys for its window
        user_accepts_per_minute=0,  # no bucket state left behind per user
        user_max_queued=0,
        clock=None if clock is None else (lambda: clock[0]),
    )


def session_keys(r, ses):
    """Every key of the session, and the indices that still name it."""
    keys = [k for k in r.keys(f"*{{{WS}}}*") if k.endswith(f":{ses}")]
    named = [
        name
        for name, present in (
            ("sessions", r.sismember(f"outboxsessions:{{{WS}}}", ses)),
            ("due", r.zscore(f"outboxdue:{{{WS}}}", ses) is not None),
            ("allsessions", r.zscore("outboxallsessions", f"{WS} {ses}") is not None),
            ("attention", r.zscore("outboxattention", f"{WS} {ses}") is not None),
        )
        if present
    ]
    return sorted(keys), named


@pytest.mark.standalone
def test_an_emptied_session_is_kept_for_its_dedupe_window_then_reclaimed(make_outbox, r):
    clock = [T0]
    outbox = idle_outbox(make_outbox, clock)
    first = accept(outbox, "k1", "hello", ses="s1")
    assert step(outbox, "s1")
    # Empty now; looked at again when its marker expires, a minute after the accept.
    assert r.zscore(f"outboxdue:{{{WS}}}", "s1") == (T0 + 60) * 1000
    version = outbox.snapshot(WS, "s1").version

    clock[0] = T0 + 30  # inside the window: a claim keeps it, a resend is a duplicate
    assert not step(outbox, "s1")
    with pytest.raises(Duplicate) as info:
        accept(outbox, "k1", "hello", ses="s1")
    assert info.value.accepted_id == first.id
    keys, named = session_keys(r, "s1")
    assert keys and set(named) == {"sessions", "due", "allsessions"}

    clock[0] = T0 + 61  # the window has passed: the next claim reclaims it
    assert not step(outbox, "s1")
    assert session_keys(r, "s1") == ([], [])
    assert not r.exists("outboxworkspaces", "outboxwsdue")  # its workspace had no other

    # A client that comes back: its new prompt is accepted at a version above every one
    # the session had. (Its old key's marker expires on Valkey's own clock, which this
    # test does not move: the last test waits for real expiry.)
    accept(outbox, "k2", "hello again", ses="s1")
    assert outbox.snapshot(WS, "s1").version > version


@pytest.mark.standalone
def test_a_session_accepted_into_again_inside_its_window_is_not_reclaimed(make_outbox, r):
    clock = [T0]
    outbox = idle_outbox(make_outbox, clock)
    accept(outbox, "k1", "one", ses="s1")
    assert step(outbox, "s1")
    clock[0] = T0 + 50
    accept(outbox, "k2", "two", ses="s1")  # due now again, not at its reclaim time
    assert r.zscore(f"outboxdue:{{{WS}}}", "s1") == (T0 + 50) * 1000
    clock[0] = T0 + 61  # the first marker has expired, the second has not
    assert step(outbox, "s1")  # "two" is delivered
    assert not step(outbox, "s1")
    keys, named = session_keys(r, "s1")
    assert keys and "sessions" in named
    assert r.zscore(f"outboxdue:{{{WS}}}", "s1") == (T0 + 110) * 1000  # the second's expiry


@pytest.mark.standalone
def test_a_session_with_an_entry_left_is_never_reclaimed(make_outbox, r):
    """Only an empty session is reclaimed: an error entry (waiting for an operator) or a
    parked one keeps the session and its keys however long it waits."""
    clock = [T0]

    async def fails(entry, **kwargs):
        raise RuntimeError("no")

    outbox = make_outbox(deliverer=fails, dedupe_ttl=60, max_attempts=1, clock=lambda: clock[0])
    accept(outbox, "k1", "doomed", ses="s1")
    assert step(outbox, "s1")
    clock[0] = T0 + 3600
    assert not step(outbox, "s1")
    [entry] = outbox.list(WS, "s1")
    assert entry.status == "error"
    assert "sessions" in session_keys(r, "s1")[1]


def stored_bytes(r) -> int:
    """What every key holds (MEMORY USAGE, the key's name and overhead included)."""
    return sum(r.memory_usage(k, samples=0) or 0 for k in r.keys("*"))


@pytest.mark.standalone
def test_idle_sessions_cost_nothing_once_reclaimed(make_outbox, r):
    """200 sessions, one prompt each, delivered: what Valkey stores for them while their
    dedupe window (3 s here, on Valkey's clock: long enough for the accepts and the drain
    on a loaded machine, where 1 s let some markers expire before they were counted) lasts,
    and after a worker's pass once it has passed: nothing."""
    outbox = idle_outbox(make_outbox, dedupe_ttl=3)
    sessions = [f"s{i}" for i in range(200)]
    for ses in sessions:
        accept(outbox, "k", "x" * 100, ses=ses)
    drain(outbox)
    r.delete("outboxwake")
    assert all(not outbox.list(WS, ses) for ses in sessions)
    inside = stored_bytes(r) / len(sessions)

    markers = r.keys("outboxdedupe:*")
    assert len(markers) == len(sessions)
    # (EXISTS deletes an expired key it meets; KEYS only skips it)
    wait_until(lambda: r.exists(*markers) == 0, 15, 0.05, "the markers expired")
    drain(outbox)
    r.delete("outboxwake")
    print(f"bytes per idle session: {inside:.0f} in its dedupe window, {stored_bytes(r)} after")
    assert inside > 200  # the marker, its index, the version: the window is kept
    assert r.dbsize() == 0  # and then nothing at all


def test_a_reclaimed_session_leaves_every_index_standalone_or_cluster(make_outbox):
    """Read through the public reads, so it holds on a cluster too (where the global
    indices live on other shards and learn of the reclaim through the index hint)."""
    clock = [T0]
    outbox = idle_outbox(make_outbox, clock)
    accept(outbox, "k1", "one", ses="s1")
    accept(outbox, "k1", "other", ses="s2")
    assert step(outbox, "s1") and step(outbox, "s2")
    assert outbox.session_counts([WS]) == [2]
    assert outbox.index_totals().sessions == 2
    clock[0] = T0 + 61
    assert not step(outbox, "s1")
    assert outbox.session_counts([WS]) == [1]
    assert outbox.index_totals().sessions == 1
    assert not step(outbox, "s2")
    assert outbox.session_counts([WS]) == [0]
    assert outbox.workspaces() == []
    assert outbox.index_totals() == type(outbox.index_totals())(0, 0, 0)
