"""Receivers that raise in a worker: each failure is logged with the receiver's dotted name,
counted by signal and receiver (``outbox_receiver_failures_total``) and told in the worker's
summary, plain and ``once=True`` receivers alike (docs/reference/signals.md). The database
connection a restarted PostgreSQL dropped under a running worker is
tests/faults/test_database_restart.py."""

from __future__ import annotations

import asyncio
import io
import logging

import pytest
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.test import override_settings

from django_outbox import receipts
from django_outbox.core.worker import WorkerStats
from django_outbox.metrics import WorkerMetrics
from django_outbox.signals import entry_delivered, entry_updated
from tests.support.helpers import SES, WS, aaccept, accept

pytestmark = pytest.mark.django_db(transaction=True)

HERE = "tests.django.test_receiver_failures"


def broken(sender, entry, **kwargs):
    raise RuntimeError("injected: a sync receiver that always fails")


async def abroken(sender, entry, **kwargs):
    raise RuntimeError("injected: an async receiver that always fails")


def fine(sender, entry, **kwargs):
    pass


def broken_once(sender, entry, **kwargs):
    raise RuntimeError("injected: a once receiver that always fails")


async def deliver(entry, **kwargs):
    """A deliverer that always succeeds."""


@pytest.fixture(autouse=True)
def _reset():
    receipts.FAILURES.clear()
    yield
    for fn in (broken, abroken, fine, broken_once):
        entry_delivered.disconnect(fn)
        entry_updated.disconnect(fn)
        entry_updated.disconnect(abroken)


@pytest.fixture(autouse=True)
def _no_connection_left_in_the_orm_thread():
    """An opted-in receiver's receipt is written from asgiref's one thread-sensitive thread,
    which the whole test run shares: close the connection it leaves there."""
    yield

    def drop() -> None:
        from django.db import connections
        from django.db.backends.base.base import BaseDatabaseWrapper

        for conn in connections.all(initialized_only=True):
            BaseDatabaseWrapper.close(conn)  # SQLite ignores close() on its in-memory database

    asyncio.run(sync_to_async(drop)())


def failures(metrics: WorkerMetrics, signal: str, name: str) -> float | None:
    return metrics.registry.get_sample_value(
        "outbox_receiver_failures_total", {"signal": signal, "receiver": f"{HERE}.{name}"}
    )


async def test_plain_receivers_that_raise_are_logged_by_name_counted_and_summed(
    make_outbox, caplog
):
    entry_delivered.connect(broken)
    entry_delivered.connect(fine)
    outbox = make_outbox(deliverer=deliver)
    metrics = WorkerMetrics(outbox)
    await aaccept(outbox, "m1")
    await aaccept(outbox, "m2")
    entry_updated.connect(abroken)
    with caplog.at_level(logging.ERROR, "django_outbox"):
        stats = await outbox.arun(once=True, heartbeat=False)
    assert stats.steps == 2 and await outbox.alist(WS, SES) == []  # nothing was held
    await outbox.aclose()
    assert receipts.FAILURES == {
        ("entry_delivered", f"{HERE}.broken"): 2,
        ("entry_updated", f"{HERE}.abroken"): 4,  # staged and delivered, twice
    }
    assert failures(metrics, "entry_delivered", "broken") == 2
    assert failures(metrics, "entry_updated", "abroken") == 4
    assert failures(metrics, "entry_delivered", "fine") is None
    records = [r for r in caplog.records if r.name == "django_outbox"]
    assert sum(f"entry_delivered receiver {HERE}.broken failed" in r.message for r in records)
    assert sum(f"entry_updated receiver {HERE}.abroken failed" in r.message for r in records)
    assert all(r.exc_info for r in records), "each with its traceback"
    assert stats.errors == 0 and stats.receiver_failures == 6
    assert stats.summary() == (
        "2 steps, 6 errors (6 receiver calls failed, logged with the receiver's name)"
    )


async def test_a_once_receiver_that_raises_is_logged_by_name_counted_and_summed(
    make_outbox, caplog
):
    entry_delivered.connect(broken_once, once=True)
    outbox = make_outbox(deliverer=deliver, lock_ttl=30)
    metrics = WorkerMetrics(outbox)
    await aaccept(outbox, "m1")
    with caplog.at_level(logging.ERROR, "django_outbox"):
        stats = await outbox.arun(once=True, heartbeat=False)
    await outbox.aclose()

    assert receipts.FAILURES == {("entry_delivered", f"{HERE}.broken_once"): 1}
    assert failures(metrics, "entry_delivered", "broken_once") == 1
    [record] = [r for r in caplog.records if r.name == "django_outbox"]
    assert f"once receiver {HERE}.broken_once failed" in record.message
    assert "stays owed" in record.message and record.exc_info
    assert stats.receiver_failures == 1
    assert stats.summary() == (
        "1 steps, 1 error (1 receiver call failed, logged with the receiver's name)"
    )


def test_a_run_without_failures_still_says_0_errors():
    assert WorkerStats(steps=3).summary() == "3 steps, 0 errors"
    assert WorkerStats(steps=3, errors=2).summary() == "3 steps, 2 errors"
    assert WorkerStats(errors=1, receiver_failures=2).summary() == (
        "0 steps, 3 errors (2 receiver calls failed, logged with the receiver's name)"
    )


@override_settings(OUTBOX={"DELIVERER": "tests.django.test_receiver_failures.deliver"})
def test_the_worker_command_says_receivers_failed(valkey):
    from django_outbox.outbox import get_outbox

    entry_delivered.connect(broken)
    accept(get_outbox(), "m1")
    out = io.StringIO()
    call_command("outbox_worker", "--once", stdout=out, stderr=io.StringIO())
    assert out.getvalue().strip() == (
        "outbox_worker stopped: 1 steps, 1 error (1 receiver call failed, logged with the "
        "receiver's name)"
    )
