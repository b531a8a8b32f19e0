"""A worker's periodic duties, in one shape (docs/explanation/storage.md).

A :class:`Duty` is a job a worker does beside delivering, every so many seconds:
publishing its heartbeat (:mod:`.heartbeat`), repairing the cluster's
workspaces-due index (:mod:`.repair`), sweeping parked ledger errors
(:mod:`.parked_sweep`), writing the per-minute history (:mod:`.history`), and
whatever an outbox registers in its ``duties`` list (the Django layer adds the
pruning of delivery receipts, :func:`django_outbox.receipts.pruner`). The loop
itself (the tick, the wake waits, the dispatch and the drain) is not a duty: it
is :class:`~django_outbox.core.worker.Worker`, which runs each duty the same way.
This module imports nothing of the core, so every floor may name a duty.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Duty:
    """One periodic duty of a worker (Oban's plugins).

    ``start()`` (if any) is awaited once before the worker delivers anything, in a
    ``once`` run too, in the order of the worker's duties. The worker awaits ``run()``
    ``first_after`` seconds after its start (None: one ``interval``), then
    ``interval`` seconds after each pass ends, until it stops; a stop ends the wait
    at once, and a pass still running once the deliveries have drained is
    cancelled. A pass that raises is logged as ``outbox worker <id>: <name> failed:
    <error>`` and the next one comes on time. Only ``burst`` duties run in a
    ``once`` run. When the worker stops, ``finish()`` (if any) is awaited once, even
    in a ``once`` run, in the reverse order of the worker's duties; a failed
    ``start()`` or ``finish()`` is logged as a pass's is. Raises ``ValueError`` for
    an ``interval`` that is not positive or a negative ``first_after``.
    """

    name: str
    interval: float
    run: Callable[[], Awaitable[object]]
    first_after: float | None = None
    finish: Callable[[], Awaitable[object]] | None = None
    burst: bool = False
    start: Callable[[], Awaitable[object]] | None = None

    def __post_init__(self) -> None:
        if not self.interval > 0:
            raise ValueError(f"duty {self.name!r}: interval must be positive seconds")
        if self.first_after is not None and self.first_after < 0:
            raise ValueError(f"duty {self.name!r}: first_after must not be negative")
