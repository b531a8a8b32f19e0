"""Real ASGI servers (uvicorn or daphne) running ``tests.support.asgi.live`` for the live-update
tests (tests/django/ws/test_staying_true_on_servers.py) and the fault suite's row 7
(tests/support/chaos.py).

:func:`serve` sets up a file database with user ``alice`` and a login session for her,
starts the server on a free loopback port and stops it (SIGTERM, then SIGKILL) on the
way out. The channel layer lives in database 3 of the outbox's Valkey, so flushing the
layer (``FLUSHDB`` there) leaves the outbox's data alone.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.disconnects import SETUP
from tests.support.helpers import stop_process
from tests.support.paths import ROOT
from tests.support.valkey import free_port, wait_until

LAYER_DB = 3


def layer_url(valkey: str) -> str:
    """The channel layer's URL: database ``LAYER_DB`` of the outbox's Valkey."""
    return valkey.rsplit("/", 1)[0] + f"/{LAYER_DB}"


@dataclass
class Server:
    """A running server: ``kind`` ("uvicorn" or "daphne"), its ``pid`` (for /proc), the
    WebSocket base ``ws`` (``ws://127.0.0.1:<port>/``), ``headers`` that log in as alice
    (her session cookie), the session key, the database file and the log file."""

    kind: str
    pid: int
    ws: str
    headers: dict[str, str]
    session_key: str
    db: Path
    log: Path

    def queue_url(self, ws: str = "alice", ses: str = "s1") -> str:
        return f"{self.ws}ws/outbox/workspaces/{ws}/sessions/{ses}/"

    def rss_kib(self) -> int:
        """The server process's resident set size in KiB (``VmRSS``)."""
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError(f"no VmRSS for {self.pid}")


def _command(kind: str, port: int, app: str) -> list[str]:
    if kind == "uvicorn":
        return [
            sys.executable,
            "-m",
            "uvicorn",
            app,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
    if kind == "daphne":
        return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), app]
    raise ValueError(kind)


@contextmanager
def serve(
    kind: str,
    valkey: str,
    tmp: Path,
    app: str = "tests.support.asgi.live:application",
    db: Path | None = None,
    **env: str,
) -> Iterator[Server]:
    """Run ``app`` under ``kind`` with ``tests.support.settings.live`` (``env`` added to the
    server's environment, e.g. ``OUTBOX_TEST_GROUP_EXPIRY="2"``). ``db``: the database of
    a server already running (a second server process of the same project; no setup, no
    session of its own: ``headers`` empty)."""
    tmp.mkdir(parents=True, exist_ok=True)
    full_env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.live",
        "TEST_DB": str(db or tmp / "db.sqlite3"),
        "OUTBOX_VALKEY_URL": valkey,
        "OUTBOX_TEST_LAYER_URL": layer_url(valkey),
        **env,
    }
    key = ""
    if db is None:
        setup = subprocess.run(
            [sys.executable, "-m", "django", "shell", "-c", SETUP],
            cwd=ROOT,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if setup.returncode != 0:
            raise RuntimeError(f"setting up the server's database failed:\n{setup.stderr}")
        key = setup.stdout.split("session-key ", 1)[1].split()[0]
    port = free_port()
    log_path = tmp / f"{kind}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            _command(kind, port, app),
            cwd=ROOT,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited: {log_path.read_text(errors='replace')}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, 60, 0.1, message=f"{kind} listens")
        yield Server(
            kind,
            proc.pid,
            f"ws://127.0.0.1:{port}/",
            {"Cookie": f"sessionid={key}"} if key else {},
            key,
            db or tmp / "db.sqlite3",
            log_path,
        )
    finally:
        stop_process(proc)
