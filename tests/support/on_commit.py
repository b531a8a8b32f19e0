"""The databases and processes of the accept-on-commit tests across processes
(tests/django/test_on_commit_processes.py): one migrated database per backend (a SQLite
file, or a database on the test's own PostgreSQL, tests/support/postgres.py), the child
that accepts inside its transactions (tests/support/children/on_commit.py), and SQL for
the test to look at the rows with, without Django settings of its own."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT
from tests.support.workers import Workers

SETTINGS = "tests.support.settings.on_commit"


class Database:
    """A database the test's processes share. ``vendor`` is ``"sqlite"`` or
    ``"postgresql"``, ``settings`` its Django ``DATABASES`` entry, ``connect()`` a DB-API
    connection for the test's own queries."""

    def __init__(self, vendor: str, settings: dict[str, Any], connect: Callable[[], Any]):
        self.vendor = vendor
        self.settings = settings
        self._connect = connect

    @classmethod
    def sqlite(cls, path: Path) -> Database:
        settings = {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(path),
            "OPTIONS": {
                "init_command": "PRAGMA journal_mode=WAL;",
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
            },
        }
        return cls("sqlite", settings, lambda: sqlite3.connect(path, timeout=30))

    def env(self, valkey_url: str, **extra: str) -> dict[str, str]:
        """The environment of a process of the test on this database."""
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OUTBOX_VALKEY_URL": valkey_url,
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            "OUTBOX_TEST_DATABASE": json.dumps(self.settings),
            **extra,
        }

    def migrate(self, valkey_url: str) -> None:
        """Create every table. Raises ``AssertionError`` with migrate's output if it fails."""
        done = subprocess.run(
            [sys.executable, "-m", "django", "migrate", "-v", "0"],
            cwd=ROOT,
            env=self.env(valkey_url),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"migrate failed:\n{done.stdout}{done.stderr}"

    def query(self, sql: str) -> list[tuple]:
        conn = self._connect()
        try:
            cursor = conn.execute(sql)
            rows = cursor.fetchall() if cursor.description else []
            conn.commit()
            return rows
        finally:
            conn.close()

    def clear(self) -> None:
        """Delete the rows a test writes: pending accepts, the callers' own rows, users."""
        for table in ("django_outbox_pendingaccept", "auth_group", "django_session", "auth_user"):
            self.query(f"DELETE FROM {table}")

    def pending(self) -> list[dict[str, Any]]:
        """The pending accepts, oldest first: key, state, attempts, last refusal."""
        rows = self.query(
            "SELECT client_message_id, state, attempts, last_error "
            "FROM django_outbox_pendingaccept ORDER BY id"
        )
        return [
            dict(zip(("key", "state", "attempts", "last_error"), row, strict=True)) for row in rows
        ]

    def called_ago(self, seconds: int) -> None:
        """Every pending accept's call was ``seconds`` earlier than it was (``created``
        moved back, on the database's clock), and its move is due now."""
        if self.vendor == "postgresql":
            created = f"created - interval '{seconds} seconds'"
            now = "statement_timestamp()"
        else:  # Django's SQLite datetime text
            created = f"strftime('%Y-%m-%d %H:%M:%f', created, '-{seconds} seconds')"
            now = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
        self.query(
            f"UPDATE django_outbox_pendingaccept SET created = {created}, next_attempt = {now}"
        )

    def groups(self) -> list[str]:
        """The callers' own rows (``auth.Group`` names), sorted."""
        return sorted(name for (name,) in self.query("SELECT name FROM auth_group"))


def run_child(db: Database, valkey_url: str, *args: str, **env: str) -> str:
    """Run tests/support/children/on_commit.py to its end; return its output. Raises
    ``subprocess.CalledProcessError`` (with the output) when it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.children.on_commit", *args],
        cwd=ROOT,
        env=db.env(valkey_url, **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done.stdout


def start_child(db: Database, valkey_url: str, *args: str, **env: str) -> subprocess.Popen:
    """Start tests/support/children/on_commit.py; its stdout is a pipe (text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.support.children.on_commit", *args],
        cwd=ROOT,
        env=db.env(valkey_url, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def workers(db: Database, valkey_url: str, tmp_path: Path, **env: str) -> Workers:
    """``outbox_worker`` processes on this database (tests.support.workers.Workers)."""
    return Workers(
        valkey_url,
        tmp_path,
        DJANGO_SETTINGS_MODULE=SETTINGS,
        OUTBOX_TEST_DATABASE=json.dumps(db.settings),
        **env,
    )
