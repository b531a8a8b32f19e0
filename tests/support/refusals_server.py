"""uvicorn or daphne serving ``tests.support.asgi.refusals`` (the real consumer behind the
logging origin validator; settings ``tests.support.settings.refusals``) on a free loopback
port, and what the refusal tests read from outside it."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from django_outbox.core.keys import KeySpace
from tests.support.helpers import stop_process
from tests.support.paths import ROOT
from tests.support.valkey import free_port, wait_until

MAX_SOCKETS = 3  # OUTBOX_TEST_MAX_SOCKETS of the servers below


@contextmanager
def asgi_server(kind: str, valkey_url: str, log: Path, **env: str) -> Iterator[str]:
    """``kind`` (uvicorn or daphne) serving tests.support.asgi.refusals on a free loopback port;
    yields ``"127.0.0.1:<port>"``; its output goes to ``log``."""
    port = free_port()
    if kind == "uvicorn":
        argv = ["-m", "uvicorn", "tests.support.asgi.refusals:application", "--host", "127.0.0.1"]
        argv += ["--port", str(port)]
    else:
        argv = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
        argv += ["tests.support.asgi.refusals:application"]
    environ = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.refusals",
        "OUTBOX_VALKEY_URL": valkey_url,
        "OUTBOX_TEST_MAX_SOCKETS": str(MAX_SOCKETS),
        **env,
    }
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, *argv], cwd=ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT
        )
    address = f"127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text(errors="replace")
        try:
            with urllib.request.urlopen(f"http://{address}/?session=s", timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_until(up, 30, interval=0.1, message=f"{kind} serving tests.support.asgi.refusals")
        yield address
    finally:
        stop_process(proc)


def path(ws: str = "alice", ses: str = "s1") -> str:
    return f"/ws/outbox/workspaces/{ws}/sessions/{ses}/"


def open_sockets(valkey: str, user: str = "alice") -> int:
    client = redis.Redis.from_url(valkey)
    try:
        return client.zcard(KeySpace().sockets(user))
    finally:
        client.close()
