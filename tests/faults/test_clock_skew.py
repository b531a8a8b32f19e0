"""One clock, the server's: worker and web processes whose clocks are ten
minutes off, run under libfaketime, neither freeze a session, delay a prompt nor
shorten a backoff (README "Operations")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from django_outbox.core.entry import parse_time
from django_outbox.core.service import Outbox
from tests.support.faketime import FAKETIME, skewed
from tests.support.paths import ROOT
from tests.support.valkey import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.standalone,
    pytest.mark.skipif(not FAKETIME, reason="libfaketime missing (apt-get install faketime)"),
]
WS, SES = "w1", "s1"


class Processes:
    def __init__(self, valkey: str, tmp_path: Path) -> None:
        self.valkey, self.tmp_path, self.procs = valkey, tmp_path, []

    def env(self, clock: str | None, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OUTBOX_VALKEY_URL": self.valkey,
            "DJANGO_SETTINGS_MODULE": "tests.support.settings.worker",
            **skewed(clock),
            **extra,
        }

    def worker(self, clock: str | None, **extra: str) -> subprocess.Popen:
        log = open(self.tmp_path / f"worker-{len(self.procs)}.log", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "outbox_worker", "--tick", "0.2"],
            cwd=ROOT, env=self.env(clock, **extra), stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self.procs.append(proc)
        return proc

    def run(self, clock: str | None, code: str) -> str:
        """Run Python ``code`` in a process with that clock; return its output."""
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=self.env(clock),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.tmp_path.glob("*.log"))


@pytest.fixture
def processes(valkey, tmp_path):
    made = Processes(valkey, tmp_path)
    yield made
    made.stop()


@pytest.fixture
def r(valkey):
    client = redis.Redis.from_url(valkey, decode_responses=True)
    yield client
    client.close()


def test_it_runs_the_processes_with_the_clock_asked_for(processes):
    ahead = float(processes.run("+600s", "import time; print(time.time())"))
    assert 590 < ahead - time.time() < 610


@pytest.mark.parametrize("clock", ["+600s", "-600s"])
def test_a_dead_holder_with_a_wrong_clock_frees_its_session_within_a_lease(
    processes, outbox, r, clock
):
    """(a) LOCK_TTL 3 s: a worker whose clock is off claims, is SIGKILLed mid-turn; a
    worker with the right clock takes the session over within the lease, not ten
    minutes later, and verifies (not resends) what the dead one sent."""
    first = outbox.accept(WS, SES, user_id="u", client_message_id="m1", text="m1")
    outbox.accept(WS, SES, user_id="u", client_message_id="m2", text="m2")
    holder = processes.worker(clock, OUTBOX_TEST_LOCK_TTL="3", OUTBOX_TEST_TURN="60")
    wait_until(lambda: r.sismember("test:sent", first.id), 30, message="m1 reached the agent")
    holder.send_signal(signal.SIGKILL)
    holder.wait(10)
    killed = time.monotonic()
    processes.worker(None, OUTBOX_TEST_LOCK_TTL="3")
    wait_until(lambda: not outbox.list(WS, SES), 60, message="the session drained")
    assert time.monotonic() - killed < 3 + 5, processes.logs()  # a lease and a few ticks
    assert r.lrange("test:log", 0, -1) == [f"{SES} m1", f"{SES} m2"]  # m1 sent once


@pytest.mark.parametrize("clock", ["+600s", "-600s"])
def test_a_prompt_accepted_by_a_web_process_with_a_wrong_clock_is_not_delayed(
    processes, outbox, r, clock
):
    """(b) The web process's clock is off and the wake item is lost: the prompt is due
    on the server's clock, so the next scan finds it."""
    processes.run(
        clock,
        "from django_outbox.core.service import Outbox; import os; "
        "Outbox(url=os.environ['OUTBOX_VALKEY_URL']).accept("
        f"'{WS}', '{SES}', user_id='u', client_message_id='m1', text='m1')",
    )
    r.delete(*outbox.keys.index_keys("wake"))  # the wake item is lost (or the list was full)
    (entry,) = outbox.list(WS, SES)
    assert abs(time.time() - parse_time(entry.accepted_at) / 1e6) < 5  # on Valkey's clock
    started = time.monotonic()
    processes.worker(None)
    wait_until(lambda: not outbox.list(WS, SES), 60, message="the prompt was delivered")
    assert time.monotonic() - started < 5, processes.logs()


@pytest.mark.parametrize("clock", ["+600s", "-600s"])
def test_a_backoff_set_by_a_worker_with_a_wrong_clock_is_kept_by_the_others(
    processes, outbox, r, clock
):
    """(c) RETRY_BACKOFF 3 s: a worker whose clock is off makes attempt 1, which fails,
    and stops (--once); a worker with the right clock makes the retry 3 s after the
    failure on Valkey's clock: not at once (a clock behind shortened the backoff),
    not ten minutes later (a clock ahead lengthened it)."""
    outbox.accept(WS, SES, user_id="u", client_message_id="m1", text="m1")
    env = {
        "OUTBOX_TEST_DELIVERER": "tests.support.agents.fail_first",
        "OUTBOX_TEST_RETRY_BACKOFF": "3",
        "OUTBOX_TEST_MAX_BACKOFF": "3",
    }
    first = processes.worker(clock, **env)
    wait_until(lambda: r.llen("test:attempts") == 1, 30, message="attempt 1 ran")
    first.send_signal(signal.SIGTERM)
    first.wait(20)
    processes.worker(None, **env)
    wait_until(lambda: r.llen("test:attempts") == 2, 30, message="the retry ran")
    (_, one), (_, two) = (a.split() for a in r.lrange("test:attempts", 0, -1))
    gap = (int(two) - int(one)) / 1_000_000
    assert 3 <= gap < 3 + 3, processes.logs()
    wait_until(lambda: not outbox.list(WS, SES), 10)


def test_heartbeats_are_stamped_on_valkeys_clock(processes, outbox):
    processes.worker("+600s")
    wait_until(lambda: outbox.live_workers(), 20, message="a heartbeat")
    (worker,) = outbox.live_workers()
    assert abs(worker.last_seen - time.time()) < 30  # not ten minutes ahead


def test_a_bare_outbox_takes_its_times_from_valkey(outbox):
    plain = Outbox(url=outbox.url)  # no clock given: Valkey's TIME decides
    assert plain.clock is None
    try:
        entry = plain.accept(WS, "s9", user_id="u", client_message_id="k", text="hi")
        snapshot = plain.snapshot(WS, "s9")
        assert snapshot.version == entry.seq
    finally:
        plain.close()
