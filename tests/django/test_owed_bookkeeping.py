"""The bookkeeping of owed ``entry_delivered`` signals over its life cycle, row by row:
receivers that succeed, fail once, fail always or are slow; one and several, ``once=True``
and plain; a worker restarted between the failure and the owed firing; staff's skip and
retry; the failed-firing counts in Valkey and the per-delivery count in the log; the
pruning of receipts at its edges (docs/reference/signals.md#a-receiver-that-keeps-failing,
docs/reference/commands.md#outbox_prune_receipts).

Each row asserts the stored state (the receipts table, the session's ``owedfail`` HASH in
Valkey and its TTL) and the observable result: how many times each receiver ran and how
many of its effects (``auth.Group`` rows written inside its transaction) were kept, which
for a ``once=True`` receiver is exactly one per delivery.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group

from django_outbox import receipts
from django_outbox.models import DeliveryReceipt
from django_outbox.outbox import Outbox
from django_outbox.signals import entry_delivered
from tests.support.helpers import SES, WS, aaccept, make_entry, wait_for
from tests.support.receipts import receipts_aged

pytestmark = pytest.mark.django_db(transaction=True)

HERE = "tests.django.test_owed_bookkeeping"
LOCK_TTL = 0.3
#: The LOCK_TTL of the slow receiver's tests, and how long that receiver takes: longer, so
#: only a kept lease (renewed every third of it) stops a second worker from firing the signal
#: again meanwhile; a stall of a loaded host under two thirds of it is tolerated.
SLOW_LOCK_TTL = 1.5
SLOW = 2.0

#: Calls of each receiver below, by its short name.
calls: Counter[str] = Counter()
#: How many more calls of a receiver raise (-1: every call).
raising: dict[str, int] = {}


def _behave(name: str, entry) -> None:
    calls[name] += 1
    Group.objects.create(name=f"{entry.id}:{name}:{calls[name]}")  # its effect
    left = raising.get(name, 0)
    if left:
        raising[name] = left - 1 if left > 0 else left
        raise RuntimeError(f"injected: {name} failed after its write")


def ok(sender, entry, **kwargs):
    _behave("ok", entry)


def flaky(sender, entry, **kwargs):
    _behave("flaky", entry)


def broken(sender, entry, **kwargs):
    _behave("broken", entry)


def slow(sender, entry, **kwargs):
    calls["slow started"] += 1
    time.sleep(SLOW)
    _behave("slow", entry)


async def claimed_by(outbox) -> None:
    """Claim the session with ``outbox`` until a claim does something (its lease expired)."""
    while not await outbox.adeliver_once(WS, SES):
        await asyncio.sleep(0.02)


async def poll_while(step: asyncio.Task, second) -> None:
    """Let ``second`` claim the session every 50 ms until ``step`` ends: it must get nothing."""
    while not step.done():
        assert not await second.adeliver_once(WS, SES)
        await asyncio.sleep(0.05)
    await step


def plain(sender, entry, **kwargs):
    calls["plain"] += 1


def plain_broken(sender, entry, **kwargs):
    calls["plain_broken"] += 1
    raise RuntimeError("injected: a plain receiver that fails")


RECEIVERS = {f.__name__: f for f in (ok, flaky, broken, slow, plain, plain_broken)}


@pytest.fixture(autouse=True)
def _reset():
    calls.clear()
    raising.clear()
    receipts.FAILURES.clear()
    yield
    for fn in RECEIVERS.values():
        entry_delivered.disconnect(fn)


@pytest.fixture(autouse=True)
def _no_connection_left_in_the_orm_thread():
    """Receivers and receipts use asgiref's one thread-sensitive thread, shared by the whole
    run: close the connection they leave there."""
    yield

    def drop() -> None:
        from django.db import connections
        from django.db.backends.base.base import BaseDatabaseWrapper

        for conn in connections.all(initialized_only=True):
            BaseDatabaseWrapper.close(conn)  # SQLite ignores close() on its in-memory database

    asyncio.run(sync_to_async(drop)())


@pytest.fixture
async def amake_outbox(make_outbox):
    """``make_outbox`` whose async clients are closed on this test's event loop."""
    made = []

    def make(**kwargs):
        kwargs.setdefault("lock_ttl", LOCK_TTL)
        kwargs.setdefault("deliverer", delivered)
        made.append(make_outbox(**kwargs))
        return made[-1]

    yield make
    for outbox in made:
        await outbox.aclose()


async def delivered(entry, **kwargs):
    """A deliverer that always succeeds."""


def kept_effects(entry_id: str) -> dict[str, int]:
    """Committed effects of each opted-in receiver for the entry."""
    out: Counter[str] = Counter()
    for name in Group.objects.filter(name__startswith=f"{entry_id}:").values_list(
        "name", flat=True
    ):
        out[name.split(":")[1]] += 1
    return dict(out)


@dataclass
class State:
    """What one step left: the Valkey count, the receipts, the calls and kept effects."""

    failures: dict[str, int]
    receipts: list[str]
    calls: dict[str, int]
    effects: dict[str, int]


async def state(outbox, entry_id: str) -> State:
    rows = await sync_to_async(
        lambda: sorted(
            (e, r.removeprefix(f"{HERE}."))
            for e, r in DeliveryReceipt.objects.values_list("entry_id", "receiver")
        )
    )()
    assert all(e == entry_id for e, _ in rows), rows
    return State(
        failures=await outbox.aowed_failures(WS, SES),
        receipts=[r for _, r in rows],
        calls=dict(+calls),
        effects=await sync_to_async(kept_effects)(entry_id),
    )


@dataclass
class Row:
    once: list[str]
    plain: list[str] = field(default_factory=list)
    raising: dict[str, int] = field(default_factory=dict)
    #: The state after the delivery, then after each owed firing (``failures`` by count:
    #: the entry's ID is filled in).
    expected: list[tuple[int, list[str], dict[str, int], dict[str, int]]] = field(
        default_factory=list
    )
    restart: bool = False


ROWS = {
    "succeeds": Row(
        once=["ok"],
        expected=[(0, ["ok"], {"ok": 1}, {"ok": 1})],
    ),
    "fails-once-then-succeeds": Row(
        once=["flaky"],
        raising={"flaky": 1},
        expected=[
            (1, [], {"flaky": 1}, {}),
            (0, ["flaky"], {"flaky": 2}, {"flaky": 1}),
        ],
    ),
    "fails-twice-then-succeeds": Row(
        once=["flaky"],
        raising={"flaky": 2},
        expected=[
            (1, [], {"flaky": 1}, {}),
            (2, [], {"flaky": 2}, {}),
            (0, ["flaky"], {"flaky": 3}, {"flaky": 1}),
        ],
    ),
    "worker-restarted-before-the-owed-firing": Row(
        once=["flaky"],
        raising={"flaky": 1},
        restart=True,
        expected=[
            (1, [], {"flaky": 1}, {}),
            (0, ["flaky"], {"flaky": 2}, {"flaky": 1}),
        ],
    ),
    "plain-receiver-fails-owes-nothing": Row(
        once=[],
        plain=["plain_broken"],
        expected=[(0, [], {"plain_broken": 1}, {})],
    ),
    "several-the-one-that-ran-skipped-plain-runs-again": Row(
        once=["ok", "flaky"],
        plain=["plain"],
        raising={"flaky": 1},
        expected=[
            (1, ["ok"], {"ok": 1, "flaky": 1, "plain": 1}, {"ok": 1}),
            (0, ["flaky", "ok"], {"ok": 1, "flaky": 2, "plain": 2}, {"ok": 1, "flaky": 1}),
        ],
    ),
}


@pytest.mark.parametrize("row", ROWS.values(), ids=ROWS.keys())
async def test_the_owed_signal_s_life_cycle(amake_outbox, r, row):
    for name in row.once:
        entry_delivered.connect(RECEIVERS[name], once=True)
    for name in row.plain:
        entry_delivered.connect(RECEIVERS[name])
    raising.update(row.raising)
    outbox = amake_outbox(max_receiver_attempts=5, dedupe_ttl=60)
    key = outbox.keys.owed_failures(WS, SES)
    m1 = await aaccept(outbox, "m1")

    seen = []
    assert await outbox.adeliver_once(WS, SES)  # delivered; its receivers fired
    seen.append(await state(outbox, m1.id))
    for _ in row.expected[1:]:
        if row.restart:  # a new worker takes the owed signal over from Valkey alone
            await outbox.aclose()
            outbox = amake_outbox(max_receiver_attempts=5, dedupe_ttl=60)
        await wait_for(partial(outbox.adeliver_once, WS, SES), 5, 0.05, "an owed firing")
        seen.append(await state(outbox, m1.id))
        if seen[-1].failures:  # counted on each failure, kept DEDUPE_TTL after the last
            assert 59_000 < r.pttl(key) <= 60_000

    assert seen == [State({m1.id: n} if n else {}, rs, cs, es) for n, rs, cs, es in row.expected]
    assert r.exists(key) == 0  # fired at last: nothing counted, nothing owed
    assert await outbox.alist(WS, SES) == []
    assert outbox.owed_entry(WS, SES, m1.id) is None
    if row.once:  # the session owes nothing more: a later claim fires nothing
        assert not await outbox.adeliver_once(WS, SES)
        assert dict(+calls) == row.expected[-1][2]


async def test_a_slow_once_receiver_runs_once_though_a_second_worker_polls(amake_outbox):
    """The lease is kept while a receiver slower than LOCK_TTL runs: a second worker polling
    the session meanwhile fires nothing again."""
    entry_delivered.connect(slow, once=True)
    first, second = amake_outbox(lock_ttl=SLOW_LOCK_TTL), amake_outbox(lock_ttl=SLOW_LOCK_TTL)
    m1 = await aaccept(first, "m1")
    step = asyncio.create_task(claimed_by(first))
    await wait_for(lambda: calls["slow started"] == 1, 10, 0.01, "the receiver began")
    await poll_while(step, second)
    assert calls == {"slow started": 1, "slow": 1}
    assert await sync_to_async(kept_effects)(m1.id) == {"slow": 1}
    assert await second.aowed_failures(WS, SES) == {}
    assert not await second.adeliver_once(WS, SES)
    assert calls == {"slow started": 1, "slow": 1}


async def test_a_delivery_the_ledger_confirms_owes_its_signal_to_the_next_claim(amake_outbox):
    """An entry the ledger probe confirms delivered is staged with its signal owed; the next
    claim fires it, a failure there is counted like any other, and the receiver's effect is
    kept once, keyed on the deliveredAt the confirmation stamped
    (docs/explanation/lifecycle.md, "The ledger probe")."""
    from django_outbox.core.entry import LEDGER_STATE_TURN_ENDED
    from django_outbox.errors import AmbiguousError

    async def lost_reply(entry, **kwargs):
        raise AmbiguousError("injected: the reply was lost")

    entry_delivered.connect(flaky, once=True)
    entry_delivered.connect(plain)
    raising["flaky"] = 1
    outbox = amake_outbox(
        deliverer=lost_reply, ledger_probe=lambda **kwargs: LEDGER_STATE_TURN_ENDED
    )
    m1 = await aaccept(outbox, "m1")
    assert await outbox.adeliver_once(WS, SES)  # unverifiable: an error entry
    assert calls == {} and await outbox.asweep_workspace_parked_errors(WS) == 1
    owed = outbox.owed_entry(WS, SES, m1.id)
    assert owed is not None and owed.delivered_at
    assert [(e.entry_id, e.how) for e in (await outbox.asnapshot(WS, SES)).endings] == [
        (m1.id, "delivered")
    ]

    assert await outbox.adeliver_once(WS, SES)  # the owed firing: the receiver fails
    assert calls == {"flaky": 1, "plain": 1}
    assert await outbox.aowed_failures(WS, SES) == {m1.id: 1}
    await wait_for(partial(outbox.adeliver_once, WS, SES), 5, 0.05, "the owed firing")
    assert calls == {"flaky": 2, "plain": 2}
    assert await outbox.aowed_failures(WS, SES) == {}
    rows = DeliveryReceipt.objects.values_list("entry_id", "delivered_at", "receiver")
    assert [tuple(x) async for x in rows] == [(m1.id, owed.delivered_at, f"{HERE}.flaky")]
    assert await sync_to_async(kept_effects)(m1.id) == {"flaky": 1}
    assert not await outbox.adeliver_once(WS, SES) and calls == {"flaky": 2, "plain": 2}


async def _held(outbox, caplog, times: int) -> None:
    """Claim until ``times`` claims said the owed signal waits for staff."""

    async def said() -> bool:
        await outbox.adeliver_once(WS, SES)
        return caplog.text.count("waits for staff") >= times

    await wait_for(said, 10, 0.05, "held for staff")


async def test_a_receiver_that_always_fails_is_held_then_skipped_by_staff(amake_outbox, r, caplog):
    entry_delivered.connect(broken, once=True)
    entry_delivered.connect(plain)
    raising["broken"] = -1
    outbox = amake_outbox(max_receiver_attempts=2)
    key = outbox.keys.owed_failures(WS, SES)
    name = f"{HERE}.broken"
    m1 = await aaccept(outbox, "m1")
    m2 = await aaccept(outbox, "m2")
    assert outbox.owed_entry(WS, SES, m1.id) is None  # queued: nothing owed yet

    with caplog.at_level(logging.WARNING, "django_outbox"):
        assert await outbox.adeliver_once(WS, SES)
        await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "the second firing")
        await _held(outbox, caplog, 2)
    # Exactly MAX_RECEIVER_ATTEMPTS firings, then none: held, nothing kept.
    assert calls == {"broken": 2, "plain": 2}
    assert receipts.FAILURES["entry_delivered", name] == 2
    assert await outbox.aowed_failures(WS, SES) == {m1.id: 2}
    assert await sync_to_async(kept_effects)(m1.id) == {}
    assert await DeliveryReceipt.objects.acount() == 0
    owed = outbox.owed_entry(WS, SES, m1.id)
    assert owed is not None and owed.id == m1.id and owed.delivered_at
    assert [e.id for e in await outbox.alist(WS, SES)] == [m2.id]  # the next one waits

    # Staff skip it: a receipt for that delivery, recorded once.
    skip = sync_to_async(receipts.skip_owed)
    assert await skip(m1.id, owed.delivered_at, [name]) == [name]
    assert await skip(m1.id, owed.delivered_at, [name]) == []
    rows = DeliveryReceipt.objects.values_list("entry_id", "delivered_at", "receiver")
    assert [tuple(x) async for x in rows] == [(m1.id, owed.delivered_at, name)]
    assert outbox.reset_owed_failures(WS, SES, m1.id) is True
    assert outbox.reset_owed_failures(WS, SES, m1.id) is False
    assert r.exists(key) == 0

    # The next claim fires the owed signal: the skipped receiver does not run, the plain
    # one does, and the session goes on to m2 (whose delivery fails its receiver anew).
    await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "the owed firing")
    assert calls["broken"] == 2 and calls["plain"] == 3
    assert outbox.owed_entry(WS, SES, m1.id) is None
    await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "m2 delivered")
    assert calls == {"broken": 3, "plain": 4}
    assert await outbox.aowed_failures(WS, SES) == {m2.id: 1}


async def test_a_retry_by_staff_counts_from_zero_again(amake_outbox, caplog):
    entry_delivered.connect(broken, once=True)
    raising["broken"] = -1
    outbox = amake_outbox(max_receiver_attempts=1)
    m1 = await aaccept(outbox, "m1")
    with caplog.at_level(logging.WARNING, "django_outbox"):
        assert await outbox.adeliver_once(WS, SES)
        await _held(outbox, caplog, 1)
        assert calls == {"broken": 1}
        assert await outbox.aowed_failures(WS, SES) == {m1.id: 1}
        raising["broken"] = 0  # the fix is deployed
        assert outbox.reset_owed_failures(WS, SES, m1.id) is True
        await wait_for(lambda: outbox.adeliver_once(WS, SES), 5, 0.05, "the owed firing")
    assert calls == {"broken": 2}
    assert await sync_to_async(kept_effects)(m1.id) == {"broken": 1}
    assert await outbox.aowed_failures(WS, SES) == {}


def test_an_entry_being_delivered_owes_nothing_yet(outbox):
    from django_outbox.core.scripts import claim_argv

    entry = outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="x")
    outbox.run_script("claim", WS, SES, claim_argv("tok", 30_000))
    [staged] = outbox.snapshot(WS, SES).entries
    assert staged.id == entry.id  # staged, not yet delivered
    assert outbox.owed_entry(WS, SES, entry.id) is None


# -- the per-delivery count in the log --------------------------------------------------------


def fire(entry):
    return entry_delivered.send_robust(
        sender=Outbox, entry=entry, workspace_id=WS, session_id=SES, version=1, state="sent"
    )


def told(caplog) -> list[str]:
    """The ``(n time(s) in this process)`` of each failure logged, in order."""
    import re

    return re.findall(r"\((\d+) time\(s\) in this process\)", caplog.text)


def test_the_logged_count_is_per_delivery_and_forgotten_once_it_ran(caplog):
    entry_delivered.connect(flaky, once=True)
    entry = make_entry(delivered_at="2026-01-01T00:00:00.000001Z")
    other = make_entry(delivered_at="2026-01-01T00:00:00.000002Z")
    raising["flaky"] = 3
    with caplog.at_level(logging.ERROR, "django_outbox"):
        fire(entry)
        fire(other)
        fire(entry)
        raising["flaky"] = 0
        fire(entry)  # ran: its count is done with
        assert told(caplog) == ["1", "1", "2"]
        # Its receipt pruned, a replay of that delivery that fails starts from one again.
        assert receipts.prune(older_than=0) == 1
        raising["flaky"] = 1
        fire(entry)
    assert told(caplog) == ["1", "1", "2", "1"]
    assert receipts.FAILURES["entry_delivered", f"{HERE}.flaky"] == 4


def test_the_logged_counts_are_bounded_oldest_first(caplog, monkeypatch):
    monkeypatch.setattr(receipts, "_PER_DELIVERY_MAX", 2)
    monkeypatch.setattr(receipts, "_per_delivery", {})
    entry_delivered.connect(broken, once=True)
    raising["broken"] = -1
    e1, e2, e3 = (make_entry(delivered_at=f"2026-01-01T00:00:00.00000{i}Z") for i in (1, 2, 3))
    with caplog.at_level(logging.ERROR, "django_outbox"):
        for entry in (e1, e2, e3, e3, e1):
            fire(entry)
    # e1's count was dropped for e3's (the bound), so its next failure is told as a first.
    assert told(caplog) == ["1", "1", "1", "2", "1"]


def test_a_once_receiver_of_a_closure_is_held_strongly():
    ran = []

    def local(sender, entry, **kwargs):
        ran.append(entry.id)

    entry_delivered.connect(local, once=True)  # weak=True by default: ignored
    name = receipts.receiver_name(local)
    del local
    gc.collect()
    try:
        assert name in entry_delivered.once_receivers()
        entry = make_entry(delivered_at="2026-01-01T00:00:00.000001Z")
        fire(entry)
        fire(entry)
        assert ran == [entry.id]
    finally:
        entry_delivered.disconnect(dispatch_uid=("django_outbox.once", name))


# -- pruning at its edges -------------------------------------------------------------------


def _left() -> list[str]:
    return sorted(DeliveryReceipt.objects.values_list("entry_id", flat=True))


AGES = [50, 40, 30, 20, 10, 1]  # e0 oldest; e5 younger than the cut-off below


@pytest.mark.parametrize(
    ("older_than", "batch", "deleted", "left"),
    [
        (5, 1, 1, ["e1", "e2", "e3", "e4", "e5"]),  # the smallest batch: the oldest
        (5, 4, 4, ["e4", "e5"]),
        (5, 5, 5, ["e5"]),  # exactly those old enough
        (5, 6, 5, ["e5"]),  # a batch larger than what is old enough
        (25, receipts.MAX_PRUNE_BATCH, 3, ["e3", "e4", "e5"]),
        (0, 100, 6, []),  # an age of 0: every receipt written before now
        (receipts.MAX_PRUNE_AGE, 100, 0, ["e0", "e1", "e2", "e3", "e4", "e5"]),
    ],
)
def test_prune_deletes_what_is_old_enough_up_to_the_batch(older_than, batch, deleted, left):
    receipts_aged(AGES)
    assert receipts.prune(older_than=older_than, batch=batch) == deleted
    assert _left() == left


BAD_PRUNES = [
    (-0.001, 10, "older_than must be a finite number"),
    (receipts.MAX_PRUNE_AGE + 1, 10, "older_than must be a finite number"),
    (float("nan"), 10, "older_than must be a finite number"),
    (False, 10, "older_than must be a finite number"),
    (5, 0, "batch must be a whole number"),
    (5, -1, "batch must be a whole number"),
    (5, receipts.MAX_PRUNE_BATCH + 1, "batch must be a whole number"),
    (5, 2.0, "batch must be a whole number"),
    (5, True, "batch must be a whole number"),
    (5, "2", "batch must be a whole number"),
]


@pytest.mark.parametrize(
    ("older_than", "batch", "error"),
    BAD_PRUNES,
    ids=[f"older_than={a!r}-batch={b!r}" for a, b, _ in BAD_PRUNES],  # no spaces: mutate's node IDs
)
def test_prune_refuses_bad_arguments_and_deletes_nothing(older_than, batch, error):
    receipts_aged(AGES)
    with pytest.raises(ValueError, match=error):
        receipts.prune(older_than=older_than, batch=batch)
    assert len(_left()) == len(AGES)


async def test_a_slow_owed_firing_keeps_its_lease_too(amake_outbox):
    """The owed firing of a slow receiver that failed once holds the session's lease while
    it runs: a second worker polling meanwhile fires nothing, and the effect is kept once."""
    entry_delivered.connect(slow, once=True)
    raising["slow"] = 1
    first, second = amake_outbox(lock_ttl=SLOW_LOCK_TTL), amake_outbox(lock_ttl=SLOW_LOCK_TTL)
    m1 = await aaccept(first, "m1")
    assert await first.adeliver_once(WS, SES)  # delivered; the receiver failed
    assert calls["slow"] == 1 and await first.aowed_failures(WS, SES) == {m1.id: 1}

    step = asyncio.create_task(claimed_by(first))  # once the lease left to expire has
    await wait_for(lambda: calls["slow started"] == 2, 10, 0.01, "the owed firing began")
    await poll_while(step, second)
    assert calls == {"slow started": 2, "slow": 2}
    assert await sync_to_async(kept_effects)(m1.id) == {"slow": 1}
    assert await second.aowed_failures(WS, SES) == {}
