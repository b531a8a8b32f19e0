"""Steering the queue: accept options (expiry, what to do while busy), edit, move, cancel.

docs/howto/steering.md.
"""

import asyncio

import pytest

from django_outbox import RetryResult, Status
from django_outbox.errors import Duplicate, InvalidContent, SessionBusy
from tests.support.helpers import BlockingDeliverer, accept

WS, SES = "w1", "s1"
T0 = 1_900_000_000.0  # seconds since the epoch, for an injected clock


def step(outbox, deliverer=None):
    """One adeliver_once from sync code, closing the loop's client before the loop ends."""

    async def main():
        try:
            return await outbox.adeliver_once(WS, SES, deliverer=deliverer)
        finally:
            await outbox.aclose()

    return asyncio.run(main())


class Sent:
    """A deliverer that records the texts it was handed."""

    def __init__(self):
        self.texts = []

    async def __call__(self, entry, **kwargs):
        self.texts.append(entry.text)


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


# --- expiry -------------------------------------------------------------------------


def test_expires_at_is_stamped_on_the_server_clock(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    entry = accept(outbox, expires_after=90)
    assert entry.accepted_at == "2030-03-17T17:46:40.000000Z"
    assert entry.expires_at == "2030-03-17T17:48:10.000000Z"
    assert outbox.list(WS, SES)[0].expires_at == entry.expires_at
    assert accept(outbox, "k2").expires_at is None


def test_a_prompt_claimed_at_its_expiry_is_never_sent(make_outbox, signals_log):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    first = accept(outbox, "a", expires_after=1)
    accept(outbox, "b")
    sent = Sent()
    clock.now = T0 + 1  # the very microsecond it expires
    assert step(outbox, sent)
    assert sent.texts == ["b"]
    [left] = outbox.list(WS, SES)
    assert (left.id, left.status) == (first.id, Status.EXPIRED)
    assert [e.id for e, kw in signals_log.calls["updated"] if kw["state"] == "expired"] == [
        first.id
    ]
    # Never sent afterwards either: expired entries wait for a person.
    clock.now = T0 + 60
    step(outbox, sent)
    assert sent.texts == ["b"]


def test_a_prompt_claimed_just_before_its_expiry_is_sent(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    accept(outbox, "a", expires_after=1)
    sent = Sent()
    clock.now = T0 + 0.999999
    step(outbox, sent)
    assert sent.texts == ["a"] and outbox.list(WS, SES) == []


def test_an_expired_prompt_is_retried_without_its_expiry_or_dismissed(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    entry = accept(outbox, "a", expires_after=1)
    clock.now = T0 + 2
    step(outbox, Sent())
    assert outbox.list(WS, SES)[0].status is Status.EXPIRED
    assert outbox.retry(WS, SES, entry.id) is RetryResult.UPDATED
    again = outbox.list(WS, SES)[0]
    assert (again.status, again.expires_at) == (Status.PENDING, None)
    sent = Sent()
    step(outbox, sent)
    assert sent.texts == ["a"]


@pytest.mark.parametrize("bad", [0, -1, True, "10", float("nan"), 31 * 24 * 3600])
def test_expires_after_must_be_a_positive_number_of_seconds(outbox, bad):
    with pytest.raises(InvalidContent, match="expiresAfter"):
        accept(outbox, expires_after=bad)
    assert outbox.list(WS, SES) == []


# --- if_busy ------------------------------------------------------------------------


def test_reject_while_busy_stores_nothing_and_leaves_no_marker(outbox):
    accept(outbox, "first")
    with pytest.raises(SessionBusy):
        accept(outbox, "k2", "second", if_busy="reject")
    assert [e.text for e in outbox.list(WS, SES)] == ["first"]
    # No marker: once the session is idle the same key is accepted.
    step(outbox, Sent())
    entry = accept(outbox, "k2", "second", if_busy="reject")
    assert entry.mode == "reject"
    assert [e.mode for e in outbox.list(WS, SES)] == ["reject"]


def test_reject_sees_a_delivery_in_flight(outbox):
    accept(outbox, "first")
    blocking = BlockingDeliverer()

    async def main():
        try:
            task = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=blocking))
            await blocking.started.wait()
            with pytest.raises(SessionBusy):
                await outbox.aaccept(
                    WS, SES, user_id="u", client_message_id="k2", text="x", if_busy="reject"
                )
            blocking.release()
            await task
        finally:
            await outbox.aclose()

    asyncio.run(main())
    assert outbox.list(WS, SES) == []


def test_reject_ignores_entries_waiting_for_a_person(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    accept(outbox, "old", expires_after=1)
    clock.now = T0 + 5
    step(outbox, Sent())  # expires it
    assert accept(outbox, "k2", if_busy="reject").mode == "reject"


def test_a_resend_of_a_rejected_mode_prompt_is_still_a_duplicate(outbox):
    entry = accept(outbox, "k1", if_busy="reject")
    with pytest.raises(Duplicate) as caught:
        accept(outbox, "k1", if_busy="reject")
    assert caught.value.accepted_id == entry.id


@pytest.mark.parametrize("bad", ["later", "", None, 1, "interrupt-now"])
def test_if_busy_names_a_known_choice(outbox, bad):
    with pytest.raises(InvalidContent, match="ifBusy"):
        accept(outbox, if_busy=bad)
