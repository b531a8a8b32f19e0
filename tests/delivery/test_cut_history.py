"""A Stop in the per-minute history: counted as a cut, never as a failure or an unknown;
and in the entry while it is verified: its ``errorKind`` is ``stopped``, not ``failed``.

docs/howto/cutting.md and docs/howto/observe.md#the-dashboard. The agent is an in-process
stand-in whose turn runs until aborted and whose verifier reads its transcript; Valkey,
the delivery step, its cut watch and the history it writes are the real ones. What the
dashboard and ``manage.py outbox status`` show is :func:`summary` of this history.
"""

from __future__ import annotations

import asyncio

from django_outbox import InterruptResult, Verdict
from django_outbox.core.history import summary
from django_outbox.core.rules import ErrorKind, summarize_error
from tests.support.helpers import aaccept, wait_for

WS, SES = "w1", "s1"


class TurnAgent:
    """A turn that runs until aborted; ``gate`` closed: claimed but not yet sent."""

    def __init__(self, *, gate_open: bool = True) -> None:
        self.gate = asyncio.Event()
        if gate_open:
            self.gate.set()
        self.transcript: list[str] = []
        self.running = asyncio.Event()
        self.turn_over = asyncio.Event()

    async def deliver(self, entry, **kwargs):
        await self.gate.wait()
        self.transcript.append(entry.id)
        self.turn_over.clear()
        self.running.set()
        await self.turn_over.wait()

    async def abort(self, entry, **kwargs):
        self.running.clear()
        self.turn_over.set()

    async def verify(self, entry, **kwargs):
        return Verdict.DELIVERED if entry.id in self.transcript else Verdict.ABSENT


def cutting_outbox(make_outbox, agent: TurnAgent):
    return make_outbox(
        deliverer=agent.deliver,
        verifier=agent.verify,
        aborter=agent.abort,
        verify_delay=0,
        verify_backoff=0.05,
        max_verify_backoff=0.2,
    )


async def totals(outbox) -> dict:
    """The last five minutes of the workspace's history, as the dashboard and the command
    line sum them (on a cluster the total gets the scripts' counts only when a worker
    samples the minute after: the workspace's own history is exact at once)."""
    return summary(await asyncio.to_thread(outbox.history, 5, WS))


async def _in_list(outbox, entry_id: str, status: str | None = None) -> bool:
    return any(
        e.id == entry_id and (status is None or str(e.status) == status)
        for e in await outbox.alist(WS, SES)
    )


async def test_a_stop_the_agent_got_counts_as_a_cut_and_a_delivery_not_a_failure(make_outbox):
    agent = TurnAgent()
    outbox = cutting_outbox(make_outbox, agent)
    first = await aaccept(outbox, "k1", "first")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(agent.running.wait(), 5)
    assert await outbox.ainterrupt(WS, SES, entry_id=first.id) is InterruptResult.CUT
    await asyncio.wait_for(step, 5)
    (cut,) = await outbox.alist(WS, SES)
    assert (cut.id, str(cut.status), cut.interrupted) == (first.id, "verifying", True)
    # What every viewer reads of it while it is verified: the cut, not a failure.
    assert summarize_error(cut.last_error).kind is ErrorKind.STOPPED
    assert "fail" not in summarize_error(cut.last_error).text
    assert await outbox.adeliver_once(WS, SES)  # the verification: the agent has it
    assert not await _in_list(outbox, first.id)

    seen = await totals(outbox)
    assert (seen["cutTurns"], seen["delivered"], seen["cancelled"]) == (1, 1, 0)
    assert (seen["failedAttempts"], seen["unknownOutcomes"], seen["movedToError"]) == (0, 0, 0)
    await outbox.aclose()


async def test_a_stop_before_the_send_counts_as_a_cut_and_a_cancellation(make_outbox):
    agent = TurnAgent(gate_open=False)
    outbox = cutting_outbox(make_outbox, agent)
    first = await aaccept(outbox, "k1", "first")
    step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
    await wait_for(
        lambda: _in_list(outbox, first.id, "delivering"), timeout=5, message="not claimed"
    )
    assert await outbox.ainterrupt(WS, SES, entry_id=first.id) is InterruptResult.CUT
    await asyncio.wait_for(step, 5)
    agent.gate.set()
    for _ in range(3):  # the verification finds nothing: it leaves cancelled, never sent
        if not await _in_list(outbox, first.id):
            break
        await outbox.adeliver_once(WS, SES)
    assert not await _in_list(outbox, first.id)
    assert first.id not in agent.transcript

    seen = await totals(outbox)
    assert (seen["cutTurns"], seen["cancelled"], seen["delivered"]) == (1, 1, 0)
    assert (seen["failedAttempts"], seen["unknownOutcomes"]) == (0, 0)
    await outbox.aclose()


async def test_a_cancelled_queued_prompt_counts_as_a_cancellation(make_outbox):
    agent = TurnAgent()
    outbox = cutting_outbox(make_outbox, agent)
    await aaccept(outbox, "k1", "first")
    second = await aaccept(outbox, "k2", "second")
    await outbox.acancel(WS, SES, second.id)

    seen = await totals(outbox)
    assert (seen["cancelled"], seen["cutTurns"], seen["failedAttempts"]) == (1, 0, 0)
    await outbox.aclose()
