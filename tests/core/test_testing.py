"""The shipped test helpers (django_outbox.testing) and the suite's own guard."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import redis

from django_outbox.core.service import Outbox
from django_outbox.testing import ValkeyServer, ping, wait_until
from tests.support.paths import ROOT


def test_valkey_server_is_a_throwaway_real_server_an_outbox_can_use(tmp_path):
    with ValkeyServer(tmp_path) as server:
        assert ping(server.port)
        outbox = Outbox(url=server.url)
        try:
            entry = outbox.accept("w1", "s1", user_id="u", client_message_id="k", text="hi")
            assert [e.id for e in outbox.list("w1", "s1")] == [entry.id]
            policy = outbox.client.config_get("maxmemory-policy")["maxmemory-policy"]
            assert policy == "noeviction"
        finally:
            outbox.close()
    assert not ping(server.port)
    assert (tmp_path / "valkey.log").exists()


def test_valkey_server_restarts_with_its_data_after_a_kill(tmp_path):
    with ValkeyServer(tmp_path, appendonly="yes", appendfsync="always") as server:
        client = redis.Redis.from_url(server.url)
        client.set("kept", "1")
        client.close()
        server.kill()
        assert not ping(server.port)
        server.start()
        client = redis.Redis.from_url(server.url)
        assert client.get("kept") == b"1"
        client.close()


def test_the_suite_refuses_to_flush_a_valkey_that_holds_data(tmp_path):
    with ValkeyServer(tmp_path) as server:
        client = redis.Redis.from_url(server.url)
        client.set("someone-elses", "data")
        env = {**os.environ, "OUTBOX_TEST_VALKEY_URL": server.url}
        env.pop("OUTBOX_TEST_ALLOW_FLUSH", None)
        env.pop("OUTBOX_TEST_CLUSTER", None)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
             "tests/core/test_entry.py::test_wire_dict_is_camel_case"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 2, run.stdout + run.stderr
        assert "holds 1 keys" in run.stdout + run.stderr
        assert client.get("someone-elses") == b"data"
        client.close()


def test_wait_until_hands_back_what_the_condition_found_or_fails_by_its_deadline():
    """``wait_until`` returns the predicate's truthy value (a test waits for a thing and
    uses it), and raises ``AssertionError`` naming the condition once ``timeout`` has
    passed (docs/howto/testing.md)."""
    answers = iter([None, 0, "", {"id": "e1"}])
    assert wait_until(lambda: next(answers), timeout=5) == {"id": "e1"}
    with pytest.raises(AssertionError, match=r"within 0\.05s: the entry is delivered"):
        wait_until(lambda: None, timeout=0.05, message="the entry is delivered")


def test_wait_until_reads_a_callable_message_when_the_deadline_has_passed():
    """A callable ``message`` (a process's log reader) is read when the wait fails, not
    when it begins: the error carries the logs of the moment it gave up."""
    log: list[str] = ["started"]
    calls: list[int] = []

    def logs() -> str:
        calls.append(1)
        return " / ".join(log)

    def later_line():
        log.append("turn cut")
        return None

    with pytest.raises(AssertionError, match=r"within 0\.05s: started / turn cut"):
        wait_until(later_line, timeout=0.05, message=logs)
    assert calls == [1]  # read once, at the deadline
    assert wait_until(lambda: "yes", timeout=1, message=logs) == "yes"
    assert calls == [1]  # a met condition never reads it
