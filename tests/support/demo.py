"""The demo launcher (``python -m example_project.run``) as a process for tests and tools:
:class:`DemoProcess` starts it on a free port with its own embedded Valkey (or the caller's),
:func:`run_smoke` runs its smoke client (``make demo ARGS=--smoke``) to the end, and
:func:`stop_group` stops it and everything it started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.valkey import wait_until


def demo_env() -> dict[str, str]:
    """The environment of a launched demo: its own embedded Valkey, like ``make demo``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "DEMO_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def children_of(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


def running(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def worker_pid(root: int) -> int:
    """The ``outbox_worker`` process under the demo launcher ``root`` (a test may stop it
    with SIGSTOP to hold prompts in the queue, and let it go on with SIGCONT)."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"outbox_worker" in cmdline:
            return pid
        todo.extend(children_of(pid))
    raise AssertionError("no outbox_worker under the demo")


def stop_group(proc: subprocess.Popen, grace: float = 20.0) -> None:
    """SIGTERM the launcher, then SIGKILL its whole process group if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def run_smoke(tmp_path: Path, *args: str, deadline: float) -> tuple[int | None, str, float]:
    """``python -m example_project.run --smoke [args]`` (what ``make demo ARGS=--smoke``
    runs) as a subprocess with its own data folder under ``tmp_path``, stopped with its
    whole process group after ``deadline`` seconds at most: ``(exit code, None past the
    deadline; its output, also printed; seconds it took)``."""
    log_path = tmp_path / "smoke.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "example_project.run",
                "--smoke",
                *args,
                "--data-dir",
                str(tmp_path / "smoke"),
            ],
            cwd=ROOT,
            env=demo_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            code: int | None = proc.wait(deadline)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            stop_group(proc)
    output = log_path.read_text("utf-8", errors="replace")
    print(output)
    return code, output, time.monotonic() - started


class DemoProcess:
    """``python -m example_project.run`` (interactive mode) on a free port, for tests."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        """``args`` go to ``example_project.run``; ``env`` adds to :func:`demo_env`'s (e.g.
        ``OUTBOX_VALKEY_URL`` for a Valkey of the caller's instead of the embedded one)."""
        self.log_path = tmp_path / "demo.log"
        self.env = {**demo_env(), **(env or {})}
        self.data_dir = tmp_path / "demo"
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, within: float = 60.0) -> DemoProcess:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "example_project.run",
                    "--port",
                    "0",
                    "--data-dir",
                    str(self.data_dir),
                    *self.args,
                ],
                cwd=ROOT,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

        def banner() -> str | None:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the demo exited {self.proc.returncode}:\n{self.log()}")
            found = re.search(r"open\s+(http://127\.0\.0\.1:\d+)/", self.log())
            return found.group(1) if found else None

        self.url = wait_until(banner, within, interval=0.05, message="the demo's banner")
        return self

    def log(self) -> str:
        return self.log_path.read_text("utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc)
