"""What bench/run.py and bench/cluster_bench.py share: child processes that are always
stopped, and how figures are printed."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

#: Every child process a benchmark starts, so an exception or Ctrl-C never leaves one behind.
CHILDREN: list[subprocess.Popen] = []


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def reap_children(log: Callable[[str], None] | None = None) -> None:
    """Stop every recorded child; a failure is logged (if ``log``) and the rest go on."""
    for proc in CHILDREN:
        try:
            stop(proc, 10)
        except Exception as exc:  # keep stopping the others
            if log is not None:
                log(f"could not stop process {proc.pid}: {exc}")
    CHILDREN.clear()


def fmt(v: float | None) -> str:
    """A figure for a Markdown table: thousands separated from 100 up, else 2 decimals."""
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"
