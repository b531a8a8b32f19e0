"""The ledger sweep duty: error entries resolved by asking the ledger probe
(``sweep_workspace_parked_errors``; docs/explanation/lifecycle.md, "The ledger probe")."""

from __future__ import annotations

import logging
from typing import Protocol

from ..config import Config
from . import Duty

logger = logging.getLogger("django_outbox.worker")


class SweepOutbox(Protocol):
    """What the ledger sweep duty uses of the outbox."""

    config: Config

    async def aworkspaces(self) -> list[str]: ...
    async def asweep_workspace_parked_errors(self, workspace_id: str) -> int: ...


def parked_sweep(outbox: SweepOutbox, worker_id: str) -> Duty:
    """Every ``PARKED_SWEEP_INTERVAL`` seconds, the first one after the start: every
    workspace's error entries swept, and each workspace with entries swept logged at
    INFO. For an outbox with a ledger probe only (without one the sweep does nothing)."""

    async def run() -> None:
        for ws in await outbox.aworkspaces():
            swept = await outbox.asweep_workspace_parked_errors(ws)
            if swept:
                logger.info("outbox worker %s: ledger sweep of %s: %d", worker_id, ws, swept)

    return Duty("ledger sweep", outbox.config.parked_sweep_interval, run)
