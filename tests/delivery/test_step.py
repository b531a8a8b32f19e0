"""adeliver_once: the outcome table, verification, ordering, leases.

README "What happens to a message".
"""

import asyncio
import threading
import time

import pytest

from django_outbox import Status, Verdict
from django_outbox.errors import AmbiguousError, PriorAttemptPendingError, TransientDeliveryError
from tests.support.helpers import BlockingDeliverer, aaccept, astatuses, wait_for

WS, SES = "w1", "s1"


class Agent:
    """A scripted deliverer: pops one behaviour per call (return, raise, or sleep)."""

    def __init__(self, *behaviours):
        self.behaviours = list(behaviours)
        self.calls = []

    async def __call__(self, entry, *, workspace_id, session_id, attempt):
        self.calls.append((entry.text, attempt))
        behaviour = self.behaviours.pop(0) if self.behaviours else None
        if isinstance(behaviour, BaseException):
            raise behaviour
        if isinstance(behaviour, int | float):
            await asyncio.sleep(behaviour)


class Verifier:
    def __init__(self, *verdicts):
        self.verdicts = list(verdicts)
        self.calls = []

    async def __call__(self, entry, *, workspace_id, session_id):
        self.calls.append(entry.id)
        verdict = self.verdicts.pop(0)
        if isinstance(verdict, BaseException):
            raise verdict
        return verdict


@pytest.fixture
def fast():
    return dict(
        retry_backoff=0, max_backoff=0.2, verify_delay=0, verify_backoff=0, max_verify_backoff=0.2
    )


async def test_delivered_fires_signals_once(make_outbox, signals_log):
    agent = Agent()
    outbox = make_outbox(deliverer=agent)
    entry = await aaccept(outbox)
    assert entry.status is Status.PENDING
    assert [e.id for e in await outbox.alist(WS, SES)] == [entry.id]
    assert await outbox.adeliver_once(WS, SES)
    assert agent.calls == [("k1", 1)]
    assert await outbox.alist(WS, SES) == []
    assert signals_log.ids("staged") == [entry.id]
    assert signals_log.ids("delivered") == [entry.id]
    states = [kw["state"] for _, kw in signals_log.calls["updated"]]
    assert states == ["queued", "delivering", "sent"]
    versions = [kw["version"] for _, kw in signals_log.calls["updated"]]
    assert versions == sorted(versions) and len(set(versions)) == 3
    assert not await outbox.adeliver_once(WS, SES)
    await outbox.aclose()


async def test_definitive_failures_back_off_then_error(make_outbox, fast):
    agent = Agent(*[RuntimeError("500")] * 3)
    outbox = make_outbox(deliverer=agent, max_attempts=3, **fast)
    await aaccept(outbox)
    for _ in range(3):
        assert await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert [a for _, a in agent.calls] == [1, 2, 3]
    assert (entry.status, entry.reason, entry.attempts) == (Status.ERROR, "max_attempts", 3)
    assert "RuntimeError: 500" in entry.last_error
    assert not await outbox.adeliver_once(WS, SES)  # errors are not retried automatically
    await outbox.aclose()


async def test_backoff_gate_is_respected(make_outbox):
    clock = [1_000.0]
    outbox = make_outbox(
        deliverer=Agent(RuntimeError("x")), retry_backoff=10, clock=lambda: clock[0]
    )
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert not await outbox.adeliver_once(WS, SES)
    clock[0] += 9.9
    assert not await outbox.adeliver_once(WS, SES)
    clock[0] += 0.2
    assert await outbox.adeliver_once(WS, SES)
    assert await outbox.alist(WS, SES) == []
    await outbox.aclose()


@pytest.mark.parametrize(
    "error", [TransientDeliveryError("refused"), PriorAttemptPendingError("busy")]
)
async def test_no_attempt_driven_keeps_the_attempt_number(make_outbox, fast, error):
    agent = Agent(error, error)
    outbox = make_outbox(deliverer=agent, max_transient_failures=2, **fast)
    await aaccept(outbox)
    await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert (entry.status, entry.attempts, entry.transient_fails) == (Status.PENDING, 0, 1)
    await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert (entry.status, entry.reason, entry.attempts) == (Status.ERROR, "transient_exhausted", 0)
    assert [a for _, a in agent.calls] == [1, 1]
    await outbox.aclose()


async def test_ambiguous_without_verifier_is_unverifiable(make_outbox, signals_log):
    agent = Agent(AmbiguousError("cut"))
    outbox = make_outbox(deliverer=agent)
    await aaccept(outbox)
    await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert (entry.status, entry.reason) == (Status.ERROR, "unverifiable")
    assert not await outbox.adeliver_once(WS, SES)
    assert len(agent.calls) == 1 and signals_log.ids("delivered") == []
    await outbox.aclose()


async def test_ambiguous_then_verified_delivered_is_never_resent(make_outbox, fast, signals_log):
    agent = Agent(AmbiguousError("cut"))
    verifier = Verifier(Verdict.INCONCLUSIVE, Verdict.DELIVERED)
    outbox = make_outbox(deliverer=agent, verifier=verifier, **fast)
    entry = await aaccept(outbox)
    await aaccept(outbox, "k2")
    await outbox.adeliver_once(WS, SES)
    assert await astatuses(outbox) == [("k1", "verifying"), ("k2", "pending")]
    await outbox.adeliver_once(WS, SES)  # inconclusive
    assert (await outbox.alist(WS, SES))[0].verify_attempts == 1
    await outbox.adeliver_once(WS, SES)  # delivered
    assert await astatuses(outbox) == [("k2", "pending")]
    await outbox.adeliver_once(WS, SES)
    assert agent.calls == [("k1", 1), ("k2", 1)]
    assert signals_log.ids("delivered")[0] == entry.id and len(signals_log.ids("delivered")) == 2
    await outbox.aclose()


async def test_verified_absent_is_resent_as_the_next_attempt(make_outbox, fast):
    agent = Agent(AmbiguousError("cut"))
    outbox = make_outbox(deliverer=agent, verifier=Verifier(Verdict.ABSENT), **fast)
    await aaccept(outbox)
    for _ in range(3):
        await outbox.adeliver_once(WS, SES)
    assert agent.calls == [("k1", 1), ("k1", 2)]
    assert await outbox.alist(WS, SES) == []
    await outbox.aclose()


async def test_verifier_errors_and_bad_answers_are_inconclusive(make_outbox, fast):
    verifier = Verifier(ConnectionError("down"), "yes", Verdict.DELIVERED)
    outbox = make_outbox(deliverer=Agent(AmbiguousError("x")), verifier=verifier, **fast)
    await aaccept(outbox)
    await outbox.adeliver_once(WS, SES)
    await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert (entry.status, entry.verify_attempts) == (Status.VERIFYING, 1)
    assert "down" in entry.last_error
    await outbox.adeliver_once(WS, SES)
    assert (await outbox.alist(WS, SES))[0].verify_attempts == 2
    await outbox.adeliver_once(WS, SES)
    assert await outbox.alist(WS, SES) == []
    await outbox.aclose()


async def test_verification_budget_ends_in_unverifiable(make_outbox, fast):
    verifier = Verifier(*[Verdict.INCONCLUSIVE] * 3)
    outbox = make_outbox(
        deliverer=Agent(AmbiguousError("x")), verifier=verifier, max_verify_attempts=3, **fast
    )
    await aaccept(outbox)
    for _ in range(4):
        await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert (entry.status, entry.reason, entry.verify_attempts) == (Status.ERROR, "unverifiable", 3)
    await outbox.aclose()


async def test_timeout_is_ambiguous(make_outbox, fast):
    outbox = make_outbox(
        deliverer=Agent(5), verifier=Verifier(Verdict.DELIVERED), delivery_timeout=0.2, **fast
    )
    await aaccept(outbox)
    started = time.monotonic()
    await outbox.adeliver_once(WS, SES)
    assert time.monotonic() - started < 2
    entry = (await outbox.alist(WS, SES))[0]
    assert entry.status is Status.VERIFYING and "timed out" in entry.last_error
    await outbox.adeliver_once(WS, SES)
    assert await outbox.alist(WS, SES) == []
    await outbox.aclose()


async def test_sync_deliverer_runs_off_the_loop(make_outbox):
    seen = []

    def deliver(entry, *, workspace_id, session_id, attempt):
        time.sleep(0.05)
        seen.append(entry.text)

    outbox = make_outbox(deliverer=deliver)
    await aaccept(outbox)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    await outbox.adeliver_once(WS, SES)
    task.cancel()
    assert seen == ["k1"] and ticks > 2
    await outbox.aclose()


async def test_a_timed_out_sync_deliverer_keeps_the_lease_until_its_thread_returns(make_outbox):
    """DELIVERY_TIMEOUT cannot stop a sync deliverer's thread, so the session keeps its
    lease until the thread returns: one call, never two in flight. What the thread
    reports after the deadline does not count: the outcome is unknown and
    the entry is verified, never resent blindly.

    The interleaving that once broke it (two in flight, then a duplicate turn): sync
    deliverers run in asyncio.to_thread. The timeout cancels the *await*, not the
    thread: the outcome was recorded as ambiguous and the lease released while the
    first call was still sending. The verifier (nothing has arrived yet) answered
    ABSENT, the entry was pending again and the next step called the deliverer a
    second time - the first call still in flight, to land later.
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
    await aaccept(outbox, "m1")
    try:
        first = asyncio.create_task(outbox.adeliver_once(WS, SES))
        await wait_for(lambda: calls, timeout=5)  # attempt 1 is running in its thread
        deadline = time.monotonic() + 2  # well past DELIVERY_TIMEOUT (0.2 s)
        while time.monotonic() < deadline:
            assert not await outbox.adeliver_once(WS, SES)  # the lease is still held
            await asyncio.sleep(0.05)
        unblock.set()
        assert await first  # returned after the deadline: unknown, so verified next
        assert [e.status for e in await outbox.alist(WS, SES)] == [Status.VERIFYING]
        assert calls == [1] and peak == 1
    finally:
        unblock.set()
        await outbox.aclose()


async def test_strict_order_holds_later_entries_behind_a_backing_off_head(make_outbox):
    agent = Agent(RuntimeError("x"))
    outbox = make_outbox(deliverer=agent, retry_backoff=30, max_backoff=60)
    await aaccept(outbox, "k1")
    await aaccept(outbox, "k2")
    await outbox.adeliver_once(WS, SES)
    assert not await outbox.adeliver_once(WS, SES)
    assert agent.calls == [("k1", 1)]
    await outbox.aclose()


async def test_strict_order_holds_a_later_message_behind_a_failed_head_under_clock_skew(
    make_outbox,
):
    """A failed head stays the head when a later message carries an earlier (or equal)
    acceptedAt: the queue is ordered by a per-session sequence number, not by clocks.

    The interleaving that once broke strict order (two web servers, 1 s skew): web-1
    (clock 1 s ahead) accepts A, then web-2 (correct clock) accepts B: the queue is
    [A, B] (arrival order) but A.acceptedAt > B.acceptedAt. The worker stages A; A
    fails (proven not delivered) and settle.lua put it back with insert_ordered(),
    which placed it before the first entry with a *later acceptedAt* - there was none,
    so A went to the tail: [B, A]. B was then the strict head and was delivered while
    A was backing off: a prompt overtook an earlier one (README "What happens to a
    message", strict FIFO). The same happened with equal timestamps (a frozen or
    coarse clock), since insert_ordered only passed entries with a strictly later
    acceptedAt.
    """
    base = time.time()
    web1 = make_outbox(clock=lambda: base + 1.0)  # NTP-skewed web server
    web2 = make_outbox(clock=lambda: base)
    worker = make_outbox(retry_backoff=5, max_backoff=10)
    delivered = []

    async def failing(entry, **kwargs):
        raise RuntimeError("agent said 500")

    async def record(entry, **kwargs):
        delivered.append(entry.text)

    try:
        a = await aaccept(web1, "A")
        await aaccept(web2, "B")
        assert next(e.id for e in await worker.alist(WS, SES)) == a.id  # A arrived first
        assert await worker.adeliver_once(WS, SES, deliverer=failing)  # A fails, backs off 5 s
        await worker.adeliver_once(WS, SES, deliverer=record)
    finally:
        for o in (web1, web2, worker):
            await o.aclose()
    # strict: A (backing off) is the head; nothing behind it may be delivered
    assert delivered == []


async def test_due_order_lets_later_entries_pass(make_outbox):
    agent = Agent(RuntimeError("x"))
    outbox = make_outbox(deliverer=agent, retry_backoff=30, max_backoff=60, ordering="due")
    await aaccept(outbox, "k1")
    await aaccept(outbox, "k2")
    await outbox.adeliver_once(WS, SES)
    assert await outbox.adeliver_once(WS, SES)
    assert agent.calls == [("k1", 1), ("k2", 1)]
    assert await astatuses(outbox) == [("k1", "pending")]
    await outbox.aclose()


async def test_error_and_parked_entries_do_not_block(make_outbox):
    agent = Agent(AmbiguousError("x"))
    outbox = make_outbox(deliverer=agent)
    await aaccept(outbox, "k1")
    await aaccept(outbox, "k2")
    await outbox.adeliver_once(WS, SES)  # k1 -> error unverifiable
    assert await outbox.adeliver_once(WS, SES)
    assert [t for t, _ in agent.calls] == ["k1", "k2"]
    await outbox.aclose()


async def test_two_tasks_racing_one_session_never_both_deliver(make_outbox):
    in_flight = 0
    peak = 0
    delivered = []

    async def deliver(entry, *, workspace_id, session_id, attempt):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.01)
        delivered.append(entry.text)
        in_flight -= 1

    one, two = make_outbox(deliverer=deliver), make_outbox(deliverer=deliver)
    texts = [f"m{i}" for i in range(10)]
    for t in texts:
        await aaccept(one, t)
    deadline = time.monotonic() + 20
    while await one.alist(WS, SES):
        assert time.monotonic() < deadline
        await asyncio.gather(*(o.adeliver_once(WS, SES) for o in (one, two, one, two)))
    assert peak == 1 and delivered == texts
    await one.aclose()
    await two.aclose()


async def test_long_delivery_keeps_its_lease(make_outbox, r, signals_log):
    # the deliverer holds m1 for 3 x LOCK_TTL; nobody else delivers meanwhile
    slow = BlockingDeliverer()
    first = make_outbox(deliverer=slow, lock_ttl=0.3)
    second = make_outbox(deliverer=slow, lock_ttl=0.3)
    m1 = await aaccept(first, "m1")
    await aaccept(first, "m2")
    task = asyncio.create_task(first.adeliver_once(WS, SES))
    started = time.monotonic()
    while time.monotonic() - started < 1.0:  # > 3 x LOCK_TTL
        assert not await second.adeliver_once(WS, SES)
        assert r.exists("outboxlock:{w1}:s1")
        await asyncio.sleep(0.05)
    slow.release()
    assert await task
    assert slow.calls == ["m1"]
    assert await second.adeliver_once(WS, SES)
    assert slow.calls == ["m1", "m2"]
    assert signals_log.ids("delivered")[0] == m1.id and len(signals_log.ids("delivered")) == 2
    await first.aclose()
    await second.aclose()


async def test_lost_lease_is_not_claimed_as_delivered(make_outbox, r, signals_log, fast):
    # W1's lock is deleted by hand, W2 takes the session
    release = asyncio.Event()
    calls = []

    async def deliver(entry, *, workspace_id, session_id, attempt):
        calls.append(entry.text)
        if len(calls) == 1:
            await release.wait()

    verifier = Verifier(Verdict.DELIVERED)
    w1 = make_outbox(deliverer=deliver, verifier=verifier, **fast)
    w2 = make_outbox(deliverer=deliver, verifier=verifier, **fast)
    m1 = await aaccept(w1, "m1")
    task = asyncio.create_task(w1.adeliver_once(WS, SES))
    await wait_for(lambda: r.exists("outboxlock:{w1}:s1"))
    r.delete("outboxlock:{w1}:s1")
    assert await w2.adeliver_once(WS, SES)  # recovers m1 as verifying and verifies it
    assert verifier.calls == [m1.id]
    assert signals_log.ids("delivered") == [m1.id]
    # W2 holds a lease again for the next step; W1's settle must not touch it
    await aaccept(w1, "m2")
    blocking = BlockingDeliverer()
    t2 = asyncio.create_task(w2.adeliver_once(WS, SES, deliverer=blocking))
    await wait_for(lambda: r.exists("outboxlock:{w1}:s1"))
    lock = r.get("outboxlock:{w1}:s1")
    release.set()
    assert await task
    assert r.get("outboxlock:{w1}:s1") == lock
    assert signals_log.ids("delivered") == [m1.id]
    blocking.release()
    await t2
    assert calls == ["m1"]
    await w1.aclose()
    await w2.aclose()


async def test_cancelled_delivery_is_recorded_as_ambiguous(make_outbox, r, fast):
    hang = BlockingDeliverer()  # never released: cancelled mid-delivery
    outbox = make_outbox(deliverer=hang, verifier=Verifier(Verdict.DELIVERED), **fast)
    await aaccept(outbox)
    task = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await hang.started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    entry = (await outbox.alist(WS, SES))[0]
    assert entry.status is Status.VERIFYING
    assert not r.exists("outboxlock:{w1}:s1")
    await outbox.aclose()


async def test_no_deliverer_is_a_clear_error(outbox):
    with pytest.raises(ValueError, match="deliverer"):
        await outbox.adeliver_once(WS, SES)


async def test_a_sync_deliverer_past_its_timeout_is_logged_naming_its_entry(make_outbox, caplog):
    """The operator reads which session and entry a thread overstays DELIVERY_TIMEOUT on,
    and that the step waits for it (a thread cannot be interrupted: docs/howto/deliverer.md)."""
    import logging

    unblock = threading.Event()

    def deliver(entry, **kwargs):
        unblock.wait(10)

    outbox = make_outbox(deliverer=deliver, delivery_timeout=0.2)
    entry = await aaccept(outbox, "m1")
    try:
        with caplog.at_level(logging.WARNING, "django_outbox"):
            step = asyncio.create_task(outbox.adeliver_once(WS, SES))
            said = f"sync deliverer for {WS}/{SES} {entry.id} exceeded DELIVERY_TIMEOUT (0.2s)"
            await wait_for(lambda: said in caplog.text, 5)
            assert not step.done()  # still waiting for the thread
            unblock.set()
            assert await step
    finally:
        unblock.set()
        await outbox.aclose()
