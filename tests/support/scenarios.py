"""Shared pieces of the scenario tests (tests/delivery/test_leases.py, test_settle.py,
test_timing.py): an ``amake`` fixture that builds Outbox instances and closes their async
clients too, and deliverers with a fixed ending."""

from __future__ import annotations

import pytest

from django_outbox.errors import AmbiguousError, TransientDeliveryError


@pytest.fixture
async def amake(make_outbox):
    """``make_outbox`` for async tests: every Outbox built is ``aclose``d at teardown."""
    made = []

    def make(**kwargs):
        outbox = make_outbox(**kwargs)
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        await outbox.aclose()


async def nothing(entry, **kwargs) -> None:
    """A deliverer that succeeds."""


async def ambiguous(entry, **kwargs) -> None:
    """A deliverer whose outcome is unknown (the reply was lost)."""
    raise AmbiguousError("the reply was lost")


async def transient(entry, **kwargs) -> None:
    """A deliverer that was refused before anything was sent."""
    raise TransientDeliveryError("connection refused")
