"""A running worker whose key space another project takes over (``outbox claim --force``)
stops claiming and delivering within seconds, cancels what it has in flight without
waiting out its grace, and loses nothing: the new owner's worker verifies and delivers
what was accepted before (docs/howto/valkey.md#taking-a-key-space-over)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from django_outbox import Status, Verdict
from django_outbox.core.owner import CLAIM_RECHECK, Claim, KeySpaceOwner
from django_outbox.core.worker import Worker
from django_outbox.errors import KeySpaceTakenOver, OutboxUnavailable
from tests.support import scenarios
from tests.support.helpers import aaccept, wait_for

amake = scenarios.amake  # the fixture

#: The bound a takeover promises: the old worker stops delivering within it.
STOPS_WITHIN = 5.0


class Agent:
    """One project's agent: records what it was sent; with ``holds``, the prompt ``"hold"``
    keeps its turn open until cancelled (an in-flight delivery)."""

    def __init__(self, holds: bool = False) -> None:
        self.holds = holds
        self.sent: list[str] = []
        self.holding = asyncio.Event()
        self.cancelled: list[str] = []

    async def deliver(self, entry, **kwargs) -> None:
        self.sent.append(entry.text)
        if self.holds and entry.text == "hold":
            self.holding.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(entry.text)
                raise

    async def verify(self, entry, **kwargs) -> Verdict:
        return Verdict.DELIVERED if entry.text in self.sent else Verdict.ABSENT


async def test_a_forced_claim_stops_the_running_worker_within_seconds_and_loses_nothing(
    amake, r, caplog
):
    first, second = Agent(holds=True), Agent()
    tunables = {"verify_delay": 0, "retry_backoff": 0.05, "lock_ttl": 30}
    mine = amake(
        deliverer=first.deliver,
        verifier=first.verify,
        key_space_owner=KeySpaceOwner("project-1", label="one.settings"),
        **tunables,
    )
    stop = asyncio.Event()
    worker = Worker(mine, None, concurrency=4, tick=30, stop=stop, grace=30, duties=())
    run = asyncio.create_task(worker.run())
    await aaccept(mine, "before", ses="s0")
    await wait_for(lambda: first.sent == ["before"], 10, message="the first prompt delivered")
    await aaccept(mine, "hold", ses="s1")
    await asyncio.wait_for(first.holding.wait(), 10)

    theirs = amake(
        deliverer=second.deliver,
        verifier=second.verify,
        key_space_owner=KeySpaceOwner("project-2", label="two.settings"),
        **tunables,
    )
    caplog.set_level(logging.ERROR, logger="django_outbox.worker")
    await theirs.aclaim_key_space(force=True)
    taken = time.monotonic()
    with pytest.raises(KeySpaceTakenOver, match=r"'two\.settings'"):
        await asyncio.wait_for(run, STOPS_WITHIN)
    stopped_after = time.monotonic() - taken
    assert stopped_after <= STOPS_WITHIN
    assert stopped_after <= CLAIM_RECHECK + 1.0  # one recheck, not the 30 s grace
    assert first.cancelled == ["hold"]
    assert any("claimed by another project" in rec.getMessage() for rec in caplog.records)

    # The new owner's prompt is never the old worker's to deliver, and the prompt that was
    # in flight when the space changed hands is still there, verified before it is sent.
    await aaccept(theirs, "theirs", ses="s2")
    [held] = await theirs.alist("w1", "s1")
    assert held.status in (Status.VERIFYING, Status.DELIVERING)
    assert Claim.parse(r.get("outboxowner")).id == "project-2"
    stop2 = asyncio.Event()
    new_owner = Worker(theirs, None, concurrency=4, tick=0.1, stop=stop2, duties=())
    second_run = asyncio.create_task(new_owner.run())
    try:
        await wait_for(
            lambda: sorted(second.sent) == ["hold", "theirs"], 40, message="both delivered"
        )
    finally:
        stop2.set()
        await second_run
    assert first.sent == ["before", "hold"]


async def test_the_watch_reads_the_claim_every_recheck_and_an_outage_is_no_takeover(
    amake, r, monkeypatch
):
    """The watch is one GET per ``claim_recheck``; a read that fails is retried at the next
    one, and the worker goes on delivering."""
    agent = Agent()
    mine = amake(deliverer=agent.deliver, key_space_owner=KeySpaceOwner("project-1"))
    mine.claim_recheck = 0.05
    reads = 0
    real = mine.aclaim_key_space

    async def flaky(**kwargs):
        nonlocal reads
        reads += 1
        if reads == 2:
            raise OutboxUnavailable("connection reset")
        return await real(**kwargs)

    monkeypatch.setattr(mine, "aclaim_key_space", flaky)
    stop = asyncio.Event()
    worker = Worker(mine, None, concurrency=1, tick=30, stop=stop, heartbeat=False, duties=())
    run = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: reads >= 5, 10, message="the watch kept reading")
        await aaccept(mine, "after an outage")
        await wait_for(lambda: agent.sent == ["after an outage"], 10, message="delivered")
    finally:
        stop.set()
        await run
    assert worker.taken_over is None


async def test_an_outbox_without_an_owner_is_not_watched(amake):
    outbox = amake(deliverer=Agent().deliver)
    worker = Worker(outbox, None, concurrency=1, tick=30, stop=asyncio.Event())
    assert "key space watch" not in [duty.name for duty in worker.duties]
