"""What the benchmarks share: where results go, child processes that are always stopped, how
figures are printed and how a run's results are written."""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PAYLOAD = "x" * 100  #: the text of every benchmark message and peer job


def due_horizon_ms() -> int:
    """An hour from now (ms): a session due after it is an emptied one waiting for its
    dedupe window to pass (it is reclaimed then), not work left to do."""
    return int(time.time() * 1000) + 3_600_000


#: Every child process a benchmark starts, so an exception or Ctrl-C never leaves one behind.
CHILDREN: list[subprocess.Popen] = []


def logger(name: str) -> Callable[[str], None]:
    """A progress logger: ``[name HH:MM:SS] message`` lines on stderr."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log


def child_env(url: str, **extra: str) -> dict[str, str]:
    """The environment of a child process: ours, the repository on PYTHONPATH, and the Valkey
    URL for the outbox (OUTBOX_VALKEY_URL) and the peer queues (BENCH_PEER_URL)."""
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": url,
        "BENCH_PEER_URL": url,
        **extra,
    }


def spawn(args: list[str], **kw: Any) -> subprocess.Popen:
    """``subprocess.Popen(args, **kw)``, recorded in CHILDREN (see :func:`reap_children`)."""
    proc = subprocess.Popen(args, **kw)
    CHILDREN.append(proc)
    return proc


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


def interrupt_on_sigterm() -> None:
    """Make SIGTERM raise KeyboardInterrupt, so a stopped run still writes what it measured."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))


def server_version(info: dict[str, Any]) -> str | None:
    """The server's version from its ``INFO server`` answer (Valkey, else Redis)."""
    return info.get("valkey_version") or info.get("redis_version")


def fmt(v: float | None) -> str:
    """A figure for a Markdown table: thousands separated from 100 up, else 2 decimals."""
    if v is None:
        return "—"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.2f}"


def run_meta(
    argv: list[str] | None, started: float, valkey: str | None, **fields: Any
) -> dict[str, Any]:
    """A run's ``meta``: date, command-line arguments, ``fields``, the machine, the Valkey
    version and the seconds since ``started`` (a ``time.monotonic()`` reading)."""
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "argv": sys.argv[1:] if argv is None else argv,
        **fields,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "valkey": valkey,
        "seconds": time.monotonic() - started,
    }


def write_results(
    stem: str, result: dict, meta: dict, markdown: Callable[[dict, dict], str]
) -> None:
    """Set ``result["meta"]``; write ``bench/results/<stem>.json`` and ``<stem>.md`` (the
    Markdown that ``markdown(result, meta)`` renders) and print the Markdown."""
    result["meta"] = meta
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result, meta)
    (RESULTS / f"{stem}.md").write_text(md)
    print(md)
