"""The outcome ``held`` (docs/howto/agents.md#held-retry-after): an agent that says "not now,
come back in N seconds" keeps the entry pending until then, its session waiting behind it,
without using an attempt, never sooner than a floor that grows while it keeps refusing;
holds in a row end by the time they last (HOLD_MAX_TOTAL), never by their count."""

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


class Clock:
    """An injected clock (epoch seconds) the test moves by hand."""

    def __init__(self, now: float = 1_764_466_959.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def due_in(entry) -> float:
    """Seconds from the entry's last attempt until it is due again."""
    return (parse_time(entry.next_attempt_at) - parse_time(entry.last_attempt_at)) / 1e6


@pytest.mark.parametrize("retry_after", [0, 0.0001, 0.4])
async def test_a_hold_waits_at_least_a_floor_that_doubles_while_the_agent_refuses(
    make_outbox, retry_after
):
    """``Retry-After: 0`` (or a past date, or garbage read as 0) never makes a request
    storm: each hold in a row waits at least HOLD_FLOOR, doubled per hold, up to HOLD_MAX."""
    clock = Clock()
    agent = Busy(times=100, retry_after=retry_after)
    outbox = make_outbox(deliverer=agent, clock=clock, hold_floor=1, hold_max=10)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    waits = []
    for _ in range(6):
        assert await outbox.adeliver_once(WS, "s")
        [entry] = await outbox.alist(WS, "s")
        waits.append(due_in(entry))
        assert not await outbox.adeliver_once(WS, "s")  # not due before the floor
        clock.now += waits[-1]
    assert waits == [1, 2, 4, 8, 10, 10]
    assert entry.status is Status.PENDING and entry.attempts == 0 and entry.holds == 6
    await outbox.aclose()


async def test_an_agents_longer_wait_beats_the_floor(make_outbox):
    clock = Clock()
    outbox = make_outbox(deliverer=Busy(times=2, retry_after=7), clock=clock, hold_floor=1)
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert due_in(entry) == 7
    await outbox.aclose()


async def test_holds_end_in_error_by_time_held_not_by_their_count(make_outbox):
    """HOLD_MAX_TOTAL decides: holds in a row for less than it go on however many there
    were; the first hold answered at or past it ends the entry in error."""
    clock = Clock()
    agent = Busy(times=1000, retry_after=0)
    outbox = make_outbox(
        deliverer=agent, clock=clock, hold_floor=0.001, hold_max=2, hold_max_total=600
    )
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    [first] = await outbox.alist(WS, "s")
    assert first.held_since == first.last_attempt_at
    entry = first
    began = parse_time(first.held_since) / 1e6
    while clock.now + due_in(entry) < began + 600:  # each hold at once when due
        clock.now += due_in(entry) + 0.000_001  # (microseconds: never a hair early)
        assert await outbox.adeliver_once(WS, "s")
        [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.PENDING and entry.holds > 250  # far past the old count
    assert entry.held_since == first.held_since  # the run of holds began at the first
    clock.now += due_in(entry) + 0.000_001  # the first hold answered past HOLD_MAX_TOTAL
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.ERROR and entry.reason == "hold_exhausted"
    assert entry.attempts == 0 and entry.held_since is None
    # An operator's retry starts the run of holds again.
    await outbox.aretry(WS, "s", entry.id)
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.PENDING and entry.holds == 0 and entry.held_since is None
    await outbox.aclose()


async def test_a_hold_answered_exactly_hold_max_total_after_the_first_gives_up(make_outbox):
    """The bound is inclusive: a hold a second short of HOLD_MAX_TOTAL since the run began
    waits on; one answered exactly HOLD_MAX_TOTAL after it ends the entry in error."""
    clock = Clock()
    began = clock.now
    outbox = make_outbox(
        deliverer=Busy(times=10, retry_after=0),
        clock=clock,
        hold_floor=0.001,
        hold_max_total=600,
    )
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert parse_time(entry.held_since) == int(began * 1_000_000)
    clock.now = began + 599
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.PENDING and entry.holds == 2
    clock.now = began + 600  # exactly: whole seconds from a whole second, no rounding
    assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.ERROR and entry.reason == "hold_exhausted"
    await outbox.aclose()


async def test_only_holds_in_a_row_count(make_outbox):
    calls = []

    async def flaky(entry, **kwargs):
        calls.append(1)
        if len(calls) % 2:
            raise HoldDeliveryError("busy", retry_after=0)
        raise RuntimeError("refused")

    clock = Clock()
    outbox = make_outbox(
        deliverer=flaky, clock=clock, hold_floor=0.001, retry_backoff=0, max_attempts=10
    )
    await outbox.aaccept(WS, "s", user_id="u", client_message_id="k", text="t")
    for _ in range(6):
        clock.now += 1
        assert await outbox.adeliver_once(WS, "s")
    [entry] = await outbox.alist(WS, "s")
    assert entry.status is Status.PENDING and entry.attempts == 3 and entry.holds == 0
    assert entry.held_since is None
    await outbox.aclose()


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "5"])
def test_a_hold_needs_a_finite_number_of_seconds(bad):
    with pytest.raises(ValueError, match="retry_after"):
        HoldDeliveryError("busy", retry_after=bad)
