"""Valkey SIGKILLed and restarted from its AOF while workers deliver.

With ``appendfsync always`` nothing acknowledged may be lost: every message a
client saw accepted (202, or 200 for a retried key) is delivered exactly once,
in order per session, after Valkey comes back.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from django_outbox import Verdict
from django_outbox.errors import Duplicate, OutboxUnavailable
from tests.support.helpers import NO_USER_BOUNDS
from tests.support.valkey import ValkeyProcess

pytestmark = pytest.mark.slow
SESSIONS, PER_SESSION = 10, 12


async def test_valkey_killed_and_restarted_mid_delivery_loses_nothing(tmp_path, make_outbox):
    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="always").start()
    delivered: list[tuple[str, str]] = []
    seen: set[str] = set()

    async def deliver(entry, *, workspace_id, session_id, attempt):
        seen.add(entry.id)
        delivered.append((session_id, entry.text))
        await asyncio.sleep(0.005)

    async def verify(entry, **kwargs):
        return Verdict.DELIVERED if entry.id in seen else Verdict.ABSENT

    outbox = make_outbox(
        url=server.url,
        deliverer=deliver,
        verifier=verify,
        lock_ttl=1,
        verify_delay=0,
        retry_backoff=0.05,
        max_backoff=0.2,
    )
    client = make_outbox(url=server.url, **NO_USER_BOUNDS)  # "u" stands in for many users
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
    accepted: dict[tuple[str, int], str] = {}

    async def accept_all():
        for n in range(PER_SESSION):
            for s in range(SESSIONS):
                deadline = time.monotonic() + 30
                while True:  # the client's retry loop: same key until acknowledged
                    try:
                        entry = await client.aaccept(
                            "w1", f"s{s}", user_id="u", client_message_id=f"k{n}", text=str(n)
                        )
                        accepted[(f"s{s}", n)] = entry.id
                        break
                    except Duplicate as dup:
                        accepted[(f"s{s}", n)] = dup.accepted_id
                        break
                    except OutboxUnavailable:
                        assert time.monotonic() < deadline, "Valkey did not come back"
                        await asyncio.sleep(0.05)
            await asyncio.sleep(0.02)

    producer = asyncio.create_task(accept_all())
    while len(delivered) < 30:
        await asyncio.sleep(0.01)
    server.kill()  # SIGKILL mid-delivery
    await asyncio.sleep(0.3)
    server.start()  # same port, same AOF
    await producer
    total = SESSIONS * PER_SESSION
    deadline = time.monotonic() + 60
    while len({(s, t) for s, t in delivered}) < total:
        assert time.monotonic() < deadline, f"{len(set(delivered))}/{total} delivered"
        await asyncio.sleep(0.05)
    stop.set()
    await run
    assert len(accepted) == total
    assert len(delivered) == total, "no message was sent twice"
    for s in range(SESSIONS):
        texts = [int(t) for ses, t in delivered if ses == f"s{s}"]
        assert texts == list(range(PER_SESSION)), f"s{s} out of order: {texts}"
    for s in range(SESSIONS):
        assert await outbox.alist("w1", f"s{s}") == []
    await outbox.aclose()
    await client.aclose()
    server.stop()


async def test_connections_cut_again_and_again_lose_nothing(valkey, make_outbox):
    # every connection between worker and Valkey is cut every 100 ms
    from tests.support.proxy import TcpProxy

    port = int(valkey.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port).start()
    delivered: list[tuple[str, str]] = []
    seen: set[str] = set()

    async def deliver(entry, *, workspace_id, session_id, attempt):
        seen.add(entry.id)
        delivered.append((session_id, entry.text))
        await asyncio.sleep(0.05)  # long enough that the cuts land mid-run

    async def verify(entry, **kwargs):
        return Verdict.DELIVERED if entry.id in seen else Verdict.ABSENT

    client = make_outbox(**NO_USER_BOUNDS)  # "u" stands in for many users
    for n in range(PER_SESSION):
        for s in range(SESSIONS):
            await client.aaccept("w1", f"s{s}", user_id="u", client_message_id=f"k{n}", text=str(n))
    outbox = make_outbox(
        url=proxy.url,
        deliverer=deliver,
        verifier=verify,
        lock_ttl=1,
        verify_delay=0,
        retry_backoff=0.05,
        max_backoff=0.2,
    )
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
    cuts = 0
    total = SESSIONS * PER_SESSION
    deadline = time.monotonic() + 60
    while len(set(delivered)) < total:
        assert time.monotonic() < deadline, f"{len(set(delivered))}/{total} delivered"
        await asyncio.sleep(0.05)
        if cuts < 20:
            cuts += proxy.cut_all() > 0
    stop.set()
    await run
    proxy.close()
    assert cuts >= 5
    assert len(delivered) == total, "no message was sent twice"
    for s in range(SESSIONS):
        texts = [int(t) for ses, t in delivered if ses == f"s{s}"]
        assert texts == list(range(PER_SESSION)), f"s{s} out of order: {texts}"
        assert await client.alist("w1", f"s{s}") == []
    await outbox.aclose()
    await client.aclose()


async def test_a_lease_held_through_an_outage_is_handed_back_when_valkey_returns(
    tmp_path, make_outbox, signals_log
):
    # Valkey goes away right after a settle, so the worker's next claim for the
    # session fails. The lease it still holds is handed back once Valkey answers
    # again: before, the one release attempt failed too and the session waited out
    # the whole lease (LOCK_TTL, 30 s here) before its next message was sent.
    import threading

    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="always").start()
    sent: list[str] = []

    async def deliver(entry, *, workspace_id, session_id, attempt):
        sent.append(entry.text)

    outbox = make_outbox(url=server.url, cluster=False, deliverer=deliver, lock_ttl=30)
    client = make_outbox(url=server.url, cluster=False, **NO_USER_BOUNDS)
    for key in ("k0", "k1"):
        await client.aaccept("w1", "s1", user_id="u", client_message_id=key, text=key)
    restarted = threading.Event()

    def outage_after_the_first_settle(step, outcome, result, seconds):
        if step == "deliver" and not restarted.is_set() and server.proc.poll() is None:
            server.kill()  # before the next claim (entry_delivered has a receiver)
            threading.Timer(3, lambda: (server.start(), restarted.set())).start()

    outbox.step_listeners.append(outage_after_the_first_settle)
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
    try:
        deadline = time.monotonic() + 10  # a third of the lease
        while sent != ["k0", "k1"]:
            assert time.monotonic() < deadline, f"sent {sent} (restarted: {restarted.is_set()})"
            await asyncio.sleep(0.05)
        assert restarted.is_set()
    finally:
        stop.set()
        await run
        await outbox.aclose()
        await client.aclose()
        server.stop()
    assert signals_log.ids("delivered") and len(sent) == 2
