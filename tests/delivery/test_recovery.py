"""Crash recovery and stale leases at the storage level (README "The worker")."""

import asyncio
import os
import subprocess
import sys
import time

import pytest

from django_outbox import DismissResult, RetryResult, Status, Verdict
from tests.support.helpers import accept
from tests.support.paths import ROOT
from tests.support.valkey import wait_until

WS, SES = "w1", "s1"


def start_child(valkey, lock_ttl, hang_on):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.children.crash",
            valkey,
            WS,
            SES,
            str(lock_ttl),
            hang_on,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def kill_when_hung(child, r, text):
    try:
        wait_until(
            lambda: f"{text}:started" in r.lrange("test:log", 0, -1),
            20,
            message=f"child is inside the deliverer for {text}",
        )
    finally:
        child.kill()
        child.wait(10)


async def drain(outbox, deliverer, limit=20):
    for _ in range(limit):
        if not await outbox.adeliver_once(WS, SES, deliverer=deliverer):
            break


def test_sigkilled_delivery_is_recovered_as_verifying(make_outbox, r, valkey):
    outbox = make_outbox()
    accept(outbox, "m1")
    m2 = accept(outbox, "m2")
    child = start_child(valkey, 1.0, "m2")
    kill_when_hung(child, r, "m2")
    assert [(e.text, e.status) for e in outbox.list(WS, SES)] == [("m2", Status.DELIVERING)]
    assert outbox.recover() == 0  # the dead holder's lease still stands: never stolen
    wait_until(lambda: not r.exists("outboxlock:{w1}:s1"), 5, message="lease expires")
    assert outbox.recover() == 1
    entry = outbox.list(WS, SES)[0]
    assert (entry.id, entry.status, entry.attempts) == (m2.id, Status.VERIFYING, 0)
    assert outbox.recover() == 0


@pytest.mark.parametrize("verdict", [Verdict.DELIVERED, Verdict.ABSENT])
async def test_case_01_a_crash_mid_delivery_is_verified_and_resent_only_if_absent(
    make_outbox, r, valkey, signals_log, verdict
):
    outbox = make_outbox(verify_delay=0, retry_backoff=0)
    _, m2, m3 = [accept(outbox, t) for t in ("m1", "m2", "m3")]
    child = start_child(valkey, 1.0, "m2")
    await asyncio.to_thread(kill_when_hung, child, r, "m2")
    await asyncio.to_thread(wait_until, lambda: not r.exists("outboxlock:{w1}:s1"), 5)
    assert await outbox.arecover() == 1
    assert [(e.text, e.status) for e in await outbox.alist(WS, SES)] == [
        ("m2", Status.VERIFYING),
        ("m3", Status.PENDING),
    ]

    verified = []

    async def verify(entry, **kwargs):
        verified.append(entry.text)
        return verdict

    async def deliver(entry, **kwargs):
        r.rpush("test:log", entry.text)

    outbox.verifier = verify
    await drain(outbox, deliver)
    log = r.lrange("test:log", 0, -1)
    expected = (
        ["m1", "m2:started", "m3"]
        if verdict is Verdict.DELIVERED
        else ["m1", "m2:started", "m2", "m3"]
    )
    assert log == expected
    assert verified == ["m2"]
    assert signals_log.ids("delivered").count(m2.id) == 1
    assert m3.id in signals_log.ids("delivered")
    assert await outbox.alist(WS, SES) == []
    await outbox.aclose()


async def test_case_02_dead_lease_freezes_then_resolves(make_outbox, r, valkey):
    outbox = make_outbox(verify_delay=0)
    m1 = accept(outbox, "m1")
    child = start_child(valkey, 2.0, "m1")
    await asyncio.to_thread(kill_when_hung, child, r, "m1")
    m2 = await outbox.aaccept(WS, SES, user_id="u", client_message_id="m2", text="m2")

    first = next(e for e in await outbox.alist(WS, SES) if e.id == m2.id)
    assert first.blocked_by_in_flight and first.in_flight_for is not None
    await asyncio.sleep(0.2)
    later = next(e for e in await outbox.alist(WS, SES) if e.id == m2.id)
    assert later.in_flight_for > first.in_flight_for
    assert await outbox.aretry(WS, SES, m1.id) is RetryResult.BUSY
    assert await outbox.adismiss(WS, SES, m1.id) is DismissResult.BUSY
    assert await outbox.arecover() == 0

    delivered = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.text)

    async def verify(entry, **kwargs):
        return Verdict.DELIVERED

    outbox.verifier = verify
    assert not await outbox.adeliver_once(WS, SES, deliverer=deliver)  # frozen, not stolen
    started = time.monotonic()
    while await outbox.alist(WS, SES):
        assert time.monotonic() - started < 5, "resolved within LOCK_TTL"
        if not await outbox.adeliver_once(WS, SES, deliverer=deliver):
            await asyncio.sleep(0.05)
    assert delivered == ["m2"]  # m1 resolved by verification, not resent
    await outbox.aclose()
