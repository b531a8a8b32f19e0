"""Cutting a running turn: interrupt / cut, the holder's abort, the verified outcome.

docs/howto/cutting.md. The agent here is an in-process stand-in with a transcript: its
turn runs until aborted, and its verifier reads the transcript. Valkey, the step, the
worker's lease and its cut watch are the real ones.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from django_outbox import InterruptResult, SendNowResult, Verdict
from django_outbox.core import cutting
from django_outbox.core.cutting import CUT_POLL
from django_outbox.errors import (
    AmbiguousError,
    CutNotSupported,
    Duplicate,
    HoldDeliveryError,
    InvalidContent,
    PriorAttemptPendingError,
    TransientDeliveryError,
)
from tests.support.helpers import aaccept, wait_for

WS, SES = "w1", "s1"


class TurnAgent:
    """An agent whose turn never ends on its own (like opencode without a model).

    ``deliver`` waits for ``gate`` (the moment it sends), then writes the prompt into the
    transcript and runs the turn until ``abort`` ends it; the deliverer then returns, as
    opencode's ``POST /message`` does. ``verify`` reads the transcript.
    """

    def __init__(self, *, gate_open: bool = True) -> None:
        self.gate = asyncio.Event()
        if gate_open:
            self.gate.set()
        self.transcript: list[str] = []
        self.running = asyncio.Event()
        self.turn_over = asyncio.Event()
        self.aborts = 0
        self.verifies = 0

    async def deliver(self, entry, *, workspace_id, session_id, attempt):
        await self.gate.wait()
        self.start_turn(entry)
        await self.turn_over.wait()

    def start_turn(self, entry) -> None:
        """The prompt reaches the transcript and its turn runs."""
        self.transcript.append(entry.id)
        self.turn_over.clear()
        self.running.set()

    async def abort(self, entry, *, workspace_id, session_id):
        self.aborts += 1
        self.running.clear()
        self.turn_over.set()

    async def verify(self, entry, *, workspace_id, session_id):
        self.verifies += 1
        return Verdict.DELIVERED if entry.id in self.transcript else Verdict.ABSENT


@pytest.fixture
def agent():
    return TurnAgent()


@pytest.fixture
def cutting_outbox(make_outbox):
    def make(agent: TurnAgent, **kwargs):
        kwargs.setdefault("aborter", agent.abort)
        return make_outbox(
            deliverer=agent.deliver,
            verifier=agent.verify,
            retry_backoff=0.05,
            max_backoff=0.2,
            verify_delay=0,
            verify_backoff=0.05,
            max_verify_backoff=0.2,
            **kwargs,
        )

    return make


async def test_stop_cuts_the_running_turn_and_the_entry_ends_delivered_interrupted(
    cutting_outbox, agent, signals_log
):
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)

    assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.ALREADY
    await asyncio.wait_for(agent.turn_over.wait(), 5)  # the holder aborted the turn
    await asyncio.wait_for(step, 5)

    # The cut attempt is verified, never guessed: the agent has it.
    head = (await outbox.alist(WS, SES))[0]
    assert (head.id, str(head.status), head.interrupted) == (first.id, "verifying", True)
    assert await outbox.adeliver_once(WS, SES)  # the verification
    delivered = [e for e, _ in signals_log.calls["delivered"] if e.id == first.id]
    assert len(delivered) == 1 and delivered[0].interrupted is True
    assert agent.transcript.count(first.id) == 1  # never sent twice
    # The queue goes on in order: Stop sends nothing new but does not cancel the queue.
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id]
    await outbox.aclose()


async def _first_delivered_second_running(outbox, agent):
    """Accept "first" and "second"; deliver "first" while a page shows it in flight, end its
    turn, and let the worker start "second" (its turn runs, its step returned)."""
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)  # the page shows "first" in flight
    agent.running.clear()
    agent.turn_over.set()  # ... and its turn ends before the user's Stop arrives
    assert await asyncio.wait_for(step, 5)
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)  # the worker has started "second"
    assert agent.transcript == [first.id, second.id]
    return first, second, step


async def test_a_stop_naming_a_turn_that_has_just_ended_never_cuts_the_next_one(
    cutting_outbox, agent, r, signals_log
):
    """A stale Stop: the page shows "first" in flight and the user presses Stop just as its turn
    ends; by the time the request arrives the worker runs "second". A Stop names the entry
    it stops (docs/howto/cutting.md): "first" is not in flight any more, so the answer is
    NOT_IN_FLIGHT and nothing is cut — no mark, no signal, no abort; "second" runs on. A
    Stop naming "second" then cuts it, as one without a name would have."""
    outbox = cutting_outbox(agent)
    first, second, step = await _first_delivered_second_running(outbox, agent)

    assert await outbox.ainterrupt(WS, SES, entry_id=first.id) is InterruptResult.NOT_IN_FLIGHT
    assert outbox.interrupt(WS, SES, entry_id=first.id) is InterruptResult.NOT_IN_FLIGHT
    [running] = await outbox.alist(WS, SES)
    assert (running.id, str(running.status), running.interrupted) == (
        second.id,
        "delivering",
        False,
    )
    assert r.get(outbox.keys.cut(WS, SES)) is None  # no signal for the holder to see
    assert not [e for e, _ in signals_log.calls["updated"] if e.interrupted]
    assert (agent.aborts, step.done(), agent.running.is_set()) == (0, False, True)

    assert await outbox.ainterrupt(WS, SES, entry_id=second.id) is InterruptResult.CUT
    assert await outbox.ainterrupt(WS, SES, entry_id=second.id) is InterruptResult.ALREADY
    await asyncio.wait_for(step, 5)  # the holder aborted the turn of "second"
    assert agent.aborts == 1
    [cut] = await outbox.alist(WS, SES)
    assert (cut.id, str(cut.status), cut.interrupted) == (second.id, "verifying", True)
    assert [e.id for e, _ in signals_log.calls["delivered"]] == [first.id]
    assert signals_log.calls["delivered"][0][0].interrupted is False
    await outbox.aclose()


async def test_a_stop_without_an_entry_keeps_its_old_meaning_and_races_the_turn_s_end(
    cutting_outbox, agent
):
    """Without an entry, a Stop cuts whatever turn is in flight when it arrives: the one the
    user saw, or, arriving as that turn ends, the next prompt's (docs/howto/cutting.md)."""
    outbox = cutting_outbox(agent)
    _, second, step = await _first_delivered_second_running(outbox, agent)
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
    await asyncio.wait_for(step, 5)
    [cut] = await outbox.alist(WS, SES)
    assert (cut.id, cut.interrupted) == (second.id, True)
    await outbox.aclose()


#: When the Stop aimed at "first" is sent, in seconds after its turn ended, as the worker
#: goes on to "second" (seven trials, as the field report's); the last once "second"'s
#: turn runs.
STOP_DELAYS = (0, 0, 0.001, 0.003, 0.01, 0.03, None)


async def test_a_stop_racing_the_end_of_the_turn_it_names_cuts_that_turn_or_nothing(
    cutting_outbox, r
):
    """The Stop-after-the-turn-ended trials: a Stop naming "first" is sent 0 to 30 ms after its
    turn ended, or
    once "second" runs, while the worker moves straight on to "second". Whichever comes
    first, "first"'s settle or
    the Stop (one script reads the entry in flight and cuts it), "second"'s turn is never
    cut: the answer is CUT (the Stop came first: "first" is marked, and ends delivered) or
    NOT_IN_FLIGHT (nothing is marked)."""
    answers = []
    for trial, delay in enumerate(STOP_DELAYS):
        agent = TurnAgent()
        outbox = cutting_outbox(agent)
        ses = f"race{trial}"
        first = await aaccept(outbox, "k1", "first", ses=ses)
        second = await aaccept(outbox, "k2", "second", ses=ses)
        step = asyncio.ensure_future(outbox.adeliver_once(WS, ses))
        await asyncio.wait_for(agent.running.wait(), 5)
        agent.running.clear()

        async def worker(outbox, step, ses):
            await step
            return await outbox.adeliver_once(WS, ses)  # "second", at once

        running = asyncio.ensure_future(worker(outbox, step, ses))
        agent.turn_over.set()  # the turn of "first" ends ...
        if delay is None:  # ... and the Stop aimed at it goes out once "second" runs
            await asyncio.wait_for(agent.running.wait(), 5)
        else:  # ... or this much later, racing the worker
            await asyncio.sleep(delay)
        answer = await outbox.ainterrupt(WS, ses, entry_id=first.id)
        answers.append(answer)
        await asyncio.wait_for(agent.running.wait(), 5)  # "second"'s turn runs
        listed = {e.id: e for e in await outbox.alist(WS, ses)}
        assert not listed[second.id].interrupted, (trial, delay, answer)
        assert r.get(outbox.keys.cut(WS, ses)) in (None, first.id)
        assert answer in (InterruptResult.CUT, InterruptResult.NOT_IN_FLIGHT), answer
        agent.turn_over.set()  # "second"'s turn ends on its own
        assert await asyncio.wait_for(running, 5)
        assert agent.aborts == 0 and agent.transcript == [first.id, second.id]
        assert await outbox.alist(WS, ses) == []  # both delivered, "second" uncut
        await outbox.aclose()
    assert InterruptResult.NOT_IN_FLIGHT in answers


async def test_a_stop_names_its_entry_by_a_valid_id(cutting_outbox, agent):
    outbox = cutting_outbox(agent)
    await aaccept(outbox)
    for bad in ("", "bad id", "..", "x" * 129):
        with pytest.raises(ValueError):
            await outbox.ainterrupt(WS, SES, entry_id=bad)
        with pytest.raises(ValueError):
            outbox.interrupt(WS, SES, entry_id=bad)
    assert not (await outbox.alist(WS, SES))[0].interrupted
    await outbox.aclose()


async def test_a_cut_before_the_send_ends_cancelled_and_is_never_sent(cutting_outbox, signals_log):
    agent = TurnAgent(gate_open=False)  # claimed, not yet sent
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await wait_for(
        lambda: _status_of(outbox, first.id, "delivering"), timeout=5, message="not claimed"
    )

    assert await outbox.acut(WS, SES, first.id) is InterruptResult.CUT
    await asyncio.wait_for(step, 5)
    agent.gate.set()  # the agent would take it now: it must not be sent any more
    for _ in range(3):
        await outbox.adeliver_once(WS, SES)
        if first.id not in [e.id for e in await outbox.alist(WS, SES)]:
            break

    assert first.id not in agent.transcript
    assert first.id not in signals_log.ids("delivered")
    states = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == first.id]
    assert states[-1] == "cancelled"
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id]
    await outbox.aclose()


async def _status_of(outbox, entry_id, status):
    return any(e.id == entry_id and str(e.status) == status for e in await outbox.alist(WS, SES))


async def test_without_an_aborter_a_cut_is_not_supported_and_the_queue_is_untouched(
    cutting_outbox, agent
):
    outbox = cutting_outbox(agent, aborter=None)
    entry = await aaccept(outbox)
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    before = await outbox.alist(WS, SES)

    assert await outbox.ainterrupt(WS, SES) is InterruptResult.NOT_SUPPORTED
    assert outbox.cut(WS, SES, entry.id) is InterruptResult.NOT_SUPPORTED
    assert await outbox.alist(WS, SES) == before
    agent.turn_over.set()
    await asyncio.wait_for(step, 5)
    await outbox.aclose()


async def test_stop_with_nothing_in_flight_is_idle_and_a_queued_entry_is_not_cut(
    cutting_outbox, agent
):
    outbox = cutting_outbox(agent)
    entry = await aaccept(outbox)
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.IDLE
    assert await outbox.acut(WS, SES, entry.id) is InterruptResult.QUEUED
    assert await outbox.acut(WS, SES, "nope") is InterruptResult.NOT_FOUND
    assert not (await outbox.alist(WS, SES))[0].interrupted
    with pytest.raises(ValueError):
        await outbox.acut(WS, SES, "bad id")
    await outbox.aclose()


async def test_a_cut_mark_outlives_its_holder_recovery_aborts_then_verifies(
    cutting_outbox, agent, r, signals_log
):
    """The holder dies mid-cut (its lease is gone, its cut signal expired): recovery
    returns the entry as verifying with its mark; the verification aborts the turn
    first and never sends it again."""
    outbox = cutting_outbox(agent)
    entry = await aaccept(outbox)
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    step.cancel()  # stands for the dead worker: ...
    await asyncio.gather(step, return_exceptions=True)
    agent.running.set()  # (the agent's turn still runs: nobody aborted it)
    agent.turn_over.clear()
    keys = outbox.keys.session(WS, SES)
    assert await outbox.acut(WS, SES, entry.id) is InterruptResult.CUT
    r.delete(keys.lock, outbox.keys.cut(WS, SES))  # ... whose lease and signal are gone

    await outbox.arecover()
    listed = await outbox.alist(WS, SES)
    assert [(e.id, str(e.status), e.interrupted) for e in listed] == [(entry.id, "verifying", True)]
    await outbox.adeliver_once(WS, SES)
    assert agent.aborts >= 1 and agent.turn_over.is_set()
    delivered = [e for e, _ in signals_log.calls["delivered"] if e.id == entry.id]
    assert len(delivered) == 1 and delivered[0].interrupted is True
    assert agent.transcript.count(entry.id) == 1
    await outbox.aclose()


async def test_send_now_makes_a_prompt_next_and_cuts_the_running_turn(
    cutting_outbox, agent, signals_log
):
    outbox = cutting_outbox(agent)
    running = await aaccept(outbox, "k1", "running")
    second = await aaccept(outbox, "k2", "second")
    urgent = await aaccept(outbox, "k3", "urgent")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)

    assert await outbox.asend_now(WS, SES, urgent.id) is SendNowResult.CUT
    assert await outbox.asend_now(WS, SES, running.id) is SendNowResult.BUSY
    assert await outbox.asend_now(WS, SES, "gone") is SendNowResult.NOT_FOUND
    moved = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == urgent.id]
    assert moved[-1] == "moved"
    # The cut one is told in its own state, now interrupted: it did not move.
    cut = [
        (kw["state"], e.interrupted) for e, kw in signals_log.calls["updated"] if e.id == running.id
    ]
    assert cut[-1] == ("delivering", True)
    await asyncio.wait_for(step, 5)
    # The cut turn is verified first, then the urgent prompt goes, then the rest.
    assert [e.id for e in await outbox.alist(WS, SES)] == [running.id, urgent.id, second.id]
    assert await outbox.adeliver_once(WS, SES)  # verifies the cut one: delivered
    assert [e.id for e in await outbox.alist(WS, SES)] == [urgent.id, second.id]
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await wait_for(lambda: agent.transcript[-1:] == [urgent.id], timeout=5)
    assert agent.transcript == [running.id, urgent.id]
    # The cut signal still names the cut prompt: the next turn is not cut by it.
    aborts = agent.aborts
    await asyncio.sleep(CUT_POLL * 3)  # three looks of the holder's cut watch
    assert (agent.aborts, step.done(), agent.running.is_set()) == (aborts, False, True)
    agent.turn_over.set()
    await asyncio.wait_for(step, 5)
    assert signals_log.ids("delivered") == [running.id, urgent.id]
    await outbox.aclose()


async def test_send_now_with_nothing_running_only_moves_and_without_an_aborter_is_refused(
    cutting_outbox, agent
):
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    assert await outbox.asend_now(WS, SES, second.id) is SendNowResult.MOVED
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id, first.id]
    plain = cutting_outbox(agent, aborter=None)
    assert plain.send_now(WS, SES, first.id) is SendNowResult.NOT_SUPPORTED
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id, first.id]
    await outbox.aclose()
    await plain.aclose()


async def test_send_now_of_a_parked_prompt_is_busy_and_moves_nothing(cutting_outbox, agent):
    """Send-now is for a queued prompt waiting its turn: a prompt parked by its workspace
    is held by staff, so it answers BUSY and stays where it is, parked
    (docs/howto/cutting.md)."""
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    assert await outbox.apark_workspace(WS, "maintenance") == 2
    assert await outbox.asend_now(WS, SES, second.id) is SendNowResult.BUSY
    listed = await outbox.alist(WS, SES)
    assert [(e.id, str(e.status)) for e in listed] == [
        (first.id, "parked"),
        (second.id, "parked"),
    ]
    await outbox.aclose()


async def test_accept_interrupting_puts_the_prompt_next_and_cuts_the_turn(cutting_outbox, agent):
    outbox = cutting_outbox(agent)
    running = await aaccept(outbox, "k1", "running")
    queued = await aaccept(outbox, "k2", "queued")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    entry, result = await outbox.aaccept_interrupting(
        WS, SES, user_id="u", client_message_id="k3", text="now"
    )
    assert result is SendNowResult.CUT
    await asyncio.wait_for(step, 5)
    assert [e.id for e in await outbox.alist(WS, SES)] == [running.id, entry.id, queued.id]
    with pytest.raises(Duplicate):  # a client's retry cuts nothing more
        outbox.accept_interrupting(WS, SES, user_id="u", client_message_id="k3", text="now")
    plain = cutting_outbox(agent, aborter=None)
    with pytest.raises(CutNotSupported):
        await plain.aaccept_interrupting(WS, SES, user_id="u", client_message_id="k4", text="x")
    assert len(await outbox.alist(WS, SES)) == 3  # nothing stored
    assert (await plain.aaccept(WS, SES, user_id="u", client_message_id="k4", text="x")).id
    await outbox.aclose()
    await plain.aclose()


async def test_accept_if_busy_interrupt_is_accept_interrupting(cutting_outbox, agent):
    outbox = cutting_outbox(agent)
    running = await aaccept(outbox, "k1", "running")
    queued = await aaccept(outbox, "k2", "queued")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    entry = await outbox.aaccept(
        WS, SES, user_id="u", client_message_id="k3", text="now", if_busy="interrupt"
    )
    assert entry.mode == "interrupt"
    await asyncio.wait_for(step, 5)  # the turn was cut
    assert agent.aborts == 1
    listed = await outbox.alist(WS, SES)
    assert [(e.id, e.interrupted) for e in listed] == [
        (running.id, True),
        (entry.id, False),
        (queued.id, False),
    ]
    assert listed[1].mode == "interrupt"
    # The sync twin with nothing in flight: next in the queue, nothing to cut.
    later = outbox.accept(
        WS, SES, user_id="u", client_message_id="k4", text="later", if_busy="interrupt"
    )
    assert [e.id for e in await outbox.alist(WS, SES)][:2] == [running.id, later.id]
    with pytest.raises(Duplicate):
        outbox.accept(
            WS, SES, user_id="u", client_message_id="k4", text="later", if_busy="interrupt"
        )
    with pytest.raises(InvalidContent):
        outbox.accept_interrupting(
            WS, SES, user_id="u", client_message_id="k5", text="x", if_busy="merge"
        )
    plain = cutting_outbox(agent, aborter=None)
    with pytest.raises(CutNotSupported):
        plain.accept(WS, SES, user_id="u", client_message_id="k5", text="x", if_busy="interrupt")
    with pytest.raises(CutNotSupported):
        await plain.aaccept(
            WS, SES, user_id="u", client_message_id="k5", text="x", if_busy="interrupt"
        )
    assert len(await outbox.alist(WS, SES)) == 4  # nothing stored, the key stays free
    assert (await plain.aaccept(WS, SES, user_id="u", client_message_id="k5", text="x")).id
    assert agent.aborts == 1
    await outbox.aclose()
    await plain.aclose()


async def test_send_now_stays_behind_a_prompt_whose_outcome_is_being_verified(
    cutting_outbox, agent
):
    outbox = cutting_outbox(agent)
    unsure = await aaccept(outbox, "k1", "unsure")
    second = await aaccept(outbox, "k2", "second")
    urgent = await aaccept(outbox, "k3", "urgent")

    async def cut_off(entry, **kwargs):
        raise AmbiguousError("connection cut mid-turn")

    await outbox.adeliver_once(WS, SES, cut_off)  # its turn may still run: verifying
    assert await outbox.asend_now(WS, SES, urgent.id) is SendNowResult.CUT
    listed = await outbox.alist(WS, SES)
    assert [(e.id, str(e.status), e.interrupted) for e in listed] == [
        (unsure.id, "verifying", True),
        (urgent.id, "pending", False),
        (second.id, "pending", False),
    ]
    assert listed[0].next_attempt_at is None  # due now: its turn is aborted at once
    await outbox.aclose()


@pytest.mark.parametrize(
    "refusal",
    [
        TransientDeliveryError("connection refused: nothing sent"),
        PriorAttemptPendingError("the previous attempt is still owned downstream"),
        RuntimeError("HTTP 400: refused"),
    ],
    ids=["transient", "prior_pending", "failed"],
)
async def test_a_cut_prompt_that_provably_never_reached_the_agent_ends_cancelled(
    cutting_outbox, agent, signals_log, refusal
):
    """The send fails in a way that proves nothing reached the agent (nothing sent, a prior
    attempt still owned downstream, a definitive refusal) just as the turn is cut: the
    prompt leaves as cancelled, never retried later (a cut never causes a send:
    docs/howto/cutting.md), and the next prompt goes."""
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    calls, cuts = [], []

    async def refuses_while_cut(entry, **kwargs):
        calls.append(entry.id)
        if calls == [first.id]:
            cuts.append(await outbox.acut(WS, SES, entry.id))
            raise refusal

    await outbox.adeliver_once(WS, SES, refuses_while_cut)
    assert cuts == [InterruptResult.CUT]
    states = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == first.id]
    assert states[-1] == "cancelled"
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id]
    await outbox.adeliver_once(WS, SES, refuses_while_cut)
    assert calls == [first.id, second.id]
    assert first.id not in signals_log.ids("delivered")
    await outbox.aclose()


async def test_a_cut_prompt_the_agent_asked_to_hold_ends_cancelled_never_sent_later(
    cutting_outbox, agent, signals_log
):
    """The agent answers "come back later" (429/503 with Retry-After: nothing taken) just as
    the turn is cut: the prompt provably never reached it, so it leaves as cancelled (not
    held for a later send: a cut never causes one) and the next prompt goes."""
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    calls, cuts = [], []

    async def holds_while_cut(entry, **kwargs):
        calls.append(entry.id)
        if calls == [first.id]:
            cuts.append(await outbox.acut(WS, SES, entry.id))
            raise HoldDeliveryError("HTTP 429: busy", retry_after=0.05)

    await outbox.adeliver_once(WS, SES, holds_while_cut)
    assert cuts == [InterruptResult.CUT]
    states = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == first.id]
    assert states[-1] == "cancelled"
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id]
    await outbox.adeliver_once(WS, SES, holds_while_cut)
    assert calls == [first.id, second.id]
    assert first.id not in signals_log.ids("delivered")
    await outbox.aclose()


async def test_an_attempt_watched_right_after_the_last_one_ended_still_sees_its_cut(
    cutting_outbox, agent, r
):
    """One event loop's cut watch stops its background look when the last attempt is
    unwatched; an attempt watched in that same moment (one delivery ends as the next
    begins) must still be looked at, or its cut goes unseen until DELIVERY_TIMEOUT."""
    outbox = cutting_outbox(agent)
    watch = outbox._cut_watch()
    watch.watch("attempt-1", outbox.keys.cut(WS, "s1"), "e1")
    await asyncio.sleep(0)  # the background look is running (asleep until its first round)
    watch.unwatch("attempt-1")
    cut = watch.watch("attempt-2", outbox.keys.cut(WS, "s2"), "e2")
    r.set(outbox.keys.cut(WS, "s2"), "e2")
    try:
        await asyncio.wait_for(cut.wait(), 20 * CUT_POLL)
    finally:
        watch.unwatch("attempt-2")
        await asyncio.gather(watch.task, return_exceptions=True)  # its last look ends here
        await outbox.aclose()


@pytest.mark.parametrize(
    "refusal",
    [
        TransientDeliveryError("stopped before the request was written"),
        PriorAttemptPendingError("the previous attempt is still owned downstream"),
        RuntimeError("HTTP 400: refused"),
        HoldDeliveryError("HTTP 429: busy", retry_after=0.05),
    ],
    ids=["transient", "prior_pending", "failed", "held"],
)
async def test_a_send_the_cut_stops_that_proves_nothing_arrived_ends_cancelled_unverified(
    cutting_outbox, agent, signals_log, refusal
):
    """The holder sees the cut while the send still runs and stops it; the deliverer ends
    with an answer proving the agent has nothing (nothing sent, a prior attempt owned
    downstream, a refusal, a hold). That outcome stands: the prompt leaves as cancelled
    with no abort and no verification (docs/howto/cutting.md), and the next one goes."""
    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    sending = asyncio.Event()
    calls = []

    async def stopped_with_proof(entry, **kwargs):
        calls.append(entry.id)
        if entry.id != first.id:
            return
        sending.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise refusal from None

    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES, stopped_with_proof))
    await asyncio.wait_for(sending.wait(), 10)
    assert await outbox.acut(WS, SES, first.id) is InterruptResult.CUT
    assert await asyncio.wait_for(step, 10)
    states = [kw["state"] for e, kw in signals_log.calls["updated"] if e.id == first.id]
    assert states[-1] == "cancelled"
    assert (agent.aborts, agent.verifies) == (0, 0)
    assert [e.id for e in await outbox.alist(WS, SES)] == [second.id]
    await outbox.adeliver_once(WS, SES, stopped_with_proof)
    assert calls == [first.id, second.id]
    assert first.id not in signals_log.ids("delivered")
    await outbox.aclose()


async def test_an_aborter_that_fails_is_logged_redacted_and_the_verifier_still_decides(
    cutting_outbox, agent, caplog
):
    """A failed abort changes no outcome: the cut attempt is still verified. The warning
    names the entry and carries the error as stored errors are (credentials removed:
    docs/explanation/security.md), never the aborter's raw message."""

    async def refusing_abort(entry, **kwargs):
        raise RuntimeError("abort refused by http://user:s3cret@agent:4096/abort")

    outbox = cutting_outbox(agent, aborter=refusing_abort)
    first = await aaccept(outbox, "k1", "first")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    with caplog.at_level(logging.WARNING, "django_outbox"):
        assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
        assert await asyncio.wait_for(step, 5)
    [record] = [r for r in caplog.records if "abort of" in r.getMessage()]
    message = record.getMessage()
    assert message.startswith(f"outbox: abort of {WS}/{SES} {first.id} failed: RuntimeError: ")
    assert "s3cret" not in message and "user:***@agent" in message
    head = (await outbox.alist(WS, SES))[0]
    assert (head.id, str(head.status), head.interrupted) == (first.id, "verifying", True)
    await outbox.aclose()


async def test_an_aborter_that_hangs_is_given_up_on_and_the_cut_goes_on(
    cutting_outbox, agent, caplog, monkeypatch
):
    """The aborter is bounded (ABORT_TIMEOUT, made short here): one that never returns
    does not hold the lease holder forever; the attempt ends unknown and is verified."""
    monkeypatch.setattr(cutting, "ABORT_TIMEOUT", 0.2)
    hung = asyncio.Event()

    async def hanging_abort(entry, **kwargs):
        hung.set()
        await asyncio.Event().wait()

    outbox = cutting_outbox(agent, aborter=hanging_abort)
    first = await aaccept(outbox, "k1", "first")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    with caplog.at_level(logging.WARNING, "django_outbox"):
        assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
        await asyncio.wait_for(hung.wait(), 5)
        assert await asyncio.wait_for(step, 5)
    assert f"abort of {WS}/{SES} {first.id} failed: TimeoutError" in caplog.text
    head = (await outbox.alist(WS, SES))[0]
    assert (head.id, str(head.status), head.interrupted) == (first.id, "verifying", True)
    await outbox.aclose()


@pytest.mark.parametrize("ending", ["returns", "raises"])
async def test_a_delivery_call_that_swallows_its_cancellation_is_aborted_while_it_runs(
    cutting_outbox, agent, caplog, monkeypatch, signals_log, ending
):
    """A deliverer that swallows the cancellation (a client library can: redis-py's
    asyncio client sometimes returns a reply to a cancelled command) runs on until its
    turn ends. The holder waits ``CANCEL_GRACE`` (made short here), then calls the
    aborter while the call still runs: the turn ends, the call ends, and the attempt
    is verified, whether the call returns or raises (an error after the abort may be
    the abort's doing: it proves no failure). Aborting only after the call ended waited
    for a turn that only the abort could end (docs/howto/cutting.md, "How the cut is
    carried out")."""
    monkeypatch.setattr(cutting, "CANCEL_GRACE", 0.2)
    swallowed = asyncio.Event()

    async def deliver_swallowing(entry, **kwargs):
        agent.start_turn(entry)
        give_up = asyncio.get_running_loop().time() + 15  # so a regression fails, not hangs
        while not agent.turn_over.is_set() and asyncio.get_running_loop().time() < give_up:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                swallowed.set()  # and on with the turn
        if ending == "raises":
            raise RuntimeError("the turn was aborted")

    outbox = cutting_outbox(agent)
    first = await aaccept(outbox, "k1", "first")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES, deliverer=deliver_swallowing))
    await asyncio.wait_for(agent.running.wait(), 5)
    with caplog.at_level(logging.WARNING, "django_outbox"):
        assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
        await asyncio.wait_for(swallowed.wait(), 5)
        assert await asyncio.wait_for(step, 5)  # the abort ended the turn and the call
    assert agent.aborts == 1
    assert "did not end 0.2s after its cancellation; aborting the turn while it runs" in (
        caplog.text
    )
    head = (await outbox.alist(WS, SES))[0]  # the swallowed cancellation proves nothing
    assert (head.id, str(head.status), head.interrupted) == (first.id, "verifying", True)
    assert await outbox.adeliver_once(WS, SES)  # the verification: the agent has it
    assert [e.id for e, _ in signals_log.calls["delivered"]] == [first.id]
    assert agent.transcript == [first.id]  # sent once
    await outbox.aclose()


async def test_the_cut_signal_expires_with_a_lease_and_a_repeated_cut_sets_it_again(
    cutting_outbox, agent, r, signals_log
):
    """The signal key names the cut entry for one lease's TTL (LOCK_TTL) and no longer: a
    holder notices within that time or has lost its lease. Stop again ("already") sets it
    again, for a holder that came after the first signal was gone."""
    outbox = cutting_outbox(agent, lock_ttl=7)
    unsure = await aaccept(outbox, "k1", "unsure")

    async def cut_off(entry, **kwargs):
        raise AmbiguousError("connection cut mid-turn")

    await outbox.adeliver_once(WS, SES, cut_off)  # verifying: its turn may still run
    signal = outbox.keys.cut(WS, SES)
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
    assert r.get(signal) == unsure.id
    assert 6000 < r.pttl(signal) <= 7000
    # Watchers see the entry as it is: still verifying, now interrupted (its outcome is
    # not known yet, so not "cancelled").
    [(told, kw)] = [(e, kw) for e, kw in signals_log.calls["updated"] if e.interrupted]
    assert (told.id, kw["state"]) == (unsure.id, "verifying")
    r.delete(signal)
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.ALREADY
    assert r.get(signal) == unsure.id and 6000 < r.pttl(signal) <= 7000
    await outbox.aclose()


async def test_without_a_verifier_a_cut_delivery_waits_for_a_person_never_resent(
    make_outbox, agent
):
    """No verifier: the cut attempt's outcome cannot be checked, so it is recorded
    unverifiable at once (error, for a person to decide: docs/howto/cutting.md), never
    left verifying with nothing to verify it, never sent again."""
    outbox = make_outbox(deliverer=agent.deliver, aborter=agent.abort, retry_backoff=0.05)
    first = await aaccept(outbox, "k1", "first")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
    assert await asyncio.wait_for(step, 5)
    [head] = await outbox.alist(WS, SES)
    assert (head.id, str(head.status), head.reason, head.interrupted) == (
        first.id,
        "error",
        "unverifiable",
        True,
    )
    assert agent.aborts == 1 and agent.transcript == [first.id]
    await outbox.aclose()


async def test_stop_during_a_verification_aborts_the_turn_that_may_still_run(
    make_outbox, agent, signals_log
):
    """The verification of an unsure delivery runs while the agent's turn may still run:
    Stop then makes the holder call the aborter (within CUT_POLL), and the verifier's
    answer stands (docs/howto/cutting.md)."""
    checking, aborted = asyncio.Event(), asyncio.Event()

    async def abort(entry, **kwargs):
        aborted.set()

    async def slow_verify(entry, **kwargs):
        checking.set()
        await asyncio.wait_for(aborted.wait(), 5)  # the agent answers once its turn ended
        return Verdict.DELIVERED

    outbox = make_outbox(
        deliverer=agent.deliver, verifier=slow_verify, aborter=abort, verify_delay=0
    )
    unsure = await aaccept(outbox, "k1", "unsure")

    async def cut_off(entry, **kwargs):
        raise AmbiguousError("connection cut mid-turn")

    await outbox.adeliver_once(WS, SES, cut_off)
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(checking.wait(), 5)
    loop = asyncio.get_running_loop()
    asked = loop.time()
    assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
    await asyncio.wait_for(aborted.wait(), 10)
    # Looked at every 0.25 s (docs/howto/cutting.md): the watch began as the verification
    # did, so a look every 2.5 s would come about 2.5 s after the Stop; 2 s leaves a loaded
    # machine room.
    assert loop.time() - asked < 2.0
    assert await asyncio.wait_for(step, 10)
    assert await outbox.alist(WS, SES) == []
    [(done, _)] = signals_log.calls["delivered"]
    assert (done.id, done.interrupted) == (unsure.id, True)
    await outbox.aclose()


async def test_send_now_never_jumps_a_verification_behind_an_entry_waiting_for_a_person(
    make_outbox, agent
):
    """The prompt sent now goes in front of the first *pending* entry: an expired entry at
    the head (waiting for a person) does not make it jump the verification behind that
    entry, whose cut turn is verified before anything new is sent (docs/howto/cutting.md)."""
    now = [1_900_000_000.0]
    outbox = make_outbox(
        deliverer=agent.deliver, verifier=agent.verify, aborter=agent.abort, clock=lambda: now[0]
    )
    stale = await aaccept(outbox, "k1", "stale", expires_after=1)
    unsure = await aaccept(outbox, "k2", "unsure")
    later = await aaccept(outbox, "k3", "later")
    urgent = await aaccept(outbox, "k4", "urgent")

    async def cut_off(entry, **kwargs):
        raise AmbiguousError("connection cut mid-turn")

    now[0] += 2  # the head expires as it is claimed; the next one's outcome is unknown
    await outbox.adeliver_once(WS, SES, cut_off)
    assert await outbox.asend_now(WS, SES, urgent.id) is SendNowResult.CUT
    listed = [(e.id, str(e.status)) for e in await outbox.alist(WS, SES)]
    assert listed == [
        (stale.id, "expired"),
        (unsure.id, "verifying"),
        (urgent.id, "pending"),
        (later.id, "pending"),
    ]
    await outbox.aclose()
