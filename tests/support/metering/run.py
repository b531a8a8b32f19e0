"""Helpers for a kill loop whose workers meter through a ``once=True`` receiver: make the
shared database, and read back what the receivers wrote (with the stdlib ``sqlite3``, so
the reading process needs no Django settings of its own)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.support.paths import ROOT


def prepare_db(tmp: Path, valkey_url: str) -> Path:
    """Create the shared SQLite file with every table (``migrate --run-syncdb``); return it.
    Raises ``subprocess.CalledProcessError`` (with the output) if migrate fails."""
    db = tmp / "metering.sqlite3"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": valkey_url,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.receipts",
        "OUTBOX_TEST_DB": str(db),
    }
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--run-syncdb", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        timeout=120,
    )
    return db


def worker_env(db: Path, receiver_sleep: float) -> dict[str, str]:
    """What a worker process needs to meter into ``db`` (tests.support.workers.Workers)."""
    return {
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.receipts",
        "OUTBOX_TEST_DB": str(db),
        "OUTBOX_TEST_RECEIVER_SLEEP": str(receiver_sleep),
    }


def _query(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db, timeout=30) as conn:
        return conn.execute(sql).fetchall()


def metering_counts(db: Path) -> Counter[str]:
    """Metering rows per entry ID."""
    rows = _query(db, "SELECT entry_id, COUNT(*) FROM test_metering_metering GROUP BY entry_id")
    return Counter(dict(rows))


def receipt_count(db: Path) -> int:
    """Rows of DeliveryReceipt."""
    return _query(db, "SELECT COUNT(*) FROM django_outbox_deliveryreceipt")[0][0]
