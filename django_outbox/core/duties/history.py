"""The history duty: the settles a process counted written into the per-minute
history, and the minute's depth sampled (docs/howto/observe.md, "The dashboard";
:mod:`~django_outbox.core.history`)."""

from __future__ import annotations

import time
from typing import Protocol

from ..history import FLUSH_EVERY, HistoryCounter
from . import Duty

SAMPLE_EVERY = 20.0  # seconds between tries to sample the minute's depth (one worker wins)
FIRST_SAMPLE_AFTER = 5.0  # seconds from start to a worker's first try


class HistoryOutbox(Protocol):
    """What the history duty uses of the outbox."""

    history_counter: HistoryCounter

    async def aflush_history(self, counter: HistoryCounter) -> int: ...
    async def asample_history(self, worker_id: str) -> bool: ...


def history(outbox: HistoryOutbox, worker_id: str) -> Duty:
    """Before the worker delivers (in a ``once`` run too), Valkey's clock measured; at
    the start and every ``FLUSH_EVERY`` seconds, the counts since the last write
    written (a first write measures Valkey's clock even with nothing counted), and
    every ``SAMPLE_EVERY`` seconds, the first ``FIRST_SAMPLE_AFTER`` seconds in, the
    minute's depth sampled unless another worker did. At the stop the counts left
    are written. A failed write keeps its counts for the next one. For an outbox
    whose history is on only (``HISTORY_WINDOW`` > 0)."""
    sampled_at: float | None = None

    async def write(sample: bool = False) -> None:
        counter = outbox.history_counter
        if counter.pending or counter.offset_us is None:
            await outbox.aflush_history(counter)
        if sample:
            await outbox.asample_history(worker_id)

    async def run() -> None:
        nonlocal sampled_at
        if sampled_at is None:
            # The first sample FIRST_SAMPLE_AFTER seconds in, not at start: the sample
            # reads every session's statuses, which a short run would pay for per message.
            sampled_at = time.monotonic() - SAMPLE_EVERY + FIRST_SAMPLE_AFTER
        due = time.monotonic() - sampled_at >= SAMPLE_EVERY
        if due:
            sampled_at = time.monotonic()
        await write(sample=due)

    async def measure() -> None:
        # Before the first delivery, in a ``once`` run too (whose passes never run):
        # what is counted before Valkey's clock is measured lands in the host's minute.
        if outbox.history_counter.offset_us is None:
            await outbox.aflush_history(outbox.history_counter)

    return Duty("writing history", FLUSH_EVERY, run, first_after=0.0, finish=write, start=measure)
