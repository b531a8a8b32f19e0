"""Operator actions and sweeps: retry, dismiss, park, unpark, cleanup, ledger.

README "The Python API".
"""

import asyncio

import pytest

from django_outbox import (
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_FAILED,
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_STALLED,
    LEDGER_STATE_TURN_ENDED,
    DismissResult,
    RetryResult,
    Status,
    Verdict,
)
from django_outbox.errors import AmbiguousError
from tests.support.helpers import BlockingDeliverer, accept, statuses

WS, SES = "w1", "s1"


def step(outbox, deliverer=None):
    """One adeliver_once from sync code, closing the loop's client before the loop ends."""

    async def main():
        try:
            return await outbox.adeliver_once(WS, SES, deliverer=deliverer)
        finally:
            await outbox.aclose()

    return asyncio.run(main())


def fail(outbox, error):
    async def deliver(entry, **kwargs):
        raise error

    return step(outbox, deliver)


def test_retry_error_entry_gives_one_more_attempt(make_outbox, signals_log):
    outbox = make_outbox(max_attempts=1)
    entry = accept(outbox)
    fail(outbox, RuntimeError("no"))
    assert outbox.list(WS, SES)[0].reason == "max_attempts"
    assert outbox.retry(WS, SES, entry.id) is RetryResult.UPDATED
    after = outbox.list(WS, SES)[0]
    assert (after.id, after.status, after.reason, after.attempts) == (
        entry.id,
        Status.PENDING,
        None,
        1,
    )
    assert signals_log.calls["updated"][-1][1]["state"] == "pending"
    seen = []

    async def deliver(e, *, workspace_id, session_id, attempt):
        seen.append(attempt)

    step(outbox, deliver)
    assert seen == [2] and outbox.list(WS, SES) == []


def test_retry_unverifiable_verifies_first_when_a_verifier_exists(make_outbox):
    async def verify(entry, **kwargs):
        return Verdict.DELIVERED

    outbox = make_outbox(verifier=verify)
    no_verifier = make_outbox()
    entry = accept(no_verifier)
    fail(no_verifier, AmbiguousError("cut"))
    assert no_verifier.list(WS, SES)[0].reason == "unverifiable"
    assert outbox.retry(WS, SES, entry.id) is RetryResult.UPDATED
    assert outbox.list(WS, SES)[0].status is Status.VERIFYING
    assert no_verifier.sweep_workspace_unverifiable(WS) == 0


def test_retry_and_dismiss_not_found(outbox):
    assert outbox.retry(WS, SES, "missing") is RetryResult.NOT_FOUND
    assert outbox.dismiss(WS, SES, "missing") is DismissResult.NOT_FOUND


def test_dismiss_removes_and_reports(outbox, signals_log):
    entry = accept(outbox)
    assert outbox.dismiss(WS, SES, entry.id) is DismissResult.REMOVED
    assert outbox.list(WS, SES) == []
    assert signals_log.calls["updated"][-1][1]["state"] == "dismissed"
    assert outbox.dismiss(WS, SES, entry.id) is DismissResult.NOT_FOUND


async def test_busy_while_delivering_is_not_missing(make_outbox):
    deliver = BlockingDeliverer()
    outbox = make_outbox(deliverer=deliver)
    entry = await outbox.aaccept(WS, SES, user_id="u", client_message_id="k", text="t")
    other = await outbox.aaccept(WS, SES, user_id="u", client_message_id="k2", text="t2")
    task = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await deliver.started.wait()
    assert await outbox.aretry(WS, SES, entry.id) is RetryResult.BUSY
    assert await outbox.adismiss(WS, SES, entry.id) is DismissResult.BUSY
    # the entry waiting behind it is not busy
    assert await outbox.aretry(WS, SES, other.id) is RetryResult.UPDATED
    listed = await outbox.alist(WS, SES)
    assert listed[1].blocked_by_in_flight and listed[1].in_flight_for >= 0
    deliver.release()
    await task
    await outbox.aclose()


def test_park_and_unpark_workspace(outbox):
    accept(outbox, "a", ses="s1")
    accept(outbox, "b", ses="s2")
    accept(outbox, "c", ses="s1", ws="other")
    assert outbox.park_workspace(WS, "mode_transition") == 2
    assert statuses(outbox, ses="s1") == [("a", "parked")]
    assert outbox.list(WS, "s1")[0].reason == "mode_transition"
    assert outbox.retry(WS, "s1", outbox.list(WS, "s1")[0].id) is RetryResult.BUSY
    assert outbox.list("other", "s1")[0].status is Status.PENDING
    assert outbox.unpark_workspace(WS, "something_else") == 0
    assert outbox.unpark_workspace(WS, "mode_transition") == 2
    assert statuses(outbox, ses="s2") == [("b", "pending")]


def test_parked_entries_are_not_delivered(make_outbox):
    calls = []

    async def deliver(entry, **kwargs):
        calls.append(entry.text)

    outbox = make_outbox(deliverer=deliver)
    accept(outbox)
    outbox.park_workspace(WS, "hold")
    assert not step(outbox)
    outbox.unpark_workspace(WS)
    assert step(outbox) and calls == ["k1"]


def test_unpark_returns_an_uncertain_entry_to_verifying(make_outbox):
    async def verify(entry, **kwargs):
        return Verdict.INCONCLUSIVE

    outbox = make_outbox(verifier=verify, verify_delay=0)
    accept(outbox)
    fail(outbox, AmbiguousError("cut"))
    outbox.park_workspace(WS, "hold")
    outbox.unpark_workspace(WS)
    assert outbox.list(WS, SES)[0].status is Status.VERIFYING


@pytest.mark.parametrize("reason", ["", "   ", None, "x" * 201])
def test_park_reason_is_checked(outbox, reason):
    with pytest.raises(ValueError, match="reason"):
        outbox.park_workspace(WS, reason)


def test_cleanup_workspace_removes_everything_and_is_idempotent(outbox, r):
    accept(outbox, "a", ses="s1")
    accept(outbox, "b", ses="s2")
    accept(outbox, "c", ws="keep")
    removed = outbox.cleanup_workspace(WS)
    assert removed >= 8
    assert [k for k in r.keys("*") if "{w1}" in k] == []
    assert "w1" not in r.smembers("outboxworkspaces") and "w1" not in r.zrange("outboxwsdue", 0, -1)
    assert outbox.cleanup_workspace(WS) == 0
    assert len(outbox.list("keep", SES)) == 1


def test_sweep_unverifiable_rearms_with_a_fresh_window(make_outbox):
    verdicts = [Verdict.INCONCLUSIVE, Verdict.DELIVERED]

    async def verify(entry, **kwargs):
        return verdicts.pop(0)

    outbox = make_outbox(verifier=verify, verify_delay=0, verify_backoff=0, max_verify_attempts=1)
    accept(outbox)
    fail(outbox, AmbiguousError("cut"))
    step(outbox, lambda *a, **k: None)
    assert outbox.list(WS, SES)[0].reason == "unverifiable"
    assert outbox.sweep_workspace_unverifiable(WS) == 1
    entry = outbox.list(WS, SES)[0]
    assert (entry.status, entry.verify_attempts) == (Status.VERIFYING, 0)
    assert outbox.sweep_workspace_unverifiable(WS) == 0
    step(outbox, lambda *a, **k: None)
    assert outbox.list(WS, SES) == []


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (LEDGER_STATE_TURN_ENDED, "completed"),
        (LEDGER_STATE_PROMOTED, "completed"),
        (None, "pending"),
        (LEDGER_STATE_FAILED, "pending"),
        (LEDGER_STATE_LEDGERED, "error"),
        (LEDGER_STATE_ADMITTED, "error"),
        (LEDGER_STATE_STALLED, "error"),
        (ConnectionError("pod unreachable"), "error"),
    ],
)
def test_parked_error_sweep_maps_ledger_states(make_outbox, signals_log, state, expected):
    probes = []

    def probe(*, workspace_id, session_id, entry_id, attempt):
        probes.append((entry_id, attempt))
        if isinstance(state, BaseException):
            raise state
        return state

    outbox = make_outbox(ledger_probe=probe, max_attempts=1)
    entry = accept(outbox)
    fail(outbox, RuntimeError("no"))
    swept = outbox.sweep_workspace_parked_errors(WS)
    assert probes == [(entry.id, 1)]
    if expected == "completed":
        assert swept == 1 and outbox.list(WS, SES) == []
        # the signal is owed to the next claim of the session (a worker, woken now)
        assert signals_log.ids("delivered") == []
        assert step(outbox, lambda *a, **k: None)
        assert not step(outbox, lambda *a, **k: None)
        assert signals_log.ids("delivered") == [entry.id]
    else:
        assert swept == (1 if expected == "pending" else 0)
        assert str(outbox.list(WS, SES)[0].status) == expected
        assert signals_log.ids("delivered") == []


def test_parked_error_sweep_without_probe_is_a_no_op(outbox):
    assert outbox.sweep_workspace_parked_errors(WS) == 0


async def test_async_probe_and_twins(make_outbox):
    async def probe(**kwargs):
        return LEDGER_STATE_TURN_ENDED

    outbox = make_outbox(ledger_probe=probe, max_attempts=1)
    await outbox.aaccept(WS, SES, user_id="u", client_message_id="k", text="t")

    async def deliver(entry, **kwargs):
        raise RuntimeError("x")

    await outbox.adeliver_once(WS, SES, deliverer=deliver)
    assert await outbox.asweep_workspace_parked_errors(WS) == 1
    assert await outbox.apark_workspace(WS, "x") == 0
    assert await outbox.aunpark_workspace(WS) == 0
    assert await outbox.acleanup_workspace(WS) >= 1
    assert await outbox.arecover() == 0
    await outbox.aclose()


def test_snapshots_read_many_sessions_in_one_round_trip(make_outbox, r):
    outbox = make_outbox()
    accept(outbox, "a", ses="s1")
    accept(outbox, "b", ses="s2")
    snaps = outbox.snapshots([(WS, "s2"), (WS, "s1"), (WS, "empty")])
    assert [[e.text for e in s.entries] for s in snaps] == [["b"], ["a"], []]
    assert all(s.lease is None for s in snaps)


async def test_snapshot_names_the_lease_holder(make_outbox):
    deliver = BlockingDeliverer()
    outbox = make_outbox(deliverer=deliver)
    outbox.owner = "worker-7"
    entry = await outbox.aaccept(WS, SES, user_id="u", client_message_id="k", text="t")
    task = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await deliver.started.wait()
    lease = (await outbox.asnapshot(WS, SES)).lease
    assert (lease.owner, lease.entry_id) == ("worker-7", entry.id) and lease.held_for >= 0
    deliver.release()
    await task
    await outbox.aclose()


@pytest.mark.standalone
def test_seeded_stuck_entries_are_indexed_for_attention(outbox, r):
    from django_outbox import Entry
    from django_outbox.core.entry import format_time, new_entry_id

    stuck = Entry(
        id=new_entry_id(),
        client_message_id="k",
        user_id="u",
        text="t",
        accepted_at=format_time(1_764_466_959_000_000),
        status="error",
        reason="max_attempts",
    )
    outbox.seed_entry_for_test(WS, SES, stuck.to_json())
    assert r.zrange(outbox.keys.attention, 0, -1) == [f"{WS} {SES}"]


def test_sweep_unverifiable_leaves_every_other_error_as_it_is(make_outbox):
    # The sweep re-verifies prompts whose outcome is unknown; a prompt that failed for a
    # known reason (max_attempts here) stays an error for an operator's retry
    # (docs/howto/operations.md).
    async def verify(entry, **kwargs):
        return Verdict.INCONCLUSIVE

    outbox = make_outbox(
        verifier=verify, verify_delay=0, verify_backoff=0, max_verify_attempts=1, max_attempts=1
    )
    accept(outbox, "unknown")
    fail(outbox, AmbiguousError("cut"))
    step(outbox, lambda *a, **k: None)
    accept(outbox, "failed", ses="s2")

    async def refuse(entry, **kwargs):
        raise RuntimeError("no")

    async def deliver_s2():
        try:
            return await outbox.adeliver_once(WS, "s2", deliverer=refuse)
        finally:
            await outbox.aclose()

    asyncio.run(deliver_s2())
    assert (outbox.list(WS, SES)[0].reason, outbox.list(WS, "s2")[0].reason) == (
        "unverifiable",
        "max_attempts",
    )
    assert outbox.sweep_workspace_unverifiable(WS) == 1
    assert outbox.list(WS, SES)[0].status is Status.VERIFYING
    failed = outbox.list(WS, "s2")[0]
    assert (failed.status, failed.reason, failed.attempts) == (Status.ERROR, "max_attempts", 1)


def test_parked_error_sweep_rearms_with_a_fresh_transient_count(make_outbox):
    # A prompt the ledger says never arrived goes back to pending with its transient
    # failures counted from 0 again: kept, the next outage would end it at once
    # (docs/explanation/verification.md).
    from django_outbox.errors import TransientDeliveryError

    probes = []

    def probe(*, workspace_id, session_id, entry_id, attempt):
        probes.append(attempt)
        return None  # the ledger never saw it

    outbox = make_outbox(ledger_probe=probe, max_transient_failures=1)
    entry = accept(outbox)
    fail(outbox, TransientDeliveryError("down"))
    ended = outbox.list(WS, SES)[0]
    assert (ended.status, ended.reason, ended.transient_fails) == (
        Status.ERROR,
        "transient_exhausted",
        1,
    )
    assert outbox.sweep_workspace_parked_errors(WS) == 1
    assert probes == [0]  # no attempt was used: every failure was transient
    rearmed = outbox.list(WS, SES)[0]
    assert (rearmed.id, rearmed.status, rearmed.transient_fails) == (entry.id, Status.PENDING, 0)
