"""What the server can do: its version and commands are read once, and a setting
it cannot honour (``WAIT_AOF`` on Redis 7.0, which has no WAITAOF) is a ``check`` error
(``E007``) and a worker that will not start (docs/howto/valkey.md#supported-servers).

Against Debian's ``redis-server`` 7.0 (tests/support/redis_server.py) and the Valkey the
tests use, each started by the test with the append-only file on.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core import checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from django_outbox.core.errors import ServerUnsupported
from django_outbox.core.server import ServerCapabilities, unmet
from django_outbox.core.worker import Worker
from django_outbox.errors import OutboxUnavailable
from django_outbox.outbox import get_outbox
from django_outbox.testing import ValkeyServer
from tests.support.helpers import SES, WS, accept
from tests.support.paths import ROOT
from tests.support.redis_server import redis_server, unavailable

pytestmark = pytest.mark.slow

#: The worker processes' settings, with WAIT_AOF laid over them (written per test).
WORKER_SETTINGS = "tests.support.settings.worker"


@pytest.fixture(scope="module")
def redis70(tmp_path_factory):
    """Debian's redis-server (7.0 on Debian 12) with the append-only file on."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    server = redis_server(tmp_path_factory.mktemp("redis"), appendonly="yes").start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def valkey_aof(tmp_path_factory):
    """The tests' Valkey, with the append-only file on (what WAIT_AOF needs)."""
    with ValkeyServer(tmp_path_factory.mktemp("valkey-aof"), appendonly="yes") as server:
        yield server


@pytest.fixture
def on(monkeypatch):
    """Point this process's outbox at ``server`` (flushed) with ``WAIT_AOF = True``."""
    applied = []

    def point(server: ValkeyServer):
        redis.Redis.from_url(server.url).flushall()
        monkeypatch.setenv("OUTBOX_VALKEY_URL", server.url)  # no W010
        outbox = {**settings.OUTBOX, "VALKEY_URL": server.url, "WAIT_AOF": True}
        override = override_settings(OUTBOX=outbox)
        override.enable()
        applied.append(override)

    yield point
    for override in applied:
        override.disable()


def worker(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    """``manage.py outbox_worker --once`` in a process of its own on ``url``, WAIT_AOF on."""
    (tmp_path / "aof_settings.py").write_text(
        f"from {WORKER_SETTINGS} import *  # noqa: F403\n"
        "OUTBOX = {**OUTBOX, 'WAIT_AOF': True}  # noqa: F405\n",
        encoding="utf-8",
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)]),
        "OUTBOX_VALKEY_URL": url,
        "DJANGO_SETTINGS_MODULE": "aof_settings",
    }
    return subprocess.run(
        [sys.executable, "-m", "django", "outbox_worker", "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def serious() -> list[str]:
    return sorted(m.id for m in checks.run_checks(tags=["outbox"]) if m.is_serious())


# --- WAIT_AOF on a server without WAITAOF ------------------------------------------------


def test_wait_aof_on_redis_7_0_is_a_check_error_and_the_worker_refuses(redis70, on, tmp_path):
    on(redis70)
    r = redis.Redis.from_url(redis70.url, decode_responses=True)

    # the check says so, with the version needed and the fix
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    text = str(raised.value)
    assert "django_outbox.E007" in text
    assert "WAIT_AOF" in text and "WAITAOF" in text and "Redis 7.0.15" in text
    assert "Redis 7.2" in text and "set OUTBOX['WAIT_AOF'] to False" in text
    assert serious() == ["django_outbox.E007"]

    # an accept is stored but not acknowledged: a 503, never a silent success
    with pytest.raises(OutboxUnavailable) as unacknowledged:
        accept(get_outbox(), "k1")
    assert unacknowledged.value.accepted
    assert "WAITAOF" in str(unacknowledged.value)

    # the worker does not start: nothing claimed, delivered, recovered or marked failed
    done = worker(tmp_path, redis70.url)
    assert done.returncode != 0, done.stdout
    assert "outbox_worker refuses to start" in done.stderr
    assert "no WAITAOF" in done.stderr and "Redis 7.0.15" in done.stderr
    assert "django_outbox.E007" in done.stderr and "Traceback" not in done.stderr
    assert r.lrange("test:log", 0, -1) == []
    assert r.zcard("outboxworkers") == 0
    assert [e.status for e in get_outbox().list(WS, SES)] == ["pending"]


def test_the_same_settings_on_valkey_pass_the_check_and_the_worker_delivers(
    valkey_aof, on, tmp_path
):
    on(valkey_aof)
    call_command("check")  # no error
    assert serious() == []
    accept(get_outbox(), "k1")  # acknowledged: the AOF has it

    done = worker(tmp_path, valkey_aof.url)
    assert done.returncode == 0, done.stderr
    r = redis.Redis.from_url(valkey_aof.url, decode_responses=True)
    assert r.lrange("test:log", 0, -1) == ["s1 k1"]


# --- the core: what is read, once, and what the worker's start refuses --------------------


def test_what_each_server_can_do(valkey, redis70, make_outbox):
    (ours,) = make_outbox(url=valkey, cluster=False).server_capabilities()
    assert (ours.product, ours.compatible >= (7, 2)) == ("Valkey", True)
    assert {"BLMPOP", "WAITAOF"} <= ours.commands
    (old,) = make_outbox(url=redis70.url, cluster=False).server_capabilities()
    assert (str(old), old.compatible, old.node) == ("Redis 7.0.15", (7, 0), redis70.url)
    assert "BLMPOP" in old.commands and "WAITAOF" not in old.commands
    assert unmet([old], wait_aof=False) == []
    assert unmet([ours], wait_aof=True) == []
    assert [u.message for u in unmet([old], wait_aof=True)] == [
        f"OUTBOX['WAIT_AOF'] = True but {redis70.url} runs Redis 7.0.15, which has no "
        "WAITAOF (Redis 7.2 or Valkey 7.2 brought it): every accept would be stored and "
        "answered 503, and no delivery could be acknowledged."
    ]


def test_a_server_older_than_redis_7_0_is_refused_whatever_the_settings():
    older = ServerCapabilities("redis://h:6379/0", "Redis", "6.2.14", (6, 2), frozenset())
    found = unmet([older], wait_aof=False)
    assert len(found) == 1
    assert "runs Redis 6.2.14" in found[0].message
    assert "Redis 7.0 or later, or Valkey 7.2 or later" in found[0].hint
    # a "compatible" server that answers to every probed command but reports 6.2 is
    # refused on its version (the scripts' '#!lua flags=' line is not probed)
    compatible = ServerCapabilities("n", "Redis", "6.2.0", (6, 2), frozenset({"BLMPOP", "WAITAOF"}))
    assert len(unmet([compatible], wait_aof=True)) == 1
    # one without BLMPOP (renamed away) is refused the same way
    renamed = ServerCapabilities("n", "Redis", "7.0.15", (7, 0), frozenset({"WAITAOF"}))
    assert len(unmet([renamed], wait_aof=False)) == 1


def test_the_version_and_commands_are_read_once_per_outbox(redis70, make_outbox):
    r = redis.Redis.from_url(redis70.url)
    outbox = make_outbox(url=redis70.url, cluster=False)

    def info_calls() -> int:
        return int(r.info("commandstats").get("cmdstat_info", {}).get("calls", 0))

    before = info_calls()
    first = outbox.server_capabilities()
    assert asyncio.run(outbox.aserver_capabilities()) == first == outbox.server_capabilities()
    assert info_calls() - before == 1 + 1  # ours, and the commandstats read above


def test_the_core_worker_refuses_before_it_claims_or_recovers(redis70, make_outbox):
    r = redis.Redis.from_url(redis70.url, decode_responses=True)
    r.flushall()
    outbox = make_outbox(url=redis70.url, cluster=False, wait_aof=True)

    async def start() -> None:
        worker = Worker(outbox, lambda *a, **k: None, concurrency=1, tick=0.1,
                        stop=asyncio.Event(), once=True)  # fmt: skip
        try:
            await worker.run()
        finally:
            await outbox.aclose()

    with pytest.raises(ServerUnsupported, match="no WAITAOF") as raised:
        asyncio.run(start())
    assert len(raised.value.unmet) == 1
    assert r.keys("*") == []  # no claim, no heartbeat, nothing recovered


def test_the_check_says_nothing_of_a_server_it_cannot_reach(tmp_path):
    gone = ValkeyServer(tmp_path)  # never started: nothing listens on its port
    with override_settings(OUTBOX={**settings.OUTBOX, "VALKEY_URL": gone.url, "WAIT_AOF": True}):
        ids = sorted(m.id for m in checks.run_checks(tags=["outbox"]))
    assert "django_outbox.E007" not in ids and "django_outbox.W005" in ids
