"""The outcome ``held`` (docs/howto/agents.md#held-retry-after): an agent that says "not now,
come back in N seconds" keeps the entry pending until then, its session waiting behind it,
without using an attempt; holds in a row are capped."""

import pytest

from django_outbox import Status
from django_outbox.core.entry import parse_time
from django_outbox.errors import HoldDeliveryError

WS = "w1"


class Busy:
    """Answers "busy, retry after ``retry_after``" ``times`` times, then takes the prompt."""

    def __init__(self, times, retry_after=30.0):
        self.times = times
        self.retry_after = retry_after
        self.calls = []
        self.delivered = []

    async def __call__(self, entry, *, workspace_id, session_id, attempt):
        self.calls.append((entry.text, attempt))
        if len(self.calls) <= self.times:
            raise HoldDeliveryError("HTTP 429", retry_after=self.retry_after)
        self.delivered.append(entry.text)


async def test_a_hold_keeps_the_entry_pending_until_then_without_an_attempt(make_outbox):
    agent = Busy(times=1, retry_after=30)
    outbox = make_outbox(deliverer=agent, retry_backoff=0.05)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k1", text="first")
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k2", text="second")
    assert await outbox.adeliver_once(WS, "s")
    first, second = await outbox.alist(WS, "s")
    assert second.status is Status.PENDING and second.holds == 0
    assert first.status is Status.PENDING and first.attempts == 0
    assert first.transient_fails == 0 and first.holds == 1
    assert "held for 30s" in first.last_error and "HTTP 429" in first.last_error
    wait = (parse_time(first.next_attempt_at) - parse_time(first.last_attempt_at)) / 1e6
    assert 29 <= wait <= 31
    # The session waits behind its held head: nothing is due, the second is not sent.
    assert not await outbox.adeliver_once(WS, "s")
    assert agent.calls == [("first", 1)]
    assert await outbox.aretry(WS, "s", first.id) is not None  # due now again
    assert await outbox.adeliver_once(WS, "s")
    assert await outbox.adeliver_once(WS, "s")
    assert agent.delivered == ["first", "second"]
    assert agent.calls[1] == ("first", 1)  # the same attempt number: none was used
    await outbox.aclose()


async def test_a_long_retry_after_is_cut_to_hold_max(make_outbox):
    outbox = make_outbox(deliverer=Busy(times=1, retry_after=86400), hold_max=60)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    wait = (parse_time(entry.next_attempt_at) - parse_time(entry.last_attempt_at)) / 1e6
    assert 59 <= wait <= 61
    await outbox.aclose()


async def test_holds_in_a_row_past_max_holds_end_in_error(make_outbox):
    agent = Busy(times=100, retry_after=0)
    outbox = make_outbox(deliverer=agent, max_holds=3)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    for _ in range(4):
        assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.ERROR and entry.reason == "hold_exhausted"
    assert entry.attempts == 0 and len(agent.calls) == 4
    # An operator's retry starts the count again.
    await outbox.aretry(WS, "s", entry.id)
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.PENDING and entry.holds == 0
    await outbox.aclose()


async def test_only_holds_in_a_row_count(make_outbox):
    calls = []

    async def flaky(entry, **kwargs):
        calls.append(1)
        if len(calls) % 2:
            raise HoldDeliveryError("busy", retry_after=0)
        raise RuntimeError("refused")

    outbox = make_outbox(deliverer=flaky, max_holds=1, retry_backoff=0, max_attempts=10)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    for _ in range(6):
        assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.PENDING and entry.attempts == 3 and entry.holds == 0
    await outbox.aclose()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "5"])
def test_a_hold_needs_a_finite_number_of_seconds(bad):
    with pytest.raises(ValueError, match="retry_after"):
        HoldDeliveryError("busy", retry_after=bad)
