"""Helpers for clients gone mid-request: the test project under a real ASGI server
(uvicorn), and clients that send a complete accept POST and go away without reading the
reply.

Used by tests/faults/test_disconnect.py and by scenario 5 of the fault suite
(tests/support/chaos.py).
"""

from __future__ import annotations

import base64
import os
import secrets
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx

from tests.support.helpers import stop_process
from tests.support.paths import ROOT
from tests.support.valkey import free_port, wait_until

AUTH = "Basic " + base64.b64encode(b"alice:secret-pw").decode()
# Run once in the server's database before it starts: the schema, user alice, and a logged-in
# session for her (so a client can skip Basic auth's password hash, ~0.2 s per request).
SETUP = """
from importlib import import_module
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.core.management import call_command
call_command("migrate", verbosity=0)
user = User.objects.create_user("alice", password="secret-pw")
session = import_module(settings.SESSION_ENGINE).SessionStore()
session[SESSION_KEY] = str(user.pk)
session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
session[HASH_SESSION_KEY] = user.get_session_auth_hash()
session.create()
print("session-key", session.session_key)
"""


@dataclass
class Server:
    """A running uvicorn: its URL and port, the environment it runs with, its log file, and
    ``session``: request headers that log in as alice through a session (cookie and CSRF
    token) instead of ``AUTH``."""

    base: str
    port: int
    env: dict[str, str]
    log: Path
    session: dict[str, str]


@contextmanager
def asgi_server(valkey: str, tmp: Path, **extra_env: str) -> Iterator[Server]:
    """uvicorn serving tests.support.asgi.http on a free port, with user ``alice`` (password
    ``secret-pw``, see ``AUTH``) in a file database under ``tmp``; stopped (SIGTERM, then
    SIGKILL) on the way out. ``extra_env`` is added to the server's environment (e.g. a
    skewed clock)."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.server",
        "TEST_DB": str(tmp / "db.sqlite3"),
        "OUTBOX_VALKEY_URL": valkey,
        **extra_env,
    }
    setup = subprocess.run(
        [sys.executable, "-m", "django", "shell", "-c", SETUP],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if setup.returncode != 0:
        raise RuntimeError(f"setting up the server's database failed:\n{setup.stderr}")
    key = setup.stdout.split("session-key ", 1)[1].split()[0]
    csrf = secrets.token_hex(16)
    session = {"Cookie": f"sessionid={key}; csrftoken={csrf}", "X-CSRFToken": csrf}
    port = free_port()
    log_path = tmp / "uvicorn.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "tests.support.asgi.http:application",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"uvicorn exited; see {log_path}")
        try:
            return httpx.get(f"{base}/outbox/api/schema/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(up, 30, 0.1, message="uvicorn answers")
        yield Server(base, port, env, log_path, session)
    finally:
        stop_process(proc)


T = TypeVar("T")


def raw_post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> bytes:
    """A complete HTTP/1.1 POST of a JSON ``body``; ``headers`` default to Basic ``AUTH``."""
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {"Authorization": AUTH}).items()]
    lines += ["Content-Type: application/json", f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def cut_post(
    port: int,
    path: str,
    body: bytes,
    after: float,
    *,
    reset: bool = False,
    headers: dict[str, str] | None = None,
) -> bool:
    """Send one complete POST, and close the socket ``after`` seconds later without reading
    the reply (``reset``: abortively, an RST instead of a FIN).

    Returns True if the server had not started answering when the socket was closed — the
    client really went away mid-request — and False if the cut came after the reply began.
    """
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(raw_post(port, path, body, headers))
        time.sleep(after)
        try:
            answered = bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except BlockingIOError:
            answered = False
        if reset:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return not answered


def check_resend(reply: httpx.Response, stored_id: str | None) -> str | None:
    """Judge the second POST of a key by the idempotency rule: 200 with the original ID if the
    first POST was stored (``stored_id``), 202 if it was not; never anything else.
    Returns what is wrong, or None."""
    answer = f"resend answered {reply.status_code} {reply.text[:200]}"
    if reply.status_code not in (200, 202):
        return answer
    if stored_id is not None:
        if reply.status_code != 200 or reply.json().get("id") != stored_id:
            return f"first POST stored {stored_id}; {answer}"
    elif reply.status_code != 202:
        return f"first POST not listed; {answer}"
    return None


def settled(read: Callable[[], T], rounds: int = 50, interval: float = 0.2) -> T:
    """Read until two reads ``interval`` seconds apart agree (at most ``rounds``): accepts
    of clients that are already gone may still be running in the server. Returns the
    last read; raises AssertionError if it never settles."""
    value = read()
    for _ in range(rounds):
        time.sleep(interval)
        value, before = read(), value
        if value == before:
            return value
    raise AssertionError(f"still changing after {rounds * interval:.0f}s")
