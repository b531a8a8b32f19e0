"""django-outbox: accept prompts into Valkey, deliver them to an agent from a worker.

Public API (docs/reference/python.md)::

    from django_outbox import get_outbox, Entry, Status, Verdict, RetryResult, DismissResult
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.entry import (
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_FAILED,
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_STALLED,
    LEDGER_STATE_TURN_ENDED,
    DismissResult,
    Entry,
    InterruptResult,
    RetryResult,
    SendNowResult,
    Status,
    Verdict,
)

if TYPE_CHECKING:
    from .outbox import Outbox, get_outbox

#: The package's version (the one place it is written; pyproject.toml reads it).
__version__ = "0.1.0"

__all__ = [
    "LEDGER_STATE_ADMITTED",
    "LEDGER_STATE_FAILED",
    "LEDGER_STATE_LEDGERED",
    "LEDGER_STATE_PROMOTED",
    "LEDGER_STATE_STALLED",
    "LEDGER_STATE_TURN_ENDED",
    "DismissResult",
    "Entry",
    "InterruptResult",
    "Outbox",
    "RetryResult",
    "SendNowResult",
    "Status",
    "Verdict",
    "get_outbox",
]


def __getattr__(name: str) -> Any:
    # Outbox and get_outbox import Django signals; load them on first use so
    # importing the package never needs configured settings.
    if name in ("Outbox", "get_outbox"):
        from . import outbox

        return getattr(outbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
