"""Leases end when their holder is done, gone or overtaken, and every state a lease can name
answers ``retry``/``dismiss`` as README "The Python API" promises: BUSY only for the entry a
live lease works on."""

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time

import pytest

from django_outbox import DismissResult, RetryResult, Status, Verdict
from django_outbox.core.entry import format_time
from django_outbox.core.step import Claimed
from django_outbox.core.worker import Worker
from tests.support import scenarios
from tests.support.helpers import (
    SES,
    WS,
    BlockingDeliverer,
    aaccept,
    astatuses,
    make_entry,
    wait_for,
)
from tests.support.paths import ROOT
from tests.support.scenarios import ambiguous, nothing

amake = scenarios.amake  # the fixture


def lock_key(outbox) -> str:
    return outbox.keys.session(WS, SES).lock


async def make_verifying(outbox, key="k1"):
    """Accept one entry and leave it verifying (its delivery was ambiguous)."""
    entry = await aaccept(outbox, key)
    assert await outbox.adeliver_once(WS, SES, deliverer=ambiguous)
    assert (await outbox.alist(WS, SES))[0].status is Status.VERIFYING
    return entry


# -- a graceful stop right after a delivery ------------------------------------------------


async def test_graceful_stop_after_a_delivery_gives_the_lease_back(amake, signals_log):
    started = asyncio.Event()

    async def agent(entry, **kwargs):  # a 0.3 s agent
        started.set()
        await asyncio.sleep(0.3)

    first = amake(deliverer=agent, lock_ttl=0.5)
    k1 = await aaccept(first, "k1")
    k2 = await aaccept(first, "k2")
    stop = asyncio.Event()
    run = asyncio.create_task(first.arun(tick=30, stop=stop, heartbeat=False))
    await asyncio.wait_for(started.wait(), 10)
    stop.set()  # during the first delivery: it finishes (grace), then the worker stops
    await asyncio.wait_for(run, 10)
    snap = await first.asnapshot(WS, SES)
    assert snap.lease is None  # handed back, not left to expire
    assert [e.id for e in snap.entries] == [k2.id]
    assert signals_log.ids("delivered") == [k1.id]
    # The next worker finds nothing owed: it delivers k2 and fires k1's signal no more.
    second = amake(deliverer=nothing, lock_ttl=0.5)
    stop2 = asyncio.Event()
    run2 = asyncio.create_task(second.arun(tick=0.05, stop=stop2, heartbeat=False))
    await wait_for(lambda: signals_log.ids("delivered") == [k1.id, k2.id], 10)
    stop2.set()
    await run2
    assert signals_log.ids("delivered") == [k1.id, k2.id]


# -- busy during a verification, and what each lease state answers ---------------------------


async def test_retry_and_dismiss_are_busy_during_a_verification(amake, signals_log):
    asked = asyncio.Event()
    answer = asyncio.Event()

    async def verifier(entry, **kwargs):
        asked.set()
        await answer.wait()
        return Verdict.DELIVERED

    outbox = amake(verifier=verifier, verify_delay=0)
    entry = await make_verifying(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=ambiguous))
    await asyncio.wait_for(asked.wait(), 10)
    assert (await outbox.asnapshot(WS, SES)).lease.entry_id == entry.id
    assert await outbox.aretry(WS, SES, entry.id) is RetryResult.BUSY
    assert await outbox.adismiss(WS, SES, entry.id) is DismissResult.BUSY
    assert await astatuses(outbox) == [("k1", "verifying")]
    answer.set()
    assert await step
    assert signals_log.ids("delivered") == [entry.id]
    assert await outbox.alist(WS, SES) == []
    assert not await outbox.adeliver_once(WS, SES, deliverer=ambiguous)
    assert signals_log.ids("delivered") == [entry.id]


async def test_busy_while_delivering_and_while_parked_in_flight(amake):
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent)
    k1 = await aaccept(outbox, "k1")
    k2 = await aaccept(outbox, "k2")
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    # The lease names k1 (staged, delivering): busy.
    assert await outbox.aretry(WS, SES, k1.id) is RetryResult.BUSY
    assert await outbox.adismiss(WS, SES, k1.id) is DismissResult.BUSY
    # k2 waits behind the lease; the lease does not name it.
    assert await outbox.aretry(WS, SES, k2.id) is RetryResult.UPDATED
    listed = [(e.text, e.blocked_by_in_flight) for e in await outbox.alist(WS, SES)]
    assert listed == [("k1", False), ("k2", True)]  # k2 waits for the lease, k1 holds it
    # Parked mid-delivery: still the lease's entry, still busy.
    assert await outbox.apark_workspace(WS, "hold") == 2
    assert await outbox.aretry(WS, SES, k1.id) is RetryResult.BUSY
    assert await outbox.adismiss(WS, SES, k1.id) is DismissResult.BUSY
    assert await outbox.aretry(WS, SES, k2.id) is RetryResult.BUSY  # parked: only unpark
    assert await outbox.adismiss(WS, SES, k2.id) is DismissResult.REMOVED
    agent.release()
    assert await step
    assert await outbox.alist(WS, SES) == []


async def test_a_pending_entry_behind_a_verification_lease_is_not_busy(amake):
    asked = asyncio.Event()

    async def verifier(entry, **kwargs):
        asked.set()
        await asyncio.Event().wait()

    outbox = amake(verifier=verifier, verify_delay=0)
    await make_verifying(outbox)
    k2 = await aaccept(outbox, "k2")
    step = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=ambiguous))
    await asyncio.wait_for(asked.wait(), 10)
    assert await outbox.adismiss(WS, SES, k2.id) is DismissResult.REMOVED
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    assert await astatuses(outbox) == [("k1", "verifying")]
    assert (await outbox.asnapshot(WS, SES)).lease is None  # a cancelled check gives it back


async def test_a_carried_lease_names_a_delivered_entry_that_is_gone(amake, signals_log):
    outbox = amake()
    k1 = await aaccept(outbox, "k1")
    took, carry = await outbox.astep(WS, SES, nothing)
    assert took and carry is not None
    assert (await outbox.asnapshot(WS, SES)).lease.entry_id == k1.id
    assert await outbox.alist(WS, SES) == []  # delivered: only its signal's ack is owed
    assert await outbox.aretry(WS, SES, k1.id) is RetryResult.NOT_FOUND
    assert await outbox.adismiss(WS, SES, k1.id) is DismissResult.NOT_FOUND
    await outbox.arelease(WS, SES, carry)
    assert (await outbox.asnapshot(WS, SES)).lease is None
    assert not await outbox.adeliver_once(WS, SES, deliverer=nothing)
    assert signals_log.ids("delivered") == [k1.id]


def seed_orphan(outbox, key="k1"):
    """An entry a dead worker left staged, without a lease."""
    entry = make_entry(key, client_message_id=key, status=Status.DELIVERING)
    outbox.seed_entry_for_test(WS, SES, entry.to_json())
    return entry


@pytest.mark.parametrize("op", ["retry", "dismiss"])
def test_staging_without_a_lease_is_not_busy(make_outbox, op):
    outbox = make_outbox()
    entry = seed_orphan(outbox)
    if op == "retry":
        assert outbox.retry(WS, SES, entry.id) is RetryResult.UPDATED
        assert [(e.id, e.status) for e in outbox.list(WS, SES)] == [(entry.id, Status.VERIFYING)]
    else:
        assert outbox.dismiss(WS, SES, entry.id) is DismissResult.REMOVED
        assert outbox.list(WS, SES) == []


# -- a holder whose lease vanished --------------------------------------------------------


async def test_a_holder_whose_lease_vanished_records_nothing(amake, r, signals_log):
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent, verifier=lambda entry, **kw: Verdict.DELIVERED)
    entry = await aaccept(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    assert r.delete(lock_key(outbox)) == 1  # expired, or lost in a failover; nobody holds it
    agent.release()
    assert await step
    assert signals_log.ids("delivered") == []
    assert await astatuses(outbox) == [("k1", "delivering")]  # left for verification
    # The next claim recovers it as verifying, and the verifier confirms it: no resend.
    assert await outbox.adeliver_once(WS, SES)
    assert agent.calls == ["k1"]
    assert signals_log.ids("delivered") == [entry.id]


async def test_a_holder_overtaken_by_another_lease_records_nothing(amake, r, signals_log):
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent)
    entry = await aaccept(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    r.set(lock_key(outbox), f"other.1 1 {entry.id}", px=60_000)
    agent.release()
    assert await step
    assert signals_log.ids("delivered") == []
    assert await astatuses(outbox) == [("k1", "delivering")]


async def test_a_holder_whose_renewal_finds_the_lease_taken_says_so(amake, r, caplog):
    """The lease keeper notes a lease it could not renew, and the step that held it logs
    that its delivery's outcome is left to verification (docs/explanation/lifecycle.md)."""
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent, lock_ttl=0.6)  # a renewal round every 0.2 s
    entry = await aaccept(outbox)
    with caplog.at_level(logging.WARNING, "django_outbox"):
        step = asyncio.create_task(outbox.adeliver_once(WS, SES))
        await asyncio.wait_for(agent.started.wait(), 10)
        r.set(lock_key(outbox), f"other.1 1 {entry.id}", px=60_000)
        await wait_for(lambda: "lost before the delivery ended" in caplog.text, 10)
        agent.release()
        assert await step
    assert f"lease lost while delivering {WS}/{SES} {entry.id}" in caplog.text
    assert await astatuses(outbox) == [("k1", "delivering")]


# -- cleanup while a delivery is in flight -------------------------------------------------


def workspace_traces(outbox, r, ws=WS) -> list[str]:
    """Every key of the workspace, and every global index that still names it."""
    keys = [k for k in r.keys(f"*{{{ws}}}*")]
    k = outbox.keys
    for name, hit in (
        ("wsdue", r.zscore(k.workspaces_due, ws) is not None),
        ("workspaces", r.sismember(k.workspaces, ws)),
        ("allsessions", r.zscore(k.all_sessions, f"{ws} {SES}") is not None),
        ("attention", r.zscore(k.attention, f"{ws} {SES}") is not None),
    ):
        if hit:
            keys.append(f"index {name}")
    return keys


@pytest.mark.standalone
async def test_cleanup_during_a_delivery_removes_the_lease_too(amake, r, signals_log):
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent)
    await aaccept(outbox, "k1")
    await aaccept(outbox, "k2")
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    assert await outbox.acleanup_workspace(WS) > 0
    assert workspace_traces(outbox, r) == []
    agent.release()
    assert await step
    assert workspace_traces(outbox, r) == []  # the settle found no lease: wrote nothing
    assert signals_log.ids("delivered") == []


# -- a SIGKILLed holder's lease expires within LOCK_TTL -----------------------------------


def start_child(valkey, lock_ttl, mode):
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.children.lease",
            valkey,
            WS,
            SES,
            str(lock_ttl),
            mode,
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def seed_owed(outbox, key="k1"):
    """A delivered entry whose entry_delivered its dead holder never acknowledged."""
    entry = make_entry(
        key,
        client_message_id=key,
        status=Status.DELIVERING,
        delivered_at=format_time(int(time.time() * 1_000_000)),
    )
    outbox.seed_entry_for_test(WS, SES, entry.to_json())
    return entry


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["verify", "owed"])
async def test_a_sigkilled_holders_lease_expires_within_lock_ttl(
    amake, r, valkey, signals_log, mode
):
    lock_ttl = 3.0  # renewed every second: the child dies long before its first renewal
    outbox = amake(
        verifier=lambda entry, **kw: Verdict.DELIVERED, verify_delay=0, lock_ttl=lock_ttl
    )
    entry = await make_verifying(outbox) if mode == "verify" else seed_owed(outbox)
    child = start_child(valkey, lock_ttl, mode)
    try:
        item = await asyncio.to_thread(r.blpop, ["test:log"], 30)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert item is not None and item[1] == f"{mode}:started", "the child took the lease"
    killed = time.monotonic()
    snap = await outbox.asnapshot(WS, SES)
    assert snap.lease is not None and snap.lease.held_for < lock_ttl / 3  # not renewed yet
    assert 0 < r.pttl(lock_key(outbox)) <= lock_ttl * 1000  # it can only expire
    # The session moves on once the lease expires: the entry is verified (or its owed
    # signal fired) by the next worker, within LOCK_TTL of the kill.
    while not signals_log.ids("delivered"):
        await outbox.adeliver_once(WS, SES, deliverer=ambiguous)
        assert time.monotonic() - killed < lock_ttl + 1.0, "the session stayed frozen"
        await asyncio.sleep(0.02)
    assert signals_log.ids("delivered") == [entry.id]
    assert await outbox.alist(WS, SES) == []


# -- a carried lease is released when the session runs dry ---------------------------------


async def test_a_carried_lease_is_released_when_the_session_runs_dry(amake, signals_log):
    delivered = []

    async def agent(entry, **kwargs):
        delivered.append((entry.text, time.monotonic()))

    outbox = amake(deliverer=agent, lock_ttl=10)
    stop = asyncio.Event()
    worker = Worker(outbox, None, concurrency=4, tick=30, stop=stop, heartbeat=False)
    run = asyncio.create_task(worker.run())
    await aaccept(outbox, "k1")
    await wait_for(lambda: worker.stats.idle_claims >= 1, 10)
    assert [t for t, _ in delivered] == ["k1"]
    assert (await outbox.asnapshot(WS, SES)).lease is None
    accepted = time.monotonic()
    await aaccept(outbox, "k2")
    await wait_for(lambda: len(delivered) == 2, 10, message="k2 delivered")
    assert delivered[1][1] - accepted < 1.0  # woken at once, not after the lease or a tick
    await wait_for(lambda: len(signals_log.ids("delivered")) == 2, 10)
    stop.set()
    await run
    assert [e.text for e, _ in signals_log.calls["delivered"]] == ["k1", "k2"]  # once each


# -- a wake that arrives while the session's task is finishing -------------------------------


class AcceptAfterIdle:
    """The worker's outbox, except that its first idle step accepts one more prompt and
    waits until the worker has taken the wake, all before the step returns (the window
    between a session's last claim and the end of its task)."""

    def __init__(self, outbox, client) -> None:
        self.outbox = outbox
        self.client = client
        self.worker = None
        self.done = False

    def __getattr__(self, name):
        return getattr(self.outbox, name)

    async def astep(self, ws, ses, deliverer, carry=None, *, more=None, owner=None):
        took, carry = await self.outbox.astep(ws, ses, deliverer, carry, more=more, owner=owner)
        if not took and not self.done:
            self.done = True
            wakes = self.worker.stats.wakes
            await aaccept(self.client, "k2")
            await wait_for(lambda: self.worker.stats.wakes > wakes, 10, message="woken")
        return took, carry


async def test_a_wake_during_a_sessions_last_step_is_not_lost(amake):
    delivered = []

    async def agent(entry, **kwargs):
        delivered.append(entry.text)

    wrapped = AcceptAfterIdle(amake(deliverer=agent), amake())
    stop = asyncio.Event()
    worker = Worker(wrapped, None, concurrency=4, tick=30, stop=stop, heartbeat=False)
    wrapped.worker = worker
    run = asyncio.create_task(worker.run())
    await aaccept(wrapped.client, "k1")
    await wait_for(lambda: delivered == ["k1", "k2"], 10, message="k2 delivered before the tick")
    stop.set()
    await run


class StopAfterClaimingAhead:
    """The worker's outbox, except that the stop comes right after a settle that claimed
    the next entry (settle_next.lua): the window between that claim and the next step."""

    def __init__(self, outbox, stop) -> None:
        self.outbox = outbox
        self.stop = stop

    def __getattr__(self, name):
        return getattr(self.outbox, name)

    async def astep(self, ws, ses, deliverer, carry=None, *, more=None, owner=None):
        took, carry = await self.outbox.astep(ws, ses, deliverer, carry, more=more, owner=owner)
        if isinstance(carry, Claimed):
            self.stop.set()
        return took, carry


async def test_an_entry_claimed_ahead_is_delivered_after_a_stop_not_left_staged(amake, r):
    # A delivery nobody's entry_delivered listens to is settled with the next
    # claim. A stop right then must not leave that entry staged (it would come back as
    # verifying, though it was never sent): the worker delivers it within the grace.
    delivered = []

    async def agent(entry, **kwargs):
        delivered.append(entry.text)

    outbox = amake(deliverer=agent)
    await aaccept(outbox, "a")
    await aaccept(outbox, "b")
    await aaccept(outbox, "c")
    stop = asyncio.Event()
    worker = Worker(
        StopAfterClaimingAhead(outbox, stop), None, concurrency=1, tick=30, stop=stop,
        heartbeat=False,
    )  # fmt: skip
    await asyncio.wait_for(worker.run(), 10)
    assert delivered == ["a", "b"]  # "b" was claimed with a's settle; "c" was not claimed
    assert [e.text for e in await outbox.alist(WS, SES)] == ["c"]
    keys = outbox.keys.session(WS, SES)
    assert not r.exists(keys.lock, keys.staging)
    assert (await outbox.alist(WS, SES))[0].status == Status.PENDING


async def test_a_held_lease_is_renewed_every_third_of_lock_ttl(amake, r):
    """The keeper renews a lease every third of ``LOCK_TTL`` (docs/reference/commands.md,
    "outbox_worker"), so a held lease never has less than two thirds of it left, give or
    take a late round; renewing only every half would let it fall to a half."""
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent, lock_ttl=3.0)
    await aaccept(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    started = time.monotonic()
    previous, renewed_after = r.pttl(lock_key(outbox)), None
    while time.monotonic() - started < 2.5 and renewed_after is None:
        await asyncio.sleep(0.01)
        left = r.pttl(lock_key(outbox))
        if left > previous + 200:
            renewed_after = time.monotonic() - started
        previous = left
    agent.release()
    assert await step
    assert renewed_after is not None, "the lease was never renewed"
    assert 0.6 < renewed_after < 1.35, renewed_after
