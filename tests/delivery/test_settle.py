"""What a settle and an operator's action leave behind: the ledger is asked about the
attempt that was really made, retries restart the counters they promise to, every settle
outcome advances the session's version, and the admin's "needs attention" index holds
exactly the sessions README "Admin" says it does."""

import asyncio

import pytest

from django_outbox import (
    LEDGER_STATE_TURN_ENDED,
    DismissResult,
    RetryResult,
    Status,
    Verdict,
)
from django_outbox.errors import AmbiguousError, HoldDeliveryError, PriorAttemptPendingError
from tests.support import scenarios
from tests.support.helpers import SES, WS, BlockingDeliverer, aaccept, astatuses, make_entry
from tests.support.scenarios import ambiguous, nothing, transient

amake = scenarios.amake  # the fixture


# -- the ledger probe after an unverifiable outcome ------------------------------------------


async def test_the_ledger_is_asked_about_the_attempt_that_was_made(amake, signals_log):
    asked = []
    calls = []

    async def agent(entry, *, attempt, **kwargs):
        calls.append(attempt)
        raise AmbiguousError("the reply was lost")

    def probe(*, workspace_id, session_id, entry_id, attempt):
        asked.append(attempt)
        return LEDGER_STATE_TURN_ENDED if attempt == 1 else None

    outbox = amake(deliverer=agent, ledger_probe=probe)  # no verifier
    entry = await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.reason, stored.attempts) == (Status.ERROR, "unverifiable", 0)
    assert await outbox.asweep_workspace_parked_errors(WS) == 1
    assert asked == [1]
    assert await outbox.alist(WS, SES) == []
    assert await outbox.adeliver_once(WS, SES)  # fires the owed signal, sends nothing
    assert not await outbox.adeliver_once(WS, SES)
    assert calls == [1]
    assert signals_log.ids("delivered") == [entry.id]


# -- retry restarts the counters --------------------------------------------------------------


@pytest.mark.parametrize("refusal", ["transient", "prior_pending"])
async def test_retry_of_transient_exhausted_restarts_the_transient_counter(amake, refusal):
    async def agent(entry, **kwargs):
        if refusal == "transient":
            await transient(entry)
        raise PriorAttemptPendingError("the previous turn is still running")

    outbox = amake(deliverer=agent, max_transient_failures=2, retry_backoff=0)
    entry = await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert (await outbox.alist(WS, SES))[0].transient_fails == 1
    assert await outbox.adeliver_once(WS, SES)
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.reason) == (Status.ERROR, "transient_exhausted")
    assert await outbox.aretry(WS, SES, entry.id) is RetryResult.UPDATED
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.transient_fails, stored.attempts) == (Status.PENDING, 0, 0)
    assert await outbox.adeliver_once(WS, SES)  # one refusal after the retry: not exhausted
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.transient_fails) == (Status.PENDING, 1)


async def test_a_ledger_rearm_restarts_the_transient_counter(amake):
    outbox = amake(deliverer=transient, max_transient_failures=1, ledger_probe=lambda **kw: None)
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert await astatuses(outbox) == [("k1", "error")]
    assert await outbox.asweep_workspace_parked_errors(WS) == 1  # no ledger row: re-armed
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.transient_fails) == (Status.PENDING, 0)


async def test_retry_of_unverifiable_restarts_the_verification_window(amake):
    verdicts = []

    async def verifier(entry, **kwargs):
        verdicts.append(entry.verify_attempts)
        return Verdict.INCONCLUSIVE

    outbox = amake(
        deliverer=ambiguous,
        verifier=verifier,
        verify_delay=0,
        verify_backoff=0,
        max_verify_attempts=2,
    )
    entry = await aaccept(outbox)
    for _ in range(3):
        assert await outbox.adeliver_once(WS, SES)
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.reason) == (Status.ERROR, "unverifiable")
    assert await outbox.aretry(WS, SES, entry.id) is RetryResult.UPDATED
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.verify_attempts) == (Status.VERIFYING, 0)  # checked first
    assert await outbox.adeliver_once(WS, SES)
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.verify_attempts) == (Status.VERIFYING, 1)


# -- every settle advances the version ----------------------------------------------------


def failing(exc):
    async def deliver(entry, **kwargs):
        raise exc

    return deliver


def verdict(value):
    async def verify(entry, **kwargs):
        if isinstance(value, BaseException):
            raise value
        return value

    return verify


# outcome -> (deliverer, verifier, first make the entry verifying, the status after)
OUTCOMES = {
    "delivered": (nothing, None, False, None),
    "failed": (failing(RuntimeError("500")), None, False, "pending"),
    "failed_max": (failing(RuntimeError("500")), None, False, "error"),
    "transient": (transient, None, False, "pending"),
    "prior_pending": (failing(PriorAttemptPendingError("busy")), None, False, "pending"),
    "held": (failing(HoldDeliveryError("429", retry_after=60)), None, False, "pending"),
    "ambiguous": (ambiguous, verdict(Verdict.DELIVERED), False, "verifying"),
    "unverifiable": (ambiguous, None, False, "error"),
    "verified_delivered": (ambiguous, verdict(Verdict.DELIVERED), True, None),
    "absent": (ambiguous, verdict(Verdict.ABSENT), True, "pending"),
    "inconclusive": (ambiguous, verdict(Verdict.INCONCLUSIVE), True, "verifying"),
    "verifier_failed": (ambiguous, verdict(RuntimeError("down")), True, "verifying"),
}


@pytest.mark.parametrize("outcome", list(OUTCOMES))
async def test_every_settle_advances_the_session_version(amake, signals_log, outcome):
    deliverer, verifier, verify_first, after = OUTCOMES[outcome]
    outbox = amake(
        deliverer=deliverer,
        verifier=verifier,
        max_attempts=1 if outcome == "failed_max" else 5,
        verify_delay=0,
        verify_backoff=0,
    )
    await aaccept(outbox)
    if verify_first:
        assert await outbox.adeliver_once(WS, SES, deliverer=ambiguous)
        assert await astatuses(outbox) == [("k1", "verifying")]
    before = (await outbox.asnapshot(WS, SES)).version
    signals_log.calls["updated"].clear()
    assert await outbox.adeliver_once(WS, SES)
    versions = [kw["version"] for _, kw in signals_log.calls["updated"]]
    assert versions, "the step told watchers nothing"
    assert all(b > a for a, b in zip([before, *versions], versions, strict=False)), versions
    snap = await outbox.asnapshot(WS, SES)
    assert snap.version >= versions[-1] > before
    assert [str(e.status) for e in snap.entries] == ([after] if after else [])


async def test_entry_updated_versions_strictly_increase_over_a_whole_life(amake, signals_log):
    verdicts = iter([Verdict.INCONCLUSIVE, Verdict.ABSENT])

    async def verifier(entry, **kwargs):
        return next(verdicts)

    attempts = iter([transient, failing(RuntimeError("500")), ambiguous, nothing])

    async def agent(entry, **kwargs):
        await next(attempts)(entry)

    outbox = amake(
        deliverer=agent, verifier=verifier, retry_backoff=0, verify_delay=0, verify_backoff=0
    )
    await aaccept(outbox)
    for _ in range(10):
        if not await outbox.adeliver_once(WS, SES):
            break
    assert await outbox.alist(WS, SES) == []
    versions = [kw["version"] for _, kw in signals_log.calls["updated"]]
    states = [kw["state"] for _, kw in signals_log.calls["updated"]]
    assert len(versions) >= 8, states
    assert versions == sorted(set(versions)), list(zip(states, versions, strict=True))


# -- the admin's "needs attention" index -----------------------------------------------------


def needs_attention(outbox) -> bool:
    page = outbox.session_page("attention", 50)
    listed = {(s.workspace_id, s.session_id) for s in page.sessions}
    assert page.totals.attention == len(listed)
    return (WS, SES) in listed


def test_staging_without_a_lease_needs_attention(make_outbox):
    outbox = make_outbox()
    entry = make_entry("k1", status=Status.DELIVERING)
    outbox.seed_entry_for_test(WS, SES, entry.to_json())  # a dead worker's delivery
    assert needs_attention(outbox)


async def test_the_attention_index_follows_each_state(amake):
    agent = BlockingDeliverer()
    outbox = amake(deliverer=agent, max_attempts=1)
    k1 = await aaccept(outbox, "k1")
    k0 = await aaccept(outbox, "k0")
    assert not await asyncio.to_thread(needs_attention, outbox)  # pending, nothing held
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.started.wait(), 10)
    assert await asyncio.to_thread(needs_attention, outbox)  # k0 behind the claimed lease
    assert await outbox.adismiss(WS, SES, k0.id) is DismissResult.REMOVED
    assert not await asyncio.to_thread(needs_attention, outbox)  # delivering, nothing behind
    k2 = await aaccept(outbox, "k2")
    assert await asyncio.to_thread(needs_attention, outbox)  # accepted behind a lease
    assert await outbox.adismiss(WS, SES, k2.id) is DismissResult.REMOVED
    assert not await asyncio.to_thread(needs_attention, outbox)
    agent.release()
    assert await step
    assert not await asyncio.to_thread(needs_attention, outbox)  # delivered: empty
    await aaccept(outbox, "k3")
    assert await outbox.adeliver_once(WS, SES, deliverer=failing(RuntimeError("500")))
    assert await asyncio.to_thread(needs_attention, outbox)  # error
    assert k1.id not in [e.id for e in await outbox.alist(WS, SES)]
    await outbox.apark_workspace(WS, "hold")
    await aaccept(outbox, "k4")
    k3 = (await outbox.alist(WS, SES))[0]
    assert await outbox.adismiss(WS, SES, k3.id) is DismissResult.REMOVED
    assert await astatuses(outbox) == [("k4", "parked")]
    assert await asyncio.to_thread(needs_attention, outbox)  # parked
    await outbox.aunpark_workspace(WS)
    assert not await asyncio.to_thread(needs_attention, outbox)
    assert await outbox.adeliver_once(WS, SES, deliverer=ambiguous)
    assert await asyncio.to_thread(needs_attention, outbox)  # error: unverifiable


# -- a settle whose reply was lost recognises its own write ----------------------------------


@pytest.mark.standalone  # a TCP proxy in front of one server
async def test_an_updating_settle_whose_reply_was_lost_is_replayed_not_lost(amake, valkey):
    from tests.support.proxy import TcpProxy

    proxy = TcpProxy(int(valkey.rsplit(":", 1)[1].split("/")[0])).start()
    try:
        outbox = amake(url=proxy.url, deliverer=failing(RuntimeError("500")))
        steps = []
        outbox.step_listeners.append(lambda *step: steps.append(step[:3]))
        await aaccept(outbox)
        await outbox.aload_scripts()
        proxy.drop_reply_to(outbox.scripts["settle"].sha.encode())
        assert await outbox.adeliver_once(WS, SES)
        assert proxy.dropped == 1
        # The retried settle found the first one's receipt: its outcome stands, and the
        # step is not reported as a lost lease ("left to verification").
        assert steps == [("deliver", "failed", "replayed")]
        stored = (await outbox.alist(WS, SES))[0]
        assert (stored.status, stored.attempts) == (Status.PENDING, 1)
        assert (await outbox.asnapshot(WS, SES)).lease is None
    finally:
        proxy.close()


async def test_a_new_ambiguous_attempt_gets_a_fresh_verification_window(amake):
    verdicts = iter([Verdict.INCONCLUSIVE, Verdict.ABSENT, Verdict.INCONCLUSIVE])

    async def verifier(entry, **kwargs):
        return next(verdicts)

    outbox = amake(
        deliverer=ambiguous,
        verifier=verifier,
        verify_delay=0,
        verify_backoff=0,
        retry_backoff=0,
        max_verify_attempts=2,
    )
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)  # ambiguous
    assert await outbox.adeliver_once(WS, SES)  # inconclusive: 1 of 2 passes used
    assert await outbox.adeliver_once(WS, SES)  # absent: sent again
    assert await outbox.adeliver_once(WS, SES)  # ambiguous again: a new window
    assert (await outbox.alist(WS, SES))[0].verify_attempts == 0
    assert await outbox.adeliver_once(WS, SES)  # inconclusive: 1 of 2 again, not exhausted
    stored = (await outbox.alist(WS, SES))[0]
    assert (stored.status, stored.verify_attempts) == (Status.VERIFYING, 1)
