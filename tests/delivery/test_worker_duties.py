"""A worker's periodic duties on their quieter paths: what the ledger sweep tells the
operator when it resolved a single entry (docs/explanation/lifecycle.md, "The ledger
probe"; docs/explanation/storage.md for the duties)."""

from __future__ import annotations

import asyncio
import logging
import time

from django_outbox import LEDGER_STATE_TURN_ENDED, Status
from django_outbox.core.duties.history import history
from django_outbox.core.worker import Worker
from tests.support import scenarios
from tests.support.helpers import NO_USER_BOUNDS, SES, WS, aaccept, wait_for
from tests.support.scenarios import ambiguous

amake = scenarios.amake  # the fixture


def an_hour_behind(outbox):
    """The outbox's history counter, on a host clock an hour behind Valkey's."""
    counter = outbox.history_counter
    counter._clock = lambda: time.time_ns() // 1000 - 3_600_000_000
    return counter


async def refuse(entry, **kwargs):
    """A deliverer the agent refuses: a definite failure."""
    raise RuntimeError("refused")


async def test_a_sweep_that_resolves_one_entry_says_so(amake, caplog):
    async def probe(**kwargs):
        return LEDGER_STATE_TURN_ENDED

    outbox = amake(deliverer=ambiguous, ledger_probe=probe, parked_sweep_interval=0.1)
    await aaccept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert (await outbox.alist(WS, SES))[0].status is Status.ERROR  # unverifiable
    caplog.set_level(logging.INFO, logger="django_outbox.worker")
    stop = asyncio.Event()
    worker = Worker(outbox, ambiguous, concurrency=1, tick=30, stop=stop, heartbeat=False)
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(
            lambda: any("ledger sweep" in r.getMessage() for r in caplog.records),
            10,
            message="the sweep's log line",
        )
    finally:
        stop.set()
        await task
    [line] = [r.getMessage() for r in caplog.records if "ledger sweep" in r.getMessage()]
    assert line == f"outbox worker {worker.id}: ledger sweep of {WS}: 1"


async def test_a_worker_an_hour_behind_valkey_counts_in_valkeys_minute(amake):
    """The history duty's first write, at the worker's start with nothing counted yet,
    measures Valkey's clock, so what the worker counts afterwards lands in Valkey's
    minute, not an hour back (docs/howto/observe.md, "The dashboard")."""
    outbox = amake(max_attempts=1, **NO_USER_BOUNDS)
    counter = an_hour_behind(outbox)

    stop = asyncio.Event()
    worker = Worker(outbox, refuse, concurrency=1, tick=30, stop=stop, heartbeat=False)
    task = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: counter.offset_us is not None, 10, message="the first write")
        await aaccept(outbox, "k1", "refused")
        await wait_for(lambda: worker.stats.steps >= 1, 10, message="the refused step")
    finally:
        stop.set()
        await task
    assert outbox.history(minutes=2, workspace_id=WS).total("o:failed") == 1


async def test_a_once_run_an_hour_behind_valkey_counts_in_valkeys_minute(amake):
    """A ``once`` run (``outbox_worker --once``: the history duty's passes do not run, only
    its last write) measures Valkey's clock before it delivers, so a failure it counts
    lands in Valkey's minute, not an hour back (docs/howto/observe.md, "The dashboard")."""
    outbox = amake(max_attempts=1, **NO_USER_BOUNDS)
    an_hour_behind(outbox)
    await aaccept(outbox, "k1", "refused")

    worker = Worker(
        outbox, refuse, concurrency=1, tick=30, once=True, stop=asyncio.Event(), heartbeat=False
    )
    stats = await asyncio.wait_for(worker.run(), 30)
    assert stats.steps == 1
    assert outbox.history(minutes=2, workspace_id=WS).total("o:failed") == 1


async def test_adeliver_once_an_hour_behind_valkey_counts_in_valkeys_minute(amake):
    """``adeliver_once`` with no worker around measures Valkey's clock before its first
    step, so the failure it counts lands in Valkey's minute (docs/howto/observe.md)."""
    outbox = amake(max_attempts=1, **NO_USER_BOUNDS)
    an_hour_behind(outbox)
    await aaccept(outbox, "k1", "refused")

    assert await outbox.adeliver_once(WS, SES, refuse)
    assert outbox.history(minutes=2, workspace_id=WS).total("o:failed") == 1


async def test_the_history_duty_measures_valkeys_clock_on_a_pass_with_nothing_counted(amake):
    """A pass of the history duty with nothing counted still reads Valkey's clock when no
    read has yet (the worker's start-up read failed, Valkey away then), so what is counted
    next lands in Valkey's minute (docs/howto/observe.md, "The dashboard")."""
    outbox = amake(**NO_USER_BOUNDS)
    counter = an_hour_behind(outbox)
    assert counter.offset_us is None and not counter.pending
    await history(outbox, "w-1").run()
    assert abs(counter.offset_us - 3_600_000_000) < 60_000_000
