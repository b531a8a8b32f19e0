"""``manage.py outbox``: what each subcommand prints and the exit codes scripts rely on
(README "Command line": 0 done, 1 not found, 2 refused, 3 Valkey unavailable)."""

import asyncio
import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_outbox.core.entry import Status
from tests.support.helpers import SES, WS, accept
from tests.support.paths import ROOT
from tests.support.valkey import free_port


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()


def exit_code(*args: str) -> int:
    with pytest.raises(CommandError) as raised:
        run(*args)
    return raised.value.returncode


def test_status_reports_totals_statuses_and_overdue(outbox, r):
    accept(outbox, "a")
    accept(outbox, "b", ses="s2")
    text = run("status")
    assert "Workspaces 1 · sessions 2" in text
    assert "Entries: pending 2" in text
    # both sessions are due since their accept: the older one is the most overdue
    assert f"Most overdue: {WS}/{SES}" in text
    assert "Workers: 0 live, 0 silent" in text


def test_status_json_is_one_object(outbox):
    accept(outbox, "a")
    data = json.loads(run("status", "--json"))
    assert data["sessions"] == 1 and data["entries"] == {"pending": 1}
    assert data["mostOverdue"]["workspaceID"] == WS
    assert data["mostOverdue"]["overdueSeconds"] >= 0
    assert data["workers"] == []


def test_status_sums_the_recent_history(outbox):
    accept(outbox, "a")
    accept(outbox, "b", ses="s2")

    async def deliver_one():
        await outbox.adeliver_once(WS, SES, deliverer=lambda entry, **kw: None)
        await outbox.aflush_history(outbox.history_counter)
        await outbox.aclose()

    asyncio.run(deliver_one())
    text = run("status")
    assert (
        "Last hour: accepted 2, delivered 1, failed attempts 0, unknown outcomes 0, "
        "stopped turns 0, cancelled 0, moved to error 0"
    ) in text
    assert "latency p50 <= " in text
    recent = json.loads(run("status", "--json", "--minutes", "1440"))["recent"]
    assert recent["minutes"] == 1440 and recent["accepted"] == 2 and recent["delivered"] == 1
    assert recent["latencySeconds"]["p99"] is not None
    assert exit_code("status", "--minutes", "0") == 2
    assert exit_code("status", "--minutes", "soon") == 2
    # call_command passes options as they are: anything but a whole number is refused (2)
    for bad in (None, 1.5, True, ["60"]):
        with pytest.raises(CommandError) as raised:
            call_command("outbox", "status", minutes=bad, stdout=io.StringIO())
        assert raised.value.returncode == 2, bad
    assert '"minutes": 5' in run_with(minutes=5)


def test_status_minutes_reach_31_days_and_no_further(outbox):
    """``--minutes`` runs from 1 to 44640 (31 days) inclusive: the last is read, one more
    exits 2 (docs/reference/commands.md)."""
    assert json.loads(run("status", "--json", "--minutes", "44640"))["recent"]["minutes"] == 44640
    assert "Last 31 days:" in run("status", "--minutes", "44640")
    assert exit_code("status", "--minutes", "44641") == 2


def run_with(**options) -> str:
    out = io.StringIO()
    call_command("outbox", "status", "--json", stdout=out, **options)
    return out.getvalue()


def test_status_on_an_empty_outbox(outbox):
    text = run("status")
    assert "Entries: none" in text and "Overdue: nothing" in text


def test_inspect_workspace_and_session(outbox):
    first = accept(outbox, "a")
    accept(outbox, "b", ses="s2")
    text = run("inspect", WS)
    assert "2 sessions, 2 entries" in text and f"  {SES}: 1 entries" in text
    text = run("inspect", WS, SES)
    assert f"{first.id} pending, attempts 0" in text
    data = json.loads(run("inspect", WS, SES, "--json"))
    assert [e["id"] for e in data["entries"]] == [first.id] and data["lease"] is None


def test_inspect_of_nothing_is_not_found(outbox):
    assert exit_code("inspect", "nope") == 1
    assert exit_code("inspect", WS, "nope") == 1


def test_inspect_of_an_emptied_session_is_not_an_error(outbox):
    entry = accept(outbox, "a")
    outbox.dismiss(WS, SES, entry.id)
    assert "0 entries" in run("inspect", WS, SES)
    assert json.loads(run("inspect", WS, SES, "--json"))["entries"] == []


def test_retry_and_dismiss_codes(outbox):
    entry = accept(outbox, "a")
    assert "Re-armed" in run("retry", WS, SES, entry.id)
    outbox.park_workspace(WS, "maintenance")
    assert exit_code("retry", WS, SES, entry.id) == 2  # parked: busy, not missing
    outbox.unpark_workspace(WS)
    assert "Dismissed" in run("dismiss", WS, SES, entry.id)
    assert outbox.list(WS, SES) == []
    assert exit_code("dismiss", WS, SES, entry.id) == 1
    assert exit_code("retry", WS, SES, entry.id) == 1


def test_interrupt_cuts_the_turn_in_flight_and_is_refused_without_an_aborter(make_outbox):
    from django_outbox import Verdict
    from django_outbox.errors import AmbiguousError

    outbox = make_outbox(verifier=lambda entry, **kw: Verdict.INCONCLUSIVE, verify_delay=60)
    entry = accept(outbox, "a")

    async def cut_off(entry, **kwargs):
        raise AmbiguousError("connection cut mid-turn")

    async def attempt():
        await outbox.adeliver_once(WS, SES, cut_off)  # its turn may still run: verifying
        await outbox.aclose()

    asyncio.run(attempt())
    assert exit_code("interrupt", WS, SES) == 2  # no ABORTER: not supported
    assert not outbox.list(WS, SES)[0].interrupted
    with override_settings(OUTBOX={"ABORTER": "tests.support.agents.abort"}):
        assert "Cutting the running turn" in run("interrupt", WS, SES)
        assert "cut before" in run("interrupt", WS, SES)
        (listed,) = outbox.list(WS, SES)
        assert (listed.id, listed.interrupted) == (entry.id, True)
        outbox.dismiss(WS, SES, entry.id)
        assert "Nothing to cut" in run("interrupt", WS, SES)


def test_interrupt_with_entry_cuts_only_that_entry_s_turn(make_outbox):
    """``interrupt WS SES --entry ID`` (a Stop sent just as a turn ended must not cut the next):
    the Stop names the turn the operator saw.
    While it is queued, and once it is delivered and the next one runs, it is refused (2)
    and nothing is cut; naming the entry in flight cuts it; a malformed ID is refused
    (2)."""
    outbox = make_outbox()
    first, second = accept(outbox, "a"), accept(outbox, "b")

    async def deliver_first():
        await outbox.adeliver_once(WS, SES, deliverer=lambda entry, **kw: None)
        await outbox.aclose()

    with override_settings(OUTBOX={"ABORTER": "tests.support.agents.abort"}):
        assert exit_code("interrupt", WS, SES, "--entry", first.id) == 2  # queued: not cut
        asyncio.run(deliver_first())  # "a" is delivered ...
        kind, claimed, _ = outbox._run(outbox._claim_plan(WS, SES, "holder", []))
        assert (kind, claimed.id) == ("deliver", second.id)  # ... and "b" is in flight
        with pytest.raises(CommandError) as raised:
            run("interrupt", WS, SES, "--entry", first.id)
        assert raised.value.returncode == 2
        assert f"{first.id} is not in flight" in str(raised.value)
        assert "nothing was cut" in str(raised.value)
        assert not outbox.list(WS, SES)[0].interrupted
        assert exit_code("interrupt", WS, SES, "--entry", "../x") == 2
        text = run("interrupt", WS, SES, "--entry", second.id)
        assert f"Cutting the running turn of {WS}/{SES} {second.id}:" in text
        assert "cut before" in run("interrupt", WS, SES, "--entry", second.id)
        (listed,) = outbox.list(WS, SES)
        assert (listed.id, listed.interrupted) == (second.id, True)


def test_bad_identifier_is_refused(outbox):
    assert exit_code("retry", "bad id!", SES, "e1") == 2
    assert exit_code("park", WS, "--reason", " ") == 2  # an empty reason


def test_park_and_unpark(outbox):
    accept(outbox, "a")
    assert "1 entries now" in run("park", WS, "--reason", "maintenance")
    assert outbox.list(WS, SES)[0].status is Status.PARKED
    assert "1 entries released" in run("unpark", WS)
    assert outbox.list(WS, SES)[0].status is Status.PENDING


def test_cleanup_needs_confirmation(outbox, monkeypatch):
    accept(outbox, "a")
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    assert exit_code("cleanup", WS) == 2
    assert len(outbox.list(WS, SES)) == 1  # nothing deleted
    assert "Cleaned up workspace" in run("cleanup", WS, "--yes")
    assert outbox.list(WS, SES) == []
    assert exit_code("cleanup", WS, "--yes") == 1


class Terminal(io.StringIO):
    """What an operator types at a terminal (``isatty`` true), one answer a line."""

    def isatty(self) -> bool:
        return True


def test_cleanup_at_a_terminal_takes_the_typed_workspace_id_around_blanks(outbox, monkeypatch):
    """At a terminal the cleanup asks for the workspace ID: a wrong answer deletes nothing
    (exit 2), the ID typed with blanks around it is the ID (docs/reference/commands.md)."""
    accept(outbox, "a")
    monkeypatch.setattr("sys.stdin", Terminal(f"{WS}x\n"))
    assert exit_code("cleanup", WS) == 2
    assert len(outbox.list(WS, SES)) == 1
    monkeypatch.setattr("sys.stdin", Terminal(f"  {WS} \n"))
    assert "Cleaned up workspace" in run("cleanup", WS)
    assert outbox.list(WS, SES) == []


def test_valkey_unavailable_is_3(outbox):
    with override_settings(OUTBOX={"VALKEY_URL": f"redis://127.0.0.1:{free_port()}/0"}):
        assert exit_code("status") == 3
        with pytest.raises(CommandError) as raised:
            run("status")
        assert str(raised.value).count("Valkey unavailable") == 1  # said once, not twice


@pytest.mark.slow
def test_exit_codes_reach_the_shell(outbox, valkey):
    """Through a real ``python -m django`` process, as a script would call it."""
    entry = accept(outbox, "a")
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
        "OUTBOX_VALKEY_URL": valkey,
    }

    def shell(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "django", "outbox", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = shell("dismiss", WS, SES, entry.id)
    assert done.returncode == 0, done.stderr
    missing = shell("dismiss", WS, SES, entry.id)
    assert missing.returncode == 1 and "Not found" in missing.stderr
    refused = shell("cleanup", WS)  # its session's keys remain: a cleanup asks first
    assert refused.returncode == 2 and "pass --yes" in refused.stderr
    status = shell("status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["entries"] == {}


def test_status_json_names_workers_in_camel_case(outbox):
    import asyncio
    import time

    from django_outbox.core.heartbeats import WorkerHeartbeat

    beat = WorkerHeartbeat("w-1", time.time(), host="h", pid=7, in_flight=2, concurrency=8)

    async def publish():
        await outbox.abeat(beat, 15)
        await outbox.aclose()

    asyncio.run(publish())
    (worker,) = json.loads(run("status", "--json"))["workers"]
    assert worker["id"] == "w-1" and worker["live"] is True
    assert worker["inFlight"] == 2 and worker["concurrency"] == 8 and worker["pid"] == 7
    assert worker["lastSeen"].endswith("+00:00") and "last_seen" not in worker


@pytest.mark.slow
def test_inspect_and_status_never_write_terminal_escapes(outbox, valkey):
    """An agent's error text and a stored park reason may hold ESC, BEL, a C1 CSI or a
    right-to-left override: the human output of a real ``manage.py`` process shows them as
    escapes (docs/reference/commands.md#outbox), ``--json`` keeps the stored values."""
    from django_outbox.core.entry import Status
    from tests.support.admin import seed

    hostile_error = "boom \x1b]0;owned\x07\x1b[2J\x9b31m \u202egnp.exe"
    hostile_reason = "maint\x1b[8m\u200b"
    seed(outbox, WS, SES, "e-err", status=Status.ERROR, last_error=hostile_error, attempts=3)
    seed(outbox, WS, "s2", "e-park", status=Status.PARKED, reason=hostile_reason)
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
        "OUTBOX_VALKEY_URL": valkey,
    }

    def shell(*args: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "-m", "django", "outbox", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done

    for args in (("inspect", WS, SES), ("inspect", WS, "s2"), ("inspect", WS), ("status",)):
        text = shell(*args).stdout
        hostile = [ch for ch in text if ch not in "\n" and not ch.isprintable()]
        assert hostile == [], (args, text)
    text = shell("inspect", WS, SES).stdout
    assert "boom \\x1b]0;owned\\x07\\x1b[2J\\x9b31m \\u202egnp.exe" in text
    assert "(maint\\x1b[8m\\u200b)" in shell("inspect", WS, "s2").stdout
    (entry,) = json.loads(shell("inspect", WS, SES, "--json").stdout)["entries"]
    assert entry["lastError"] == hostile_error


@pytest.mark.slow
def test_a_held_owed_signal_is_shown_by_a_real_inspect(outbox, valkey, r):
    """docs/reference/signals.md#a-receiver-that-keeps-failing: through a real process."""
    entry = accept(outbox, "a")
    r.hset(outbox.keys.owed_failures(WS, SES), mapping={"e-held": 5, "e-trying": 2})
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
        "OUTBOX_VALKEY_URL": valkey,
    }

    def shell(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "django", "outbox", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    shown = shell("inspect", WS, SES)
    assert shown.returncode == 0, shown.stderr
    assert "  e-held: entry_delivered failed 5 times: held, the session waits" in shown.stdout
    assert "  e-trying: entry_delivered failed 2 times (held at 5)" in shown.stdout
    data = json.loads(shell("inspect", WS, SES, "--json").stdout)
    assert data["owedFailures"] == {"e-held": 5, "e-trying": 2}
    missing = shell("owed", WS, SES, entry.id, "--retry")  # pending: nothing owed
    assert missing.returncode == 1 and "no entry_delivered owed" in missing.stderr


def test_status_shows_ages_in_seconds_then_minutes_then_hours(outbox, r):
    # The ages operators read: seconds below two minutes, minutes below two hours, then
    # hours with one decimal (docs/reference/commands.md#outbox). Silent workers last seen
    # that long ago on Valkey's clock carry them.
    seconds, micros = r.time()
    now_ms = seconds * 1000 + micros // 1000
    ages = {"w-100s": 100, "w-130s": 130, "w-7190s": 7190, "w-7300s": 7300}
    r.zadd(outbox.keys.workers, {wid: now_ms - age * 1000 for wid, age in ages.items()})
    text = run("status")
    assert "Workers: 0 live, 4 silent" in text
    for wid, shown in [
        ("w-100s", "100s"),
        ("w-130s", "2min"),
        ("w-7190s", "120min"),
        ("w-7300s", "2.0h"),
    ]:
        assert f"  {wid}: silent, seen {shown} ago" in text, (wid, text)
