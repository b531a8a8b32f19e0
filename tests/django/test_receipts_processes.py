"""The receipts' kill loop: three ``outbox_worker`` processes SIGKILLed at random while
the agent fails definitively, ambiguously and transiently; every worker runs a
``once=True`` receiver that writes a metering row (tests/support/metering) into one SQLite file
they share, and a plain receiver that records each firing in Valkey (tests/support/recorder).

The plain receiver shows that ``entry_delivered`` is replayed (at-least-once); the
metering rows show that the opt-in turns that into exactly one effect per delivery.
"""

from __future__ import annotations

import random
import time

import pytest

from tests.support.helpers import NO_USER_BOUNDS
from tests.support.metering.run import metering_counts, prepare_db, receipt_count, worker_env
from tests.support.valkey import wait_until
from tests.support.workers import (
    Workers,
    accept_many,
    check_invariants,
    delivered_signals,
    wait_delivered,
)

pytestmark = pytest.mark.slow

SESSIONS, PER_SESSION = 30, 10  # 300 prompts
KILL_WINDOW = 20.0  # seconds of SIGKILLs at most
MAX_KILLS = 30


def lingering(r, w: Workers, patience: float):
    """A live worker inside the window between receivers and acknowledgement, waiting at
    most ``patience`` seconds for one; None if none was seen."""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        counts = r.hgetall("test:lingering")
        for proc in w.live():
            if int(counts.get(str(proc.pid), 0)) > 0:
                return proc
        time.sleep(0.01)
    return None


@pytest.fixture
def metering_db(tmp_path, valkey):
    return prepare_db(tmp_path, valkey)


def test_once_receiver_meters_every_delivery_exactly_once_under_sigkills(
    make_outbox, r, metering_db, tmp_path, valkey
):
    db = metering_db
    outbox = make_outbox(**NO_USER_BOUNDS)  # "u" stands in for many users
    ids = accept_many(outbox, SESSIONS, PER_SESSION)
    total = SESSIONS * PER_SESSION
    w = Workers(
        valkey,
        tmp_path,
        OUTBOX_TEST_TURN="0.05",
        OUTBOX_TEST_LOCK_TTL="1",
        OUTBOX_TEST_FAULTS="fail=0.05,ambiguous=0.05,transient=0.05",
        # receivers run, then 0.1 s before the acknowledgement: the window a SIGKILL
        # must hit for a replay, made wide so that the kills below land in it often
        **worker_env(db, receiver_sleep=0.1),
    )
    rng = random.Random(18)
    kills = 0
    try:
        for _ in range(3):
            w.start("--tick", "0.1")
        deadline = time.monotonic() + KILL_WINDOW
        while (
            time.monotonic() < deadline
            and kills < MAX_KILLS
            and len({i for i, _ in delivered_signals(r)}) < total
        ):
            time.sleep(rng.uniform(0.3, 0.8))
            # every other SIGKILL aims at a worker whose receivers ran and which has not
            # acknowledged yet (tests/support/metering/receivers.py: linger); the rest land anywhere
            victim = (lingering(r, w, 2.0) if kills % 2 else None) or rng.choice(w.live())
            victim.kill()
            victim.wait(5)
            kills += 1
            w.start("--tick", "0.1")
        wait_delivered(r, total, 60)
        # The plain receiver runs before the opted-in one: a kill between them leaves the
        # metering to the owed signal's next firing, after LOCK_TTL. Wait for it.
        everything = {i for per in ids.values() for i in per}
        wait_until(lambda: set(metering_counts(db)) >= everything, 30, 0.1, "all metered")
    finally:
        w.stop_all()

    replays = check_invariants(outbox, r, ids, sigkills=True)
    metered = metering_counts(db)
    assert set(metered) == everything, "every delivery metered"
    doubles = {entry_id: n for entry_id, n in metered.items() if n != 1}
    assert doubles == {}, "no delivery metered twice"
    assert receipt_count(db) == total
    print(
        f"{kills} SIGKILLs, {total} delivered, {replays} entry_delivered replays seen by the "
        f"plain receiver, {sum(metered.values())} metering rows"
    )
    assert kills >= 3
    # Half the SIGKILLs are aimed at a worker inside the window: each such kill replays.
    assert replays > 0, "no replay: the kills missed the window between receivers and ack"
