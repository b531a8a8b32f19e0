"""Timing gates with real, non-zero backoffs and delays, and wakes that do not wait for the tick.

"Not before" is judged on the server's clock: an injected clock that the test moves (the
gate holds up to the microsecond before it opens), or Valkey's TIME read at each call of
the agent. "Eventually after" waits on a condition with a deadline. README "What happens
to a message": a failed or refused attempt waits ``RETRY_BACKOFF`` doubled per attempt (at
most ``MAX_BACKOFF``); an unknown outcome is verified after ``VERIFY_DELAY``, then every
``VERIFY_BACKOFF`` doubled."""

import asyncio
import time

import pytest

from django_outbox import LEDGER_STATE_TURN_ENDED, RetryResult, Status, Verdict
from django_outbox.core.entry import format_time
from django_outbox.core.finding import due_sessions
from django_outbox.core.worker import Worker
from tests.support import scenarios
from tests.support.helpers import SES, WS, aaccept, astatuses, wait_for
from tests.support.scenarios import ambiguous, transient

amake = scenarios.amake  # the fixture

T0 = 1_900_000_000.0  # an injected clock's start (seconds since the epoch)


class Clock:
    """An injected clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


# -- RETRY_BACKOFF ---------------------------------------------------------------------------


@pytest.mark.parametrize("refusal", ["transient", "failed"])
async def test_the_next_attempt_is_not_before_the_retry_backoff(amake, refusal):
    calls = []

    async def agent(entry, **kwargs):
        calls.append(entry.attempts)
        if len(calls) <= 2:
            if refusal == "transient":
                await transient(entry)
            raise RuntimeError("500")

    clock = Clock()
    outbox = amake(deliverer=agent, retry_backoff=10, max_backoff=120, clock=clock)
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    entry = (await outbox.alist(WS, SES))[0]
    assert entry.next_attempt_at == format_time(int((T0 + 10) * 1_000_000))
    for wait in (10, 20):  # doubled after the second refusal
        start = clock.now
        clock.now = start + wait - 1e-6
        assert not await outbox.adeliver_once(WS, SES), f"attempt before {wait} s"
        clock.now = start + wait
        assert await outbox.adeliver_once(WS, SES)
    assert len(calls) == 3 and await outbox.alist(WS, SES) == []


async def test_the_backoff_stops_at_max_backoff(amake):
    clock = Clock()
    outbox = amake(deliverer=transient, retry_backoff=10, max_backoff=15, clock=clock)
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    clock.now += 10
    assert await outbox.adeliver_once(WS, SES)  # second refusal: 20 s, capped at 15
    entry = (await outbox.alist(WS, SES))[0]
    assert entry.next_attempt_at == format_time(int((T0 + 25) * 1_000_000))


async def test_a_real_retry_backoff_is_kept_on_the_server_clock(amake, r):
    backoff = 0.4
    seen = []  # Valkey TIME at each call, seconds

    async def agent(entry, **kwargs):
        secs, micros = r.time()
        seen.append(secs + micros / 1e6)
        if len(seen) == 1:
            await transient(entry)

    outbox = amake(deliverer=agent, retry_backoff=backoff, max_backoff=10)
    await aaccept(outbox)
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(tick=0.02, stop=stop, heartbeat=False))
    await wait_for(lambda: len(seen) == 2, 10, message="the second attempt")
    stop.set()
    await run
    assert seen[1] - seen[0] >= backoff
    assert await outbox.alist(WS, SES) == []


# -- VERIFY_DELAY and VERIFY_BACKOFF -----------------------------------------------------------


async def test_the_verifier_is_not_called_before_the_verify_delay(amake):
    asked = []

    async def verifier(entry, **kwargs):
        asked.append(entry.verify_attempts)
        return Verdict.INCONCLUSIVE if len(asked) == 1 else Verdict.DELIVERED

    clock = Clock()
    outbox = amake(
        deliverer=ambiguous,
        verifier=verifier,
        verify_delay=3,
        verify_backoff=5,
        max_verify_backoff=60,
        clock=clock,
    )
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert await astatuses(outbox) == [("k1", "verifying")]
    for wait in (3, 5):  # VERIFY_DELAY, then VERIFY_BACKOFF after an inconclusive pass
        start = clock.now
        clock.now = start + wait - 1e-6
        assert not await outbox.adeliver_once(WS, SES), f"verified before {wait} s"
        clock.now = start + wait
        assert await outbox.adeliver_once(WS, SES)
    assert asked == [0, 1] and await outbox.alist(WS, SES) == []


async def test_a_real_verify_delay_is_kept_on_the_server_clock(amake, r):
    delay = 0.4
    seen = []

    async def agent(entry, **kwargs):
        secs, micros = r.time()
        seen.append(secs + micros / 1e6)
        await ambiguous(entry)

    async def verifier(entry, **kwargs):
        secs, micros = r.time()
        seen.append(secs + micros / 1e6)
        return Verdict.DELIVERED

    outbox = amake(deliverer=agent, verifier=verifier, verify_delay=delay)
    await aaccept(outbox)
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(tick=0.02, stop=stop, heartbeat=False))
    await wait_for(lambda: len(seen) == 2, 10, message="the verification")
    stop.set()
    await run
    assert seen[1] - seen[0] >= delay
    assert await outbox.alist(WS, SES) == []


# -- operations wake an idle worker at once -----------------------------------------------

WAKE_BOUND = 1.0  # seconds; the tick is 30 s


async def idle_worker(outbox, deliverer):
    """A worker with a 30 s tick, started and idle; returns (worker, stop, task)."""
    stop = asyncio.Event()
    worker = Worker(outbox, deliverer, concurrency=4, tick=30, stop=stop, heartbeat=False)
    task = asyncio.create_task(worker.run())
    await wait_for(lambda: worker.stats.scans >= 1, 10, message="the worker's first scan")
    return worker, stop, task


async def test_retry_wakes_an_idle_worker(amake):
    delivered = []

    async def agent(entry, **kwargs):
        if entry.attempts == 0:
            raise RuntimeError("500")
        delivered.append(time.monotonic())

    outbox = amake(deliverer=agent, max_attempts=1)
    entry = await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert await astatuses(outbox) == [("k1", "error")]
    _, stop, task = await idle_worker(outbox, agent)
    at = time.monotonic()
    assert await outbox.aretry(WS, SES, entry.id) is RetryResult.UPDATED
    await wait_for(lambda: delivered, 10, message="delivered after the retry")
    assert delivered[0] - at < WAKE_BOUND
    stop.set()
    await task


async def test_unpark_wakes_an_idle_worker(amake):
    delivered = []

    async def agent(entry, **kwargs):
        delivered.append(time.monotonic())

    outbox = amake(deliverer=agent)
    await outbox.apark_workspace(WS, "hold")
    await aaccept(outbox)
    assert await astatuses(outbox) == [("k1", "parked")]
    _, stop, task = await idle_worker(outbox, agent)
    at = time.monotonic()
    assert await outbox.aunpark_workspace(WS) == 1
    await wait_for(lambda: delivered, 10, message="delivered after the unpark")
    assert delivered[0] - at < WAKE_BOUND
    stop.set()
    await task


async def test_a_ledger_completion_wakes_an_idle_worker(amake, signals_log):
    async def probe(**kwargs):
        return LEDGER_STATE_TURN_ENDED

    outbox = amake(deliverer=ambiguous, ledger_probe=probe, parked_sweep_interval=3600)
    entry = await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert (await outbox.alist(WS, SES))[0].status is Status.ERROR  # unverifiable
    _, stop, task = await idle_worker(outbox, ambiguous)
    at = time.monotonic()
    assert await outbox.asweep_workspace_parked_errors(WS) == 1
    await wait_for(lambda: signals_log.ids("delivered"), 10, message="the owed signal")
    assert time.monotonic() - at < WAKE_BOUND
    assert signals_log.ids("delivered") == [entry.id]
    stop.set()
    await task


async def test_a_release_with_more_work_queued_wakes_an_idle_worker(amake):
    from tests.support.helpers import BlockingDeliverer

    agent = BlockingDeliverer()
    delivered = []

    async def worker_agent(entry, **kwargs):
        delivered.append((entry.text, time.monotonic()))

    one_off = amake(deliverer=agent, lock_ttl=30)
    await aaccept(one_off, "k1")
    await aaccept(one_off, "k2")
    step = asyncio.create_task(one_off.adeliver_once(WS, SES))  # holds the lease on k1
    await asyncio.wait_for(agent.started.wait(), 10)
    worker, stop, task = await idle_worker(amake(lock_ttl=30), worker_agent)
    await wait_for(lambda: worker.stats.idle_claims >= 1, 10, message="the worker found it busy")
    at = time.monotonic()
    agent.release()
    assert await step  # k1 delivered, the lease released with k2 queued
    await wait_for(lambda: delivered, 10, message="k2 delivered")
    assert delivered[0][0] == "k2" and delivered[0][1] - at < WAKE_BOUND
    stop.set()
    await task


# -- a session in flight is due again only when its lease would expire ---------------------


async def test_a_session_under_a_live_lease_is_not_due(amake):
    """README "The worker": a session in flight is indexed at its lease's expiry, and each
    renewal moves it on, so no scan offers it while its lease lives (a worker would only
    get busy)."""
    from tests.support.helpers import BlockingDeliverer

    lock_ttl = 1.0  # renewed every 0.33 s
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent, lock_ttl=lock_ttl)
    await aaccept(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    assert await due_sessions(outbox, 100) == []

    async def held_past_the_first_expiry():
        lease = (await outbox.asnapshot(WS, SES)).lease
        return lease.held_for > lock_ttl * 1.5

    await wait_for(held_past_the_first_expiry, 10, message="the lease is renewed past its TTL")
    assert await due_sessions(outbox, 100) == []  # renewals moved the due time on
    agent.release()
    assert await step
    assert await outbox.alist(WS, SES) == []
