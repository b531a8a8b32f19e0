"""Nothing the outbox writes lives without an expiry or a reclaim.

Sessions are emptied every way an entry leaves (delivered, cancelled while queued,
dismissed after an error), then every key of a real Valkey is walked with ``SCAN`` and
``PTTL``: each key left either expires, or is one of the indices the worker's claim
empties when it reclaims an idle session at the end of its idempotency window
(lib/reclaim.lua), or is documented as permanent. Once the window has passed and a worker
has been round, only expiring and permanent keys are left. The dedupe markers' ZSET holds
no more than a bounded number of expired members. docs/explanation/storage.md,
"What lives how long".
"""

from __future__ import annotations

import asyncio

import pytest

from tests.support.helpers import accept

WS = "w1"
T0 = 1_764_466_959.0  # seconds
WINDOW = 60  # DEDUPE_TTL, seconds

#: Keys kept without an expiry by design (docs/explanation/storage.md#what-lives-how-long):
#: the key space's owner claim, and the wake list workers consume (capped at 10,000 items).
PERMANENT = {"outboxowner", "outboxwake"}
#: Indices that name idle sessions until the worker's claim reclaims them (lib/reclaim.lua):
#: the workspace's sessions, due index and per-user state, and the global indices.
RECLAIMED_BY_THE_WORKER = {
    f"outboxsessions:{{{WS}}}",
    f"outboxdue:{{{WS}}}",
    f"outboxusers:{{{WS}}}",
    f"outboxattn:{{{WS}}}",
    "outboxwsdue",
    "outboxworkspaces",
    "outboxallsessions",
    "outboxattention",
}


async def deliver(entry, **kwargs):
    if entry.text == "doomed":
        raise RuntimeError("no")
    return None


def step(outbox, ses: str) -> bool:
    """One delivery step for the session, on a loop of its own (closed after)."""

    async def run() -> bool:
        try:
            return await outbox.adeliver_once(WS, ses)
        finally:
            await outbox.aclose()

    return asyncio.run(run())


def lifetimes(r) -> dict[str, int]:
    """Every key of the test Valkey and its PTTL (ms; -1: no expiry)."""
    return {key: r.pttl(key) for key in r.scan_iter(count=1000)}


def without_expiry(r) -> set[str]:
    return {key for key, ttl in lifetimes(r).items() if ttl == -1}


def emptied_sessions(make_outbox, clock):
    """Three sessions, each emptied a different way, with the history and the per-user
    bounds on (their keys are part of what is left)."""
    outbox = make_outbox(
        deliverer=deliver,
        dedupe_ttl=WINDOW,
        max_attempts=1,
        history_window=3600,
        clock=lambda: clock[0],
    )
    accept(outbox, "k1", "hello", ses="sent")
    assert step(outbox, "sent")
    accept(outbox, "k1", "first", ses="cancelled")
    queued = accept(outbox, "k2", "second", ses="cancelled")
    outbox.cancel(WS, "cancelled", queued.id)
    assert step(outbox, "cancelled")
    doomed = accept(outbox, "k1", "doomed", ses="dismissed")
    assert step(outbox, "dismissed")
    outbox.dismiss(WS, "dismissed", doomed.id)
    for ses in ("sent", "cancelled", "dismissed"):
        assert outbox.list(WS, ses) == []
    return outbox


@pytest.mark.standalone
def test_every_key_an_emptied_session_leaves_expires_or_is_reclaimed(make_outbox, r):
    clock = [T0]
    outbox = emptied_sessions(make_outbox, clock)

    # Inside the idempotency window: the session keys (version, markers, receipt, record of
    # endings) all expire; what does not is an index the worker's reclaim empties.
    left = without_expiry(r)
    assert left <= PERMANENT | RECLAIMED_BY_THE_WORKER, sorted(left - RECLAIMED_BY_THE_WORKER)
    for ses in ("sent", "cancelled", "dismissed"):
        assert r.pttl(f"outboxver:{{{WS}}}:{ses}") > WINDOW * 1000
        assert 0 < r.pttl(f"outboxmarkers:{{{WS}}}:{ses}") <= WINDOW * 1000

    # The window has passed: a worker's claim reclaims each session, and the indices with it,
    # per-user state included. What is left expires by itself or is permanent.
    clock[0] = T0 + WINDOW + 61  # the user's accept bucket is full again too
    for ses in ("sent", "cancelled", "dismissed"):
        assert not step(outbox, ses)
    left = without_expiry(r)
    assert left <= PERMANENT, sorted(left)
    assert not any(
        f"{{{WS}}}" in key and "hist" not in key and "dedupe" not in key for key in r.keys()
    )


@pytest.mark.standalone
def test_a_session_accepted_into_again_keeps_its_version(make_outbox, r):
    """The version and markers an emptied session was given an expiry for keep without one
    once the session holds an entry again (and get it back when it empties)."""
    clock = [T0]
    outbox = emptied_sessions(make_outbox, clock)
    before = outbox.snapshot(WS, "sent").version
    accept(outbox, "k2", "again", ses="sent")
    assert r.pttl(f"outboxver:{{{WS}}}:sent") == -1
    assert r.pttl(f"outboxmarkers:{{{WS}}}:sent") == -1
    assert outbox.snapshot(WS, "sent").version > before
    assert step(outbox, "sent")
    assert r.pttl(f"outboxver:{{{WS}}}:sent") > 0


def test_expired_dedupe_markers_are_pruned_a_bounded_number_per_call(make_outbox, r):
    """The markers ZSET is scored by expiry: each accept (and each look at an empty
    session's reclaim time) removes up to 32 of its expired members, so it never holds more
    than the live markers and what one call left."""
    clock = [T0]
    outbox = make_outbox(
        deliverer=deliver,
        dedupe_ttl=WINDOW,
        user_accepts_per_minute=0,
        user_max_queued=0,
        cap=50,
        clock=lambda: clock[0],
    )
    for i in range(40):
        accept(outbox, f"old{i}", ses="s1")
    markers = outbox.keys.session(WS, "s1").markers
    assert r.zcard(markers) == 40
    clock[0] = T0 + WINDOW + 1  # every marker has expired
    accept(outbox, "new1", ses="s1")
    assert r.zcard(markers) == 40 - 32 + 1
    accept(outbox, "new2", ses="s1")
    assert sorted(m.rsplit(":", 1)[1] for m in r.zrange(markers, 0, -1)) == ["new1", "new2"]
