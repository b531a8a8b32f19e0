"""PostgreSQL restarted under a running ``manage.py outbox_worker``.

A worker has no request cycle to close a connection the database server ended: without one,
every later receiver call met the dead connection (``the connection is closed``) for the life
of the worker, and its summary still said "0 errors". The worker now treats its connections
as Django treats a request's (closed when unusable or older than ``CONN_MAX_AGE``, before the
receivers run), so at most the first call of each receiver after the restart fails, and that
failure is logged with the receiver's name, counted in ``outbox_receiver_failures_total`` and
told in the summary. The receivers (tests/support/dbwrites) write one row per delivery
through the ORM: a plain sync one, a plain async one and, in some runs, a ``once=True`` one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request

import pytest

from tests.support.helpers import accept
from tests.support.paths import ROOT
from tests.support.postgres import PostgresServer, unavailable
from tests.support.valkey import free_port, wait_until
from tests.support.workers import Workers

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

WRITERS = "tests.support.dbwrites.receivers"
PLAIN = ("write", "awrite")
ALL = (*PLAIN, "write_once")


DATABASE = "worker_connections"


@pytest.fixture(scope="module")
def postgres(valkey):
    """A PostgreSQL server for this module, its tables made by ``migrate``."""
    reason = unavailable()
    if reason:
        print(reason)
        pytest.skip(reason)
    server = PostgresServer().start()
    try:
        server.create_database(DATABASE)
        env = {**os.environ, **_settings(server, valkey, "0", False)}
        subprocess.run(
            [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=180,
        )
        yield server
    finally:
        server.stop()


def _settings(server: PostgresServer, valkey: str, max_age: str, health: bool) -> dict[str, str]:
    return {
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": valkey,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.worker_postgres",
        "OUTBOX_TEST_PG_PORT": str(server.port),
        "OUTBOX_TEST_PG_NAME": DATABASE,
        "OUTBOX_TEST_CONN_MAX_AGE": max_age,
        "OUTBOX_TEST_CONN_HEALTH_CHECKS": "1" if health else "0",
        "OUTBOX_TEST_LOCK_TTL": "1",  # a once=True receiver that failed fires again soon
    }


def rows(postgres: PostgresServer, receiver: str, entry_ids: list[str]) -> int:
    """Rows ``receiver`` wrote for these entries."""
    with postgres.connect(DATABASE) as conn:
        [(n,)] = conn.execute(
            "SELECT COUNT(*) FROM test_dbwrites_write WHERE receiver = %s AND entry_id = ANY(%s)",
            (receiver, entry_ids),
        ).fetchall()
    return n


def receiver_failures(metrics_port: int) -> dict[str, float]:
    """``outbox_receiver_failures_total`` of a worker, by receiver name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as page:
        text = page.read().decode()
    found = {}
    for line in text.splitlines():
        if line.startswith("outbox_receiver_failures_total{"):
            labels, value = line.rsplit(" ", 1)
            assert 'signal="entry_delivered"' in labels
            name = labels.split('receiver="', 1)[1].split('"', 1)[0]
            found[name] = float(value)
    return found


@pytest.mark.parametrize(
    ("max_age", "health", "receivers", "may_fail"),
    [
        # the case: connections kept for the life of the worker, plain receivers only (an
        # opted-in receiver closes an unusable connection before its own transaction, and
        # would hide the plain ones' fate when it shares their thread)
        ("none", False, PLAIN, True),
        ("none", False, ALL, True),
        ("60", False, PLAIN, True),
        ("none", True, ALL, False),  # CONN_HEALTH_CHECKS: a ping before the first query
        ("0", False, ALL, False),  # Django's default: a new connection for each event
    ],
    ids=["persistent", "persistent-with-once", "max-age-60", "health-checks", "max-age-0"],
)
def test_receivers_write_again_after_postgres_restarts_under_the_worker(
    postgres, valkey, make_outbox, tmp_path, max_age, health, receivers, may_fail
):
    with postgres.connect(DATABASE) as conn:
        conn.execute("TRUNCATE test_dbwrites_write")
    allowed = 1 if may_fail else 0
    outbox = make_outbox()
    metrics_port = free_port()
    env = _settings(postgres, valkey, max_age, health)
    workers = Workers(valkey, tmp_path, OUTBOX_TEST_DBWRITES=",".join(receivers), **env)
    worker = workers.start("--tick", "0.1", "--metrics-port", str(metrics_port))
    try:

        def delivered(entry_ids: list[str], failed: dict[str, float]) -> bool:
            # every delivery acknowledged, and a row or a counted failure of each receiver
            # for each entry
            if outbox.list("w1", "s1"):
                return False
            return all(
                rows(postgres, name, entry_ids) + failed.get(f"{WRITERS}.{name}", 0)
                >= len(entry_ids)
                for name in receivers
            )

        first = accept(outbox, "m1").id
        # every receiver's call for m1 over before the restart: one still running when the
        # server goes down fails for the restart, not for a connection kept past it
        wait_until(lambda: delivered([first], {}), 60, 0.05, message="m1 written by all")

        postgres.restart()
        later = [accept(outbox, f"m{n}").id for n in (2, 3, 4)]

        def settled() -> bool:
            # a once=True receiver that failed is fired again after LOCK_TTL
            failed = receiver_failures(metrics_port)
            again = {name: n for name, n in failed.items() if n > allowed}
            assert not again, f"failed again after the first call: {again}"
            return delivered(later, failed)

        wait_until(settled, 60, 0.1, message="the three later prompts delivered")
        failed = receiver_failures(metrics_port)
    finally:
        workers.stop_all()
    log = workers.logs()
    assert worker.returncode == 0, log

    for name in receivers:
        assert rows(postgres, name, [first]) == 1, log
        calls = failed.get(f"{WRITERS}.{name}", 0)
        # at most the call that met the dead connection failed; every other one wrote its row
        assert calls <= allowed, log
        if name == "write_once":  # fired again until it commits: exactly once each
            assert rows(postgres, name, later) == 3, log
        else:
            assert rows(postgres, name, later) == 3 - calls, log
        if calls:
            assert f"receiver {WRITERS}.{name} failed" in log, log

    total = int(sum(failed.values()))
    [summary] = [line for line in log.splitlines() if line.startswith("outbox_worker stopped:")]
    if total:  # the loop itself had no error: each one counted is a receiver's
        assert f", {total} error" in summary and f"({total} receiver call" in summary, log
    else:
        assert summary.endswith(", 0 errors"), log
