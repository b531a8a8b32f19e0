"""``manage.py outbox_worker`` processes for tests (settings ``tests.support.settings.worker``,
the recording agent of ``tests/support/agents.py``), and the invariants a run of them must
keep: every accepted message delivered once, in order per session, ``entry_delivered`` fired
once (or replayed with the same deliveredAt after a SIGKILL)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tests.support.helpers import accept
from tests.support.paths import ROOT
from tests.support.valkey import wait_until


class Workers:
    """Start, SIGKILL and SIGTERM ``manage.py outbox_worker`` processes."""

    def __init__(self, valkey: str, tmp_path: Path, **env: str) -> None:
        self.valkey = valkey
        self.tmp_path = tmp_path
        self.env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OUTBOX_VALKEY_URL": valkey,
            "DJANGO_SETTINGS_MODULE": "tests.support.settings.worker",
            **env,
        }
        self.procs: list[subprocess.Popen] = []
        self.started = 0

    def start(self, *args: str) -> subprocess.Popen:
        self.started += 1
        log = open(self.tmp_path / f"worker-{self.started}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_worker", *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def live(self) -> list[subprocess.Popen]:
        return [p for p in self.procs if p.poll() is None]

    def wait_running(self, outbox, timeout: float = 30) -> None:
        """Wait until every live process has published its heartbeat (``live_workers``):
        it then handles SIGTERM as a graceful stop. A process still starting (importing
        Django, checking the server) ends on SIGTERM's default action, exit -15."""
        wait_until(
            lambda: {p.pid for p in self.live()} <= {w.pid for w in outbox.live_workers()},
            timeout,
            message=lambda: "the workers never published their heartbeats:\n" + self.logs(),
        )

    def stop_all(self) -> None:
        for proc in self.live():
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.tmp_path.glob("worker-*.log"))
        )


def accept_many(outbox, sessions: int, per_session: int) -> dict[str, list[str]]:
    """Accept ``per_session`` messages in each session, interleaved; return ids per session."""
    ids: dict[str, list[str]] = {f"s{i}": [] for i in range(sessions)}
    for n in range(per_session):
        for ses in ids:
            ids[ses].append(accept(outbox, f"k{n}", str(n), ses=ses).id)
    return ids


def delivered_signals(r) -> list[tuple[str, str]]:
    """(entry ID, deliveredAt) of every entry_delivered the workers fired."""
    return [tuple(item.split()) for item in r.lrange("test:delivered", 0, -1)]


def check_invariants(outbox, r, ids: dict[str, list[str]], *, sigkills: bool = False) -> int:
    """Assert the invariants; return how many entry_delivered were replayed.

    A worker SIGKILLed after a receiver ran but before its acknowledgement was
    written (one round trip) leaves the signal owed, so the next claimer fires it
    again with the same (entry ID, deliveredAt): at-least-once in that window
    only, never lost. Without SIGKILL it must be exactly once.
    """
    everything = [i for per in ids.values() for i in per]
    for ses in ids:
        assert outbox.list("w1", ses) == [], f"{ses} still has entries"
    assert r.lrange("test:violations", 0, -1) == []
    signals = delivered_signals(r)
    counts = Counter(entry_id for entry_id, _ in signals)
    assert set(counts) == set(everything), "every accepted message was delivered"
    assert len(set(signals)) == len(counts), "one delivery (deliveredAt) per entry"
    replays = len(signals) - len(counts)
    if not sigkills:
        assert replays == 0, "entry_delivered fired exactly once"
    log = [line.split() for line in r.lrange("test:log", 0, -1)]
    assert len(log) == len(everything), "no message was sent twice"
    for ses in ids:
        texts = [int(t) for s, t in log if s == ses]
        assert texts == sorted(texts), f"{ses} delivered out of order"
    return replays


def wait_delivered(r, total: int, timeout: float) -> None:
    wait_until(
        lambda: len({i for i, _ in delivered_signals(r)}) >= total,
        timeout,
        0.05,
        message=f"{total} deliveries",
    )
