"""PostgreSQL restarted under a running ``manage.py outbox_worker``.

A worker has no request cycle to close a connection the database server ended: without one,
every later receiver call met the dead connection (``the connection is closed``) for the life
of the worker, and its summary still said "0 errors". The worker now treats its connections
as Django treats a request's (closed when unusable or older than ``CONN_MAX_AGE``, before the
receivers run), so at most the first call of each receiver after the restart fails, and that
failure is logged with the receiver's name, counted in ``outbox_receiver_failures_total`` and
told in the summary. The receivers (tests/support/dbwrites) write one row per delivery
through the ORM: a plain sync one, a plain async one and a ``once=True`` one.
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
    ("max_age", "health", "may_fail"),
    [("none", False, True), ("60", False, True), ("none", True, False), ("0", False, False)],
    ids=["persistent", "max-age-60", "health-checks", "max-age-0"],
)
def test_receivers_write_again_after_postgres_restarts_under_the_worker(
    postgres, valkey, make_outbox, tmp_path, max_age, health, may_fail
):
    with postgres.connect(DATABASE) as conn:
        conn.execute("TRUNCATE test_dbwrites_write")
    outbox = make_outbox()
    metrics_port = free_port()
    workers = Workers(valkey, tmp_path, **_settings(postgres, valkey, max_age, health))
    worker = workers.start("--tick", "0.1", "--metrics-port", str(metrics_port))
    try:
        first = accept(outbox, "m1").id
        wait_until(lambda: rows(postgres, "write", [first]), 60, 0.05, message="m1 written")

        postgres.restart()
        later = [accept(outbox, f"m{n}").id for n in (2, 3, 4)]

        def settled() -> bool:
            # every delivery acknowledged, the once=True row of each (a failed one is fired
            # again after LOCK_TTL) and the plain rows or their counted failures
            if outbox.list("w1", "s1") or rows(postgres, "write_once", later) < 3:
                return False
            failed = receiver_failures(metrics_port)
            return all(
                rows(postgres, name, later) + failed.get(f"{WRITERS}.{name}", 0) >= 3
                for name in PLAIN
            )

        wait_until(settled, 60, 0.1, message="the three later prompts delivered")
        failed = receiver_failures(metrics_port)
    finally:
        workers.stop_all()
    log = workers.logs()
    assert worker.returncode == 0, log

    assert rows(postgres, "write", [first]) == rows(postgres, "awrite", [first]) == 1
    for name in PLAIN:
        calls = failed.get(f"{WRITERS}.{name}", 0)
        # at most the call that met the dead connection failed; every other one wrote its row
        assert calls <= (1 if may_fail else 0), log
        assert rows(postgres, name, later) == 3 - calls, log
        if calls:
            assert f"entry_delivered receiver {WRITERS}.{name} failed" in log
    once = failed.get(f"{WRITERS}.write_once", 0)
    assert once <= (1 if may_fail else 0), log
    assert rows(postgres, "write_once", [first, *later]) == 4  # exactly once each
    if once:
        assert f"once receiver {WRITERS}.write_once failed" in log

    total = int(sum(failed.values()))
    [summary] = [line for line in log.splitlines() if line.startswith("outbox_worker stopped:")]
    if total:  # the loop itself had no error: each one counted is a receiver's
        assert f", {total} error" in summary and f"({total} receiver call" in summary, log
    else:
        assert summary.endswith(", 0 errors"), log
