"""Regression tests from an adversarial review of the core, against the real Valkey.

Each test failed on the code as reviewed; its docstring gives the interleaving
that broke an invariant. The fixes: a per-session sequence number orders the
queue (not clocks); every read of a transition before its first write; strict
types for seeded entries and no duplicate seeded IDs; a sync deliverer keeps its
lease until its thread returns; cluster-safe script loading and lease renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import pytest

from django_outbox import Entry, Status, Verdict
from django_outbox.core.entry import format_time, new_entry_id

WS, SES = "w1", "s1"


async def accept(outbox, key, ses=SES, ws=WS):
    return await outbox.aaccept(ws, ses, user_id="u", client_message_id=key, text=key)


async def failing(entry, **kwargs):
    raise RuntimeError("agent said 500")


# --- 1. FIFO is rebuilt from acceptedAt, not from the queue position ----------------


async def test_failed_head_is_reinserted_behind_a_later_message_under_clock_skew(make_outbox):
    """Strict FIFO breaks when accept clocks disagree (two web servers, 1 s skew).

    web-1 (clock 1 s ahead) accepts A, then web-2 (correct clock) accepts B:
    the queue is [A, B] (arrival order) but A.acceptedAt > B.acceptedAt.
    The worker stages A; A fails (proven not delivered) and settle.lua puts it
    back with insert_ordered(), which places it before the first entry with a
    *later acceptedAt* - there is none, so A goes to the tail: [B, A].
    B is now the strict head and is delivered while A is backing off:
    a prompt overtook an earlier one (DESIGN section 5, strict ordering).
    The same happens with equal timestamps (a frozen or coarse clock), since
    insert_ordered only passes entries with a strictly later acceptedAt.
    """
    base = time.time()
    web1 = make_outbox(clock=lambda: base + 1.0)  # NTP-skewed web server
    web2 = make_outbox(clock=lambda: base)
    worker = make_outbox(retry_backoff=5, max_backoff=10)
    delivered = []

    async def record(entry, **kwargs):
        delivered.append(entry.text)

    try:
        a = await accept(web1, "A")
        await accept(web2, "B")
        assert next(e.id for e in await worker.alist(WS, SES)) == a.id  # A arrived first
        assert await worker.adeliver_once(WS, SES, deliverer=failing)  # A fails, backs off 5 s
        await worker.adeliver_once(WS, SES, deliverer=record)
    finally:
        for o in (web1, web2, worker):
            await o.aclose()
    # strict: A (backing off) is the head; nothing behind it may be delivered
    assert delivered == []


# --- 2. a timed-out sync deliverer keeps running: two deliveries in flight ----------


async def test_timed_out_sync_deliverer_keeps_running_while_the_entry_is_resent(make_outbox):
    """DELIVERY_TIMEOUT does not stop a sync deliverer; the session is re-delivered
    while the first call is still running (two in flight, then a duplicate).

    Sync deliverers run in asyncio.to_thread (service._invoke). The timeout in
    _deliver() cancels the *await*, not the thread: the outcome is recorded as
    ambiguous and the lease released while the first call is still sending.
    The verifier (nothing has arrived yet) answers ABSENT, the entry is pending
    again and the next step calls the deliverer a second time - the first call
    is still in flight and will land later: a duplicate turn.
    """
    in_flight = 0
    peak = 0
    lock = threading.Lock()
    unblock = threading.Event()
    calls = []

    def deliver(entry, *, workspace_id, session_id, attempt):
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
            calls.append(attempt)
        try:
            if len(calls) == 1:
                unblock.wait(10)  # a slow connect / long turn
        finally:
            with lock:
                in_flight -= 1

    async def verify(entry, **kwargs):
        return Verdict.ABSENT

    outbox = make_outbox(
        deliverer=deliver,
        verifier=verify,
        delivery_timeout=0.2,
        retry_backoff=0,
        max_backoff=0.1,
        verify_delay=0,
    )
    await accept(outbox, "m1")
    try:
        first = asyncio.create_task(outbox.adeliver_once(WS, SES))
        deadline = time.monotonic() + 5
        while not calls:  # attempt 1 is running in its thread
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + 2  # well past DELIVERY_TIMEOUT (0.2 s)
        while time.monotonic() < deadline:
            assert not await outbox.adeliver_once(WS, SES)  # the lease is still held
            await asyncio.sleep(0.05)
        unblock.set()
        assert await first  # the thread's real outcome is recorded: delivered
        assert await outbox.alist(WS, SES) == []
        assert calls == [1] and peak == 1
    finally:
        unblock.set()
        await outbox.aclose()


# --- 3. a script error after a write half-applies a transition (message lost) ------


async def test_malformed_neighbour_makes_settle_drop_the_staged_entry(make_outbox, r):
    """settle.lua removes the staged entry (LREM staging) *before* insert_ordered()
    decodes the other queue entries; when one of them cannot be split, the
    script raises after the LREM and Valkey does not roll back: the message is
    in neither list - lost.

    seed_entry_for_test accepts a state member holding an object (Entry.from_dict
    checks no types for reason/lastError/parkedFrom). If that object has a
    "clientMessageID" member, split() cuts the entry inside it and cjson fails.
    Claim still works (strict find_head stops at the first due entry), so:
      accept A; seed B (later, malformed); claim A; deliver fails; settle errors.
    """
    outbox = make_outbox()
    a = await accept(outbox, "A")
    b = {
        "id": new_entry_id(),
        "status": "error",
        "reason": {"code": "x", "clientMessageID": "y"},
        "acceptedAt": format_time(int((time.time() + 1) * 1_000_000)),
        "clientMessageID": "B",
        "userID": "u",
        "text": "B",
    }
    with pytest.raises(ValueError, match="reason must be a string"):
        await outbox.aseed_entry_for_test(WS, SES, json.dumps(b))  # refused, nothing stored
    assert [e.id for e in await outbox.alist(WS, SES)] == [a.id]
    with contextlib.suppress(Exception):
        await outbox.adeliver_once(WS, SES, deliverer=failing)
    await outbox.aclose()
    keys = outbox.keys.session(WS, SES)
    stored = r.lrange(keys.queue, 0, -1) + r.lrange(keys.staging, 0, -1)
    assert any(json.loads(raw)["id"] == a.id for raw in stored), "A vanished from Valkey"


async def test_seeding_an_existing_entry_id_makes_it_deliver_twice(make_outbox, signals_log):
    """seed_entry_for_test pushes the JSON as-is without checking that its ID is
    new (accept.lua with cap=0 skips every check), so the same entry can be in
    the queue twice - or in staging and the queue. Each copy is claimed,
    delivered and settled on its own: the deliverer gets the same entry twice and
    entry_delivered fires twice for one entry ID. (The crash-recovery code
    dedupes by ID, recover_staged(); seeding does not.)
    """
    outbox = make_outbox()
    raw = Entry(
        id=new_entry_id(),
        client_message_id="k1",
        user_id="u",
        text="once",
        accepted_at=format_time(int(time.time() * 1_000_000)),
        status=Status.PENDING,
    ).to_json()
    await outbox.aseed_entry_for_test(WS, SES, raw)
    with pytest.raises(ValueError, match="already queued"):
        await outbox.aseed_entry_for_test(WS, SES, raw)  # a harness re-seeding the same fixture
    sent = []

    async def deliver(entry, **kwargs):
        sent.append(entry.id)

    for _ in range(4):
        await outbox.adeliver_once(WS, SES, deliverer=deliver)
    await outbox.aclose()
    assert len(sent) == 1 and len(signals_log.ids("delivered")) == 1


# --- 4-6. Valkey Cluster (CLUSTER=True): one node owning all 16384 slots -----------


async def test_worker_cannot_start_on_a_cluster(cluster_outbox):
    """Worker.run() first calls aload_scripts(), which sends ("SCRIPT", "LOAD", text)
    through execute_command; RedisCluster cannot route a keyless command and
    raises RedisClusterException, so `outbox_worker` / arun() dies at start-up
    on every cluster deployment (service.py aload_scripts/load_scripts).
    """
    delivered = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.id)

    outbox = cluster_outbox(deliverer=deliver)
    entry = await accept(outbox, "m1")
    try:
        await outbox.aload_scripts()  # what the worker does first
        assert await outbox.adeliver_once(WS, SES)
    finally:
        await outbox.aclose()
    assert delivered == [entry.id]


async def test_worker_finds_work_on_a_cluster(cluster_outbox, monkeypatch):
    """Even with scripts loaded lazily (NOSCRIPT path), a cluster worker finds work.

    On a cluster the scripts get no global keys (they live in other slots), so
    accept.lua once never added the workspace anywhere a worker looks and
    accepted messages were never delivered by arun()/outbox_worker. Now each
    script reports an index hint that the client applies to the workspace's
    shard (issue 8).
    """
    delivered = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.id)

    outbox = cluster_outbox(deliverer=deliver)

    async def no_preload():
        return None

    monkeypatch.setattr(outbox, "aload_scripts", no_preload)  # sidestep the start-up crash
    entry = await accept(outbox, "m1")
    await asyncio.wait_for(outbox.arun(once=True, heartbeat=False), 10)
    await outbox.aclose()
    assert delivered == [entry.id]


async def test_lease_renewal_across_workspaces_fails_on_a_cluster(cluster_outbox, signals_log):
    """_LeaseKeeper renews every lease of the loop in ONE renew.lua call whose KEYS
    are the lock/due keys of all held sessions. Two sessions of different
    workspaces live in different slots: the call is refused (CROSSSLOT /
    "all keys must map to the same key slot") every round, so every lease
    expires after LOCK_TTL while the deliveries run. The confirmed deliveries
    then settle as 'lost' and stay staged (to be verified, or to go to error
    'unverifiable' without a verifier), entry_delivered does not fire, and
    another worker may take the session while the first delivery is in flight.
    """

    async def slow(entry, **kwargs):
        await asyncio.sleep(1.0)  # > LOCK_TTL; renewals every 0.2 s should keep the leases

    outbox = cluster_outbox(deliverer=slow, lock_ttl=0.6)
    await accept(outbox, "m1", ws="wa")
    await accept(outbox, "m2", ws="wb")
    results = await asyncio.gather(outbox.adeliver_once("wa", SES), outbox.adeliver_once("wb", SES))
    assert results == [True, True]
    left = await outbox.alist("wa", SES) + await outbox.alist("wb", SES)
    await outbox.aclose()
    assert [(e.text, str(e.status)) for e in left] == []
    assert len(signals_log.ids("delivered")) == 2
