"""Plans and their effects: how every outbox operation is written once.

An operation is a *plan*: a generator that yields effects and receives their
results. :class:`Eval` runs a Lua script, :class:`Cmd` a plain command,
:class:`Pipe` several of either in one round trip (each answer or error in
order), :class:`Emit` hands events to the outbox's hooks and :class:`Call`
calls user code (a ledger probe). The sync and the async driver of
:class:`~django_outbox.core.transport.Transport` run the same plans, so
``accept`` and ``aaccept`` share everything but the I/O (docs/explanation/storage.md#architecture).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .entry import OutboxEvent


@dataclass(slots=True)
class Eval:
    """Run script ``script`` (a name of :func:`~django_outbox.core.scripts.load_scripts`)."""

    script: str
    keys: list[str]
    args: list[Any]


@dataclass(slots=True)
class Cmd:
    """Run one Valkey command, e.g. ``Cmd(("ZCARD", key))``."""

    args: tuple[Any, ...]


@dataclass(slots=True)
class Pipe:
    """Run ``calls`` in one round trip; the result is their answers in order, an
    error as its exception object (each script still atomic on its own)."""

    calls: Sequence[Eval | Cmd]


@dataclass(slots=True)
class Emit:
    """Hand ``events`` to the outbox's hooks (``emit`` / ``aemit``). The result is the
    list of events whose hook raised :class:`~django_outbox.core.errors.SignalOwed`
    (empty when every hook ran or failed otherwise: other failures are logged)."""

    events: list[OutboxEvent]


@dataclass(slots=True)
class Call:
    """Call user code (a ledger probe) from a plan."""

    fn: Callable[..., Any]
    kwargs: dict[str, Any]


T = TypeVar("T")

#: A plan returning ``T``: it yields effects and is sent their results (Any: what a
#: script or command answers is decoded by the plan itself).
Plan = Generator[Any, Any, T]


def iter_once(effect: Any) -> Plan[Any]:
    """A plan of one effect, returning its result."""
    return (yield effect)
