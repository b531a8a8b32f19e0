"""``entry_delivered`` receivers with ``once=True``: exactly-once effects.

The effects are ``auth.Group`` rows named ``"<entry id>:<n>"`` (a table without a
constraint on them, so a second run of a receiver would show as a second row); the
receipts are :class:`~django_outbox.models.DeliveryReceipt`. The kill-loop across
worker processes is in tests/django/test_receipts_processes.py.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import override_settings

from django_outbox import receipts
from django_outbox.metrics import WorkerMetrics
from django_outbox.models import DeliveryReceipt
from django_outbox.outbox import Outbox
from django_outbox.signals import DeliveredSignal, entry_delivered
from tests.support.helpers import SES, WS, aaccept, accept, make_entry, wait_for
from tests.support.proxy import TcpProxy
from tests.support.receipts import receipts_aged

pytestmark = pytest.mark.django_db(transaction=True)

_serial = itertools.count()
#: How many more calls of the receivers below raise (each call takes one).
failures_left = {"meter": 0, "ameter": 0}
#: Sessions whose entries :func:`meter` always fails on.
failing_sessions: set[str] = set()
#: Calls of the plain receiver: (entry ID, deliveredAt) per firing.
plain_calls: list[tuple[str, str | None]] = []


def meter(sender, entry, **kwargs):
    """An opted-in receiver: one Group row per run; raises after writing while told to."""
    Group.objects.create(name=f"{entry.id}:{next(_serial)}")
    if kwargs["session_id"] in failing_sessions:
        raise RuntimeError("injected: metering of this session fails")
    if failures_left["meter"] > 0:
        failures_left["meter"] -= 1
        raise RuntimeError("injected: metering failed after its write")


async def ameter(sender, entry, **kwargs):
    """The async twin of :func:`meter` (the async ORM: sync_to_async underneath)."""
    await Group.objects.acreate(name=f"{entry.id}:{next(_serial)}")
    await asyncio.sleep(0)
    if failures_left["ameter"] > 0:
        failures_left["ameter"] -= 1
        raise RuntimeError("injected: async metering failed after its write")


def count_firing(sender, entry, **kwargs):
    plain_calls.append((entry.id, entry.delivered_at))


def broken_plain(sender, entry, **kwargs):
    raise RuntimeError("injected: a plain receiver that always fails")


@pytest.fixture(autouse=True)
def _reset():
    failures_left.update(meter=0, ameter=0)
    failing_sessions.clear()
    plain_calls.clear()
    receipts.FAILURES.clear()
    yield
    for fn in (meter, ameter, count_firing, broken_plain):
        entry_delivered.disconnect(fn)


def _drop_this_threads_connections() -> None:
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    for conn in connections.all(initialized_only=True):
        # SQLite ignores close() on the in-memory test database; really close this
        # thread's connection (the database lives on in the main thread's).
        BaseDatabaseWrapper.close(conn)


@pytest.fixture(autouse=True)
def _no_connection_left_in_the_orm_thread():
    """The ORM calls of async code run in asgiref's one thread-sensitive thread, which the
    whole test run shares: a connection left open there would make a later test without
    database access fail when Channels closes old connections."""
    yield
    asyncio.run(sync_to_async(_drop_this_threads_connections)())


def effects(entry_id: str) -> int:
    return Group.objects.filter(name__startswith=f"{entry_id}:").count()


async def aeffects(entry_id: str) -> int:
    return await sync_to_async(effects)(entry_id)


async def areceipts(**filters) -> list[tuple[str, str, str]]:
    rows = DeliveryReceipt.objects.filter(**filters).values_list(
        "entry_id", "delivered_at", "receiver"
    )
    return [tuple(r) async for r in rows]


def fire(entry):
    return entry_delivered.send_robust(
        sender=Outbox, entry=entry, workspace_id=WS, session_id=SES, version=1, state="sent"
    )


# -- the API --------------------------------------------------------------------------------


def test_connect_once_is_a_django_receiver():
    from django.dispatch import receiver

    assert isinstance(entry_delivered, DeliveredSignal)
    entry_delivered.connect(meter, once=True)
    entry_delivered.connect(meter, once=True)  # the same function twice: one registration
    receiver(entry_delivered, once=True)(ameter)  # the decorator passes once= through
    assert sorted(entry_delivered.once_receivers()) == [
        "tests.django.test_receipts.ameter",
        "tests.django.test_receipts.meter",
    ]
    assert entry_delivered.disconnect(meter) and entry_delivered.disconnect(ameter)
    assert entry_delivered.once_receivers() == []
    assert not entry_delivered.disconnect(meter)


def test_a_long_dotted_name_is_cut_with_a_hash():
    def f():
        pass

    f.__qualname__ = "x" * 400
    name = receipts.receiver_name(f)
    assert len(name) == receipts.MAX_NAME and name.startswith("tests.django.test_receipts.xxx")
    f.__qualname__ = "x" * 399 + "y"
    assert receipts.receiver_name(f) != name


def test_a_replay_skips_the_once_receiver_and_runs_the_plain_one():
    entry_delivered.connect(meter, once=True)
    entry_delivered.connect(count_firing)
    entry = make_entry(delivered_at="2026-01-01T00:00:00.000001Z")
    fire(entry)
    fire(entry)  # the same (entry.id, entry.delivered_at): a replay
    assert effects(entry.id) == 1
    assert plain_calls == [(entry.id, entry.delivered_at)] * 2
    assert list(DeliveryReceipt.objects.values_list("entry_id", "delivered_at", "receiver")) == [
        (entry.id, entry.delivered_at, "tests.django.test_receipts.meter")
    ]


def test_a_failed_run_rolls_back_its_write_and_its_receipt(caplog):
    entry_delivered.connect(meter, once=True)
    failures_left["meter"] = 1
    entry = make_entry(delivered_at="2026-01-01T00:00:00.000001Z")
    with caplog.at_level(logging.ERROR, "django_outbox"):
        [(_, response)] = fire(entry)
    assert isinstance(response, RuntimeError)
    assert effects(entry.id) == 0 and DeliveryReceipt.objects.count() == 0
    assert receipts.FAILURES["entry_delivered", "tests.django.test_receipts.meter"] == 1
    assert "stays owed" in caplog.text
    fire(entry)
    assert effects(entry.id) == 1 and DeliveryReceipt.objects.count() == 1


def test_a_failing_plain_receiver_no_longer_stops_the_others():
    # Signal.send stopped at the first exception: a plain receiver that raised kept every
    # later receiver (and the WebSocket publish) from running, and the entry was still
    # acknowledged, so an opted-in receiver connected after it lost its effect.
    entry_delivered.connect(broken_plain)
    entry_delivered.connect(meter, once=True)
    outbox = Outbox(url="redis://127.0.0.1:1/0")  # no Valkey needed: emit only
    entry = make_entry(delivered_at="2026-01-01T00:00:00.000001Z")
    from django_outbox.core.entry import OutboxEvent

    outbox.emit(OutboxEvent("delivered", "sent", entry, WS, SES, 1))
    assert effects(entry.id) == 1


def test_the_sync_emit_runs_an_async_once_receiver_in_its_transaction():
    from django_outbox.core.entry import OutboxEvent
    from django_outbox.core.errors import SignalOwed

    entry_delivered.connect(ameter, once=True)
    failures_left["ameter"] = 1
    outbox = Outbox(url="redis://127.0.0.1:1/0")  # no Valkey needed: emit only
    entry = make_entry(delivered_at="2026-01-01T00:00:00.000001Z")
    event = OutboxEvent("delivered", "sent", entry, WS, SES, 1)
    with pytest.raises(SignalOwed):
        outbox.emit(event)
    assert effects(entry.id) == 0 and DeliveryReceipt.objects.count() == 0
    outbox.emit(event)
    outbox.emit(event)
    assert effects(entry.id) == 1 and DeliveryReceipt.objects.count() == 1


# -- through the worker's delivery step -----------------------------------------------------


async def delivered(entry, **kwargs):
    """A deliverer that always succeeds."""


@pytest.fixture
async def amake_outbox(make_outbox):
    """``make_outbox`` whose async clients are closed on this test's event loop."""
    made = []

    def make(**kwargs):
        made.append(make_outbox(**kwargs))
        return made[-1]

    yield make
    for outbox in made:
        await outbox.aclose()


@pytest.mark.parametrize("fn", [meter, ameter], ids=["sync", "async"])
async def test_a_failing_once_receiver_is_retried_by_the_next_claim_then_recorded_once(
    amake_outbox, fn
):
    entry_delivered.connect(fn, once=True)
    entry_delivered.connect(count_firing)
    failures_left[fn.__name__] = 1
    outbox = amake_outbox(deliverer=delivered, lock_ttl=0.5)
    m1 = await aaccept(outbox, "m1")
    m2 = await aaccept(outbox, "m2")

    assert await outbox.adeliver_once(WS, SES)  # m1 delivered; its receiver raised
    assert await aeffects(m1.id) == 0 and await areceipts() == []
    assert [e.id for e in await outbox.alist(WS, SES)] == [m2.id]
    # The signal is owed under a lease left to expire: no claim before LOCK_TTL.
    assert not await outbox.adeliver_once(WS, SES)

    await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "the owed signal fired")
    name = f"tests.django.test_receipts.{fn.__name__}"
    [(entry_id, delivered_at, receiver)] = await areceipts()
    assert (entry_id, receiver) == (m1.id, name) and delivered_at
    assert await aeffects(m1.id) == 1
    # the plain receiver fired twice, with the same key: at-least-once
    assert plain_calls == [(m1.id, delivered_at)] * 2
    assert receipts.FAILURES["entry_delivered", name] == 1

    assert await outbox.adeliver_once(WS, SES)  # the session moves on: m2
    assert await aeffects(m2.id) == 1 and await outbox.alist(WS, SES) == []
    assert len(plain_calls) == 3


async def test_an_owed_signal_fired_at_last_leaves_no_failure_count(amake_outbox):
    """A receiver that failed (below MAX_RECEIVER_ATTEMPTS) and then ran: once its owed
    signal is fired and acknowledged, the session owes nothing, so it shows no failed
    firings either (docs/reference/signals.md#a-receiver-that-keeps-failing)."""
    entry_delivered.connect(meter, once=True)
    failures_left["meter"] = 2
    outbox = amake_outbox(deliverer=delivered, lock_ttl=0.3, max_receiver_attempts=5)
    m1 = await aaccept(outbox, "m1")

    assert await outbox.adeliver_once(WS, SES)  # delivered; its receiver raised
    await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "an owed firing")
    assert await outbox.aowed_failures(WS, SES) == {m1.id: 2}  # both firings failed
    await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "the owed signal fired")
    assert await aeffects(m1.id) == 1 and failures_left["meter"] == 0  # ran once, at last
    assert await outbox.aowed_failures(WS, SES) == {}
    assert outbox.owed_failures(WS, SES) == {}


async def test_a_permanently_failing_receiver_holds_its_session_visibly(amake_outbox, caplog):
    # Decision (README "Signals"): never given up by itself (its effect would be lost),
    # retried every LOCK_TTL, each failure logged at ERROR and counted in
    # outbox_receiver_failures_total; the session's later messages wait, other sessions go
    # on. Fixing (or disconnecting) the receiver before MAX_RECEIVER_ATTEMPTS failures lets
    # the session go on by itself (past them staff decide: the test below).
    entry_delivered.connect(meter, once=True)
    failing_sessions.add("stuck")
    outbox = amake_outbox(deliverer=delivered, lock_ttl=0.3, max_receiver_attempts=1000)
    metrics = WorkerMetrics(outbox)
    stuck = await aaccept(outbox, "a", ses="stuck")
    waiting = await aaccept(outbox, "b", ses="stuck")
    other = await aaccept(outbox, "c", ses="other")
    stop = asyncio.Event()
    with caplog.at_level(logging.ERROR, "django_outbox"):
        run = asyncio.create_task(outbox.arun(tick=0.05, stop=stop, heartbeat=False))
        try:
            await wait_for(
                lambda: (
                    receipts.FAILURES["entry_delivered", "tests.django.test_receipts.meter"] >= 3
                ),
                10,
            )
            assert await aeffects(other.id) == 1  # the other session was not held
            assert [e.id for e in await outbox.alist(WS, "stuck")] == [waiting.id]
            assert await aeffects(stuck.id) == 0
            value = metrics.registry.get_sample_value(
                "outbox_receiver_failures_total",
                {"signal": "entry_delivered", "receiver": "tests.django.test_receipts.meter"},
            )
            assert value >= 3
            failing_sessions.clear()  # the fix is deployed
            await wait_for(
                lambda: sync_to_async(lambda: effects(waiting.id) == 1)(), 10, 0.05, "resumed"
            )
        finally:
            stop.set()
            await run
    assert await aeffects(stuck.id) == 1
    assert "stays owed" in caplog.text


async def test_a_replayed_settle_fires_with_the_staged_delivered_at(amake_outbox, valkey):
    # The reply to the delivered-settle is lost: the retried settle is answered "replayed".
    # It fired entry_delivered with the entry as claimed, deliveredAt None, so its key
    # differed from the one a later replay (or the owed signal) carries.
    port = int(valkey.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port).start()
    try:
        entry_delivered.connect(count_firing)
        outbox = amake_outbox(url=proxy.url, deliverer=delivered)
        m1 = await aaccept(outbox, "m1")
        await outbox.aload_scripts()
        proxy.drop_reply_to(outbox.scripts["settle_delivered"].sha.encode())
        assert await outbox.adeliver_once(WS, SES)
        assert proxy.dropped == 1
        [(entry_id, delivered_at)] = plain_calls
        assert entry_id == m1.id and delivered_at is not None
    finally:
        proxy.close()


# -- pruning ----------------------------------------------------------------------------------


def test_prune_deletes_old_receipts_in_bounded_batches(settings):
    receipts_aged([10, 20, 30, 40, 50, 1])
    assert receipts.prune(older_than=5, batch=2) == 2
    assert sorted(DeliveryReceipt.objects.values_list("entry_id", flat=True)) == [
        "e0",
        "e1",
        "e2",
        "e5",
    ]  # the oldest went first
    assert receipts.prune(older_than=5, batch=100) == 3
    assert receipts.prune(older_than=5) == 0
    with pytest.raises(ValueError):
        receipts.prune(older_than=-1)
    settings.OUTBOX = {"DEDUPE_TTL": 60}  # the default age is DEDUPE_TTL
    receipts_aged([120, 30])
    assert receipts.prune() == 1


def test_the_prune_command(capsys):
    from django.core.management.base import CommandError

    receipts_aged([100] * 5 + [1])
    call_command("outbox_prune_receipts", "--older-than", "50", "--batch", "2")
    assert "pruned 5 delivery receipts" in capsys.readouterr().out
    assert DeliveryReceipt.objects.count() == 1
    with pytest.raises(CommandError):
        call_command("outbox_prune_receipts", "--batch", "0")
    with pytest.raises(CommandError):
        call_command("outbox_prune_receipts", "--older-than", "-3")


def test_the_prune_command_refuses_zero_batches_and_stops_after_the_last(capsys):
    """``--max-batches`` is at least 1 (0 would prune nothing and still say it pruned);
    with N it deletes at most N batches and leaves the rest for the next run
    (docs/reference/commands.md)."""
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="--max-batches"):
        call_command("outbox_prune_receipts", "--max-batches", "0")
    receipts_aged([100] * 5)
    call_command(
        "outbox_prune_receipts", "--older-than", "50", "--batch", "2", "--max-batches", "1"
    )
    assert "pruned 2 delivery receipts" in capsys.readouterr().out
    assert DeliveryReceipt.objects.count() == 3


def test_every_worker_of_the_django_outbox_prunes_receipts():
    outbox = Outbox(url="redis://127.0.0.1:1/0")  # no Valkey needed: the duty's settings
    [duty] = [d for d in outbox.duties if d.name == "pruning delivery receipts"]
    assert (duty.name, duty.interval, duty.burst) == (
        "pruning delivery receipts",
        receipts.PRUNE_INTERVAL,
        True,  # as before, in a --once run too
    )


@override_settings(OUTBOX={"DEDUPE_TTL": 50})
async def test_the_worker_prunes_while_a_once_receiver_is_connected(amake_outbox):
    await sync_to_async(receipts_aged)([100, 100, 1])
    asked: list[int] = []

    def nobody() -> list[str]:
        asked.append(1)
        return []

    await receipts.pruner(nobody).run()
    assert asked == [1]
    assert await DeliveryReceipt.objects.acount() == 3  # no opted-in receiver: no pass
    outbox = amake_outbox(deliverer=delivered)
    outbox.duties[:] = [receipts.pruner(lambda: ["r"], interval=0.02)]
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, heartbeat=False))
    try:
        await wait_for(lambda: sync_to_async(lambda: DeliveryReceipt.objects.count() == 1)(), 5)
    finally:
        stop.set()
        await run


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ("--older-than", "nan"),
        ("--older-than", "inf"),
        ("--older-than=-inf",),
        ("--older-than", "1e308"),
        ("--older-than", "-1"),
        ("--older-than", "3155760001"),
        ("--batch", "99999999999999999999"),
    ],
)
def test_the_prune_command_refuses_ages_that_are_no_age(args, valkey):
    """A real ``manage.py`` process: a non-finite, negative or out-of-range value is a clear
    CommandError on stderr, never a traceback (docs/reference/commands.md)."""
    import os
    import subprocess
    import sys

    from tests.support.paths import ROOT

    done = subprocess.run(
        [sys.executable, "-m", "django", "outbox_prune_receipts", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
            "OUTBOX_VALKEY_URL": valkey,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert f"CommandError: {args[0].split('=')[0]}: " in done.stderr and "must be" in done.stderr


def test_prune_refuses_what_is_no_age():
    for age in (float("nan"), float("inf"), 1e308, -1, True, "5"):
        with pytest.raises(ValueError, match="older_than must be a finite number"):
            receipts.prune(older_than=age)
    with pytest.raises(ValueError, match="batch must be a whole number"):
        receipts.prune(older_than=5, batch=receipts.MAX_PRUNE_BATCH + 1)


# -- a receiver that keeps failing on one entry is bounded ----------------------------------


async def _delivered_all(outbox) -> bool:
    return await outbox.alist(WS, "stuck") == []


def _outbox_command(*args: str) -> str:
    import io

    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize("staff_says", ["--skip", "--retry"])
@override_settings(OUTBOX={"MAX_RECEIVER_ATTEMPTS": 3})  # what manage.py outbox reads
async def test_a_receiver_failing_on_one_entry_is_bounded_then_waits_for_staff(
    amake_outbox, caplog, staff_says
):
    """docs/reference/signals.md#a-receiver-that-keeps-failing: after MAX_RECEIVER_ATTEMPTS
    failed firings the owed signal is not fired again by itself; ``manage.py outbox
    inspect`` shows it held, and ``owed --skip`` (record the receiver as done) or
    ``owed --retry`` (after a fix) lets the session go on."""
    entry_delivered.connect(meter, once=True)
    failing_sessions.add("stuck")
    outbox = amake_outbox(deliverer=delivered, lock_ttl=0.2, max_receiver_attempts=3)
    stuck = await aaccept(outbox, "a", ses="stuck")
    waiting = await aaccept(outbox, "b", ses="stuck")
    name = "tests.django.test_receipts.meter"
    stop = asyncio.Event()
    with caplog.at_level(logging.WARNING, "django_outbox"):
        run = asyncio.create_task(outbox.arun(tick=0.05, stop=stop, heartbeat=False))
        try:
            # Held: claims keep coming (each LOCK_TTL) and say so, but fire nothing more.
            await wait_for(lambda: caplog.text.count("waits for staff") >= 3, 15)
            assert receipts.FAILURES["entry_delivered", name] == 3
            assert await outbox.aowed_failures(WS, "stuck") == {stuck.id: 3}
            assert [e.id for e in await outbox.alist(WS, "stuck")] == [waiting.id]
            shown = await sync_to_async(_outbox_command)("inspect", WS, "stuck")
            assert f"{stuck.id}: entry_delivered failed 3 times: held" in shown
            if staff_says == "--retry":
                failing_sessions.clear()  # the fix is deployed
            said = await sync_to_async(_outbox_command)("owed", WS, "stuck", stuck.id, staff_says)
            assert "next claim" in said
            # The session goes on: the waiting prompt is delivered (with --skip its
            # receiver fails on it too, which is its own, new, bounded story).
            await wait_for(
                lambda: _delivered_all(outbox), 10, 0.05, "the waiting prompt was delivered"
            )
            if staff_says == "--retry":
                await wait_for(
                    lambda: sync_to_async(lambda: effects(waiting.id) == 1)(), 10, 0.05, "ran"
                )
        finally:
            stop.set()
            await run
    [(entry_id, _, receiver)] = await areceipts(entry_id=stuck.id)
    assert (entry_id, receiver) == (stuck.id, name)
    # skipped: its receiver never completed for that entry; retried: it ran once, fixed
    assert await aeffects(stuck.id) == (0 if staff_says == "--skip" else 1)
    assert stuck.id not in await outbox.aowed_failures(WS, "stuck")


def test_owed_of_an_entry_without_an_owed_signal_is_not_found(outbox):
    from django.core.management.base import CommandError

    entry = accept(outbox, "a")
    with pytest.raises(CommandError) as missing:
        _outbox_command("owed", WS, SES, entry.id, "--skip")
    assert missing.value.returncode == 1


def test_cleanup_forgets_the_failed_firings(outbox, r):
    entry = accept(outbox, "a")

    async def fail_once():
        await outbox._acount_owed_failures(WS, SES, [entry.id])
        await outbox.aclose()

    asyncio.run(fail_once())
    assert outbox.owed_failures(WS, SES) == {entry.id: 1}
    assert r.pttl(outbox.keys.owed_failures(WS, SES)) > 0  # kept DEDUPE_TTL at most
    outbox.cleanup_workspace(WS)
    assert outbox.owed_failures(WS, SES) == {}
    assert r.keys("*owedfail*") == []


def test_once_receivers_names_only_the_opted_in_ones():
    """A plain receiver of ``entry_delivered`` runs at least once and keeps no receipt:
    ``once_receivers()`` (what the receipts' bookkeeping reads) does not list it."""
    entry_delivered.connect(meter)  # plain
    entry_delivered.connect(ameter, once=True)
    try:
        assert entry_delivered.once_receivers() == ["tests.django.test_receipts.ameter"]
    finally:
        assert entry_delivered.disconnect(meter) and entry_delivered.disconnect(ameter)
    assert entry_delivered.once_receivers() == []
