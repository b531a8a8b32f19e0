"""A full Valkey drains: at ``maxmemory`` (policy ``noeviction``) what frees
memory still runs — dismiss, cleanup, claims, delivered-settles, releases — what would
grow it is refused whole, and a worker never exits: it backs off and drains."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
import redis

from django_outbox import DismissResult
from django_outbox.core.service import Outbox
from django_outbox.errors import OutboxUnavailable
from django_outbox.testing import ValkeyServer, wait_until
from tests.support.paths import ROOT

pytestmark = pytest.mark.standalone
TEXT = "x" * 40_000
WORKSPACES = ("w0", "w1", "w2")


async def noop(entry, *, workspace_id, session_id, attempt):
    return None


@pytest.fixture
def server(tmp_path):
    with ValkeyServer(tmp_path / "valkey") as server:
        yield server


def fill(outbox: Outbox) -> list:
    """60 prompts of 40 KB over three workspaces (the case's shape)."""
    return [
        outbox.accept(ws, f"s{i % 4}", user_id="u", client_message_id=f"k{i}", text=TEXT)
        for ws in WORKSPACES
        for i in range(20)
    ]


def make_full(client: redis.Redis) -> None:
    """Set maxmemory just below what is used: every growing command is now refused."""
    used = client.info("memory")["used_memory"]
    client.config_set("maxmemory", used - 64 * 1024)


def queued(outbox: Outbox) -> int:
    return sum(len(outbox.list(ws, f"s{i}")) for ws in WORKSPACES for i in range(4))


def test_at_maxmemory_accepts_are_refused_whole_and_removals_run(server):
    outbox = Outbox(url=server.url)
    client = redis.Redis.from_url(server.url)
    try:
        entries = fill(outbox)
        make_full(client)
        keys_before = client.dbsize()
        with pytest.raises(OutboxUnavailable, match="out of memory"):
            outbox.accept("w0", "s0", user_id="u", client_message_id="new", text="hi")
        assert client.dbsize() == keys_before  # no marker, no entry, nothing half-written
        assert not client.keys("*dedupe*:new")
        # an operator action that would grow entries is refused whole too
        with pytest.raises(OutboxUnavailable):
            outbox.park_workspace("w1", "maintenance")
        assert all(e.status == "pending" for e in outbox.list("w1", "s0"))
        # what only removes runs on the full server
        assert outbox.dismiss("w0", "s0", entries[0].id) is DismissResult.REMOVED
        assert outbox.cleanup_workspace("w2") > 0
        assert queued(outbox) == 39
    finally:
        outbox.close()
        client.close()


async def test_a_running_worker_drains_a_full_valkey_and_accepts_come_back(server):
    outbox = Outbox(url=server.url, deliverer=noop)
    client = redis.Redis.from_url(server.url)
    stop = asyncio.Event()
    try:
        fill(outbox)
        # a worker that was already running when the server filled up
        client.config_set("maxmemory", 0)
        make_full(client)
        run = asyncio.create_task(outbox.arun(stop=stop, tick=0.05, heartbeat=True))
        await asyncio.to_thread(wait_until, lambda: queued(outbox) == 0, 30, 0.05)
        assert not run.done()  # never exits on OOM
        # memory is back: accepts succeed again, and are delivered
        entry = await outbox.aaccept("w0", "s0", user_id="u", client_message_id="n", text="hi")
        await asyncio.to_thread(wait_until, lambda: not outbox.list("w0", "s0"), 10, 0.05)
        assert entry.id
    finally:
        stop.set()
        await run
        await outbox.aclose()
        outbox.close()
        client.close()


def test_a_worker_process_started_on_a_full_valkey_drains_it(server, tmp_path):
    outbox = Outbox(url=server.url)
    client = redis.Redis.from_url(server.url)
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": server.url,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.worker",
        "OUTBOX_TEST_DELIVERER": "tests.support.agents.noop",
    }
    proc = None
    try:
        fill(outbox)
        make_full(client)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "django", "outbox_worker", "--tick", "0.1"],
                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_until(lambda: queued(outbox) == 0 or proc.poll() is not None, 60, 0.1)
        assert proc.poll() is None, log.read_text()  # the case: it exited 1 from recovery
        assert queued(outbox) == 0
        # and accepts come back once the deliveries freed the memory
        outbox.accept("w0", "s0", user_id="u", client_message_id="again", text="hi")
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        outbox.close()
        client.close()
