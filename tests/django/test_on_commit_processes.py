"""``accept_on_commit`` across real processes, on SQLite and on PostgreSQL
(docs/howto/transactions.md).

A Django process accepts inside its own transactions (tests/support/children/on_commit.py),
on a SQLite file and on a PostgreSQL server the test starts (Debian's ``postgresql``, an
unprivileged cluster on a loopback port: tests/support/postgres.py); the test then looks at
Valkey, at the database and at what the agent of real ``outbox_worker`` processes received.
Each transaction writes the caller's own row too (an ``auth.Group``, "the order"), which
must share the prompt's fate. The finer rules run in-process in tests/django/test_on_commit.py.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import datetime

import pytest
import redis

from tests.support.helpers import SES, WS, accept
from tests.support.on_commit import Database, run_child, start_child, workers
from tests.support.postgres import PostgresServer, unavailable
from tests.support.valkey import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres():
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request, tmp_path_factory, valkey) -> Database:
    """One migrated database per backend for the module's tests."""
    if request.param == "sqlite":
        db = Database.sqlite(tmp_path_factory.mktemp("on-commit") / "db.sqlite3")
    else:
        server = request.getfixturevalue("postgres")
        db = Database(
            "postgresql",
            server.create_database("on_commit"),
            lambda: server.connect("on_commit"),
        )
    # Module-scoped, so set up before the per-test flush (tests/conftest.py): start from an
    # empty key space, as an earlier module may have left another project's claim there,
    # which migrate's system checks rightly refuse.
    client = redis.Redis.from_url(valkey)
    client.flushall()
    client.close()
    db.migrate(valkey)
    return db


@pytest.fixture
def shared(database) -> Database:
    """The module's database, emptied of what a test writes."""
    database.clear()
    return database


def texts(outbox) -> list[str]:
    return [entry.text for entry in outbox.list(WS, SES)]


def leave_behind(db: Database, valkey: str, key: str, **env: str) -> None:
    """Commit ``key`` in a process SIGKILLed between its commit and the move into Valkey
    (``env``: the child's, e.g. ``OUTBOX_TEST_OPTIONS_JSON``)."""
    child = start_child(db, valkey, "hang", key, **env)
    try:
        line = child.stdout.readline().strip()
        assert line == "committed", child.stderr.read()
    finally:
        child.kill()
        child.wait(10)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL


def test_a_committed_transaction_makes_exactly_one_entry(shared, outbox, valkey):
    run_child(shared, valkey, "commit", "k1")

    assert texts(outbox) == ["work on k1"]
    assert shared.groups() == ["k1"]
    assert shared.pending() == []


def test_any_text_round_trips_through_the_database(shared, outbox, valkey):
    text = "NUL \x00, é, 🎉 and \u202e"  # PostgreSQL's text columns refuse a raw NUL

    run_child(shared, valkey, "commit", "k1", OUTBOX_TEST_TEXT_JSON=json.dumps(text))

    assert texts(outbox) == [text]


def test_a_rolled_back_transaction_makes_none(shared, outbox, valkey):
    run_child(shared, valkey, "rollback", "k1")

    assert texts(outbox) == []
    assert shared.groups() == []
    assert shared.pending() == [], "nothing left for a worker to move either"


def test_a_rolled_back_savepoint_takes_its_prompt_and_the_commit_moves_the_rest(
    shared, outbox, valkey
):
    run_child(shared, valkey, "savepoint", "outer", "inner")

    assert texts(outbox) == ["work on outer"]
    assert shared.groups() == ["outer"]
    assert shared.pending() == []


def test_a_process_killed_between_commit_and_move_leaves_it_to_a_worker_exactly_once(
    shared, outbox, valkey, r, tmp_path
):
    leave_behind(shared, valkey, "k1")
    # Committed in the database, with the caller's own row; not in Valkey.
    assert [row["key"] for row in shared.pending()] == ["k1"]
    assert shared.groups() == ["k1"]
    assert texts(outbox) == []

    w = workers(shared, valkey, tmp_path)
    started = time.monotonic()
    try:
        w.start("--tick", "0.1")
        wait_until(lambda: r.llen("test:log") > 0, 20, 0.05, "the prompt delivered")
        took = time.monotonic() - started
        wait_until(lambda: shared.pending() == [], 10, 0.05, "the row deleted")
        # A few more of the worker's passes: nothing moves twice.
        wait_until(lambda: texts(outbox) == [], 10, 0.05, "the queue empty")
    finally:
        w.stop_all()

    assert r.lrange("test:log", 0, -1) == ["s1 work on k1"], w.logs()
    assert r.scard("test:sent") == 1
    assert took < 10, f"moved {took:.1f} s after the worker started"


def test_two_movers_racing_make_one_entry(shared, outbox, valkey):
    leave_behind(shared, valkey, "k1")

    racers = [start_child(shared, valkey, "race") for _ in range(2)]
    outputs = [racer.communicate(timeout=60) for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0], outputs

    assert sorted(out.strip() for out, _ in outputs) == ["already", "moved"]
    assert texts(outbox) == ["work on k1"]
    assert shared.pending() == []


def test_a_refused_move_stays_on_the_row_for_staff_and_is_moved_once_there_is_room(
    shared, make_outbox, valkey, r, tmp_path
):
    accept(make_outbox(cap=1), "first", "first")  # the session holds CAP entries

    run_child(shared, valkey, "commit", "k1", OUTBOX_TEST_CAP="1")

    [row] = shared.pending()
    assert (row["key"], row["state"], row["attempts"]) == ("k1", "waiting", 1)
    assert row["last_error"] == "OutboxFull: session outbox is full (1 entries)"
    status, page = run_child(shared, valkey, "admin").split("\n", 1)
    assert status == "200"
    assert "session outbox is full (1 entries)" in page
    assert "work on k1" in page

    # A worker delivers the first prompt, which makes room; its duty then moves k1.
    w = workers(shared, valkey, tmp_path, OUTBOX_TEST_CAP="1")
    try:
        w.start("--tick", "0.1")
        wait_until(lambda: r.llen("test:log") >= 2, 30, 0.05, "both delivered")
        wait_until(lambda: shared.pending() == [], 10, 0.05, "the row deleted")
    finally:
        w.stop_all()
    assert r.lrange("test:log", 0, -1) == ["s1 first", "s1 work on k1"], w.logs()


def test_an_expiry_counts_from_the_call_whoever_moves_the_prompt(shared, outbox, valkey):
    """An expiry through accept_on_commit, on each database's own clock: 60 s from a call made 20 s
    before the move
    leave the entry about 40 s."""
    leave_behind(shared, valkey, "k1", OUTBOX_TEST_OPTIONS_JSON='{"expires_after": 60}')
    shared.called_ago(20)

    assert run_child(shared, valkey, "move").split() == ["moved"]

    [entry] = outbox.list(WS, SES)
    left = datetime.fromisoformat(entry.expires_at) - datetime.fromisoformat(entry.accepted_at)
    assert 39 <= left.total_seconds() <= 40
    assert shared.pending() == []


def test_a_prompt_whose_expiry_passed_before_a_worker_moved_it_is_never_sent(
    shared, outbox, valkey, r, tmp_path
):
    """An expiry through accept_on_commit: its process died after the commit; a worker moves it
    after its
    ``expires_after`` (5 s from the call) passed: stored, it ends ``expired``, unsent."""
    leave_behind(shared, valkey, "k1", OUTBOX_TEST_OPTIONS_JSON='{"expires_after": 5}')
    shared.called_ago(30)

    w = workers(shared, valkey, tmp_path)
    try:
        w.start("--tick", "0.1")
        wait_until(
            lambda: [str(e.status) for e in outbox.list(WS, SES)] == ["expired"],
            20,
            0.05,
            "the prompt moved and expired",
        )
    finally:
        w.stop_all()

    assert r.lrange("test:log", 0, -1) == [], w.logs()
    assert shared.pending() == []
