"""The heartbeat duty: a worker's liveness record, read by the admin's workers
page and ``outbox_worker --check`` (docs/reference/commands.md). The record, its
write and its reads are :mod:`~django_outbox.core.heartbeats`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from ..heartbeats import HEARTBEAT_INTERVAL
from . import Duty


class HeartbeatOutbox(Protocol):
    """What the heartbeat duty uses of the outbox."""

    async def aforget_worker(self, worker_id: str) -> None: ...


def heartbeat(outbox: HeartbeatOutbox, worker_id: str, beat: Callable[[], Awaitable[None]]) -> Duty:
    """``beat`` (the worker's :meth:`~django_outbox.core.worker.Worker.beat`) at the
    start and every ``HEARTBEAT_INTERVAL`` seconds, in a ``once`` run too; at the
    stop the record is removed (``aforget_worker``)."""

    async def forget() -> None:
        try:
            await outbox.aforget_worker(worker_id)
        except Exception:
            pass  # the record expires HEARTBEAT_TTL after the last beat anyway

    return Duty("heartbeat", HEARTBEAT_INTERVAL, beat, first_after=0.0, finish=forget, burst=True)
