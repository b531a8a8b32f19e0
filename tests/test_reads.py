"""The core's read methods (django_outbox/core/reads.py) against real Valkey.

Index pages, search and the cleanup summary are also covered through the admin
(tests/test_admin.py, tests/test_admin_cluster.py); this file holds what the admin
does not show: the heartbeat record's round trip, the server-settings probe the
checks and the worker's preflight share, and the reads' own contracts.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest

from django_outbox.core.errors import InvalidIdentifier, OutboxUnavailable
from django_outbox.core.reads import (
    HEARTBEAT_TTL,
    IndexTotals,
    ServerSettings,
    WorkerHeartbeat,
    read_server_settings,
)
from django_outbox.core.worker import Worker

from .valkey import free_port


def accept(outbox, ws: str, ses: str, text: str) -> None:
    outbox.accept(ws, ses, user_id="u", client_message_id=text, text=text)


async def _noop(entry, **kwargs):
    return None


def beat(outbox, worker_id: str, concurrency: int = 2) -> None:
    async def run():
        try:
            await Worker(
                outbox,
                _noop,
                concurrency=concurrency,
                tick=1,
                stop=asyncio.Event(),
                worker_id=worker_id,
            ).beat()
        finally:
            await outbox.aclose()

    asyncio.run(run())


# --- workers ----------------------------------------------------------------------------


def test_workers_reads_back_what_each_worker_published_live_ones_first(outbox, r):
    before = time.time()
    beat(outbox, "w-old", concurrency=1)
    time.sleep(0.01)
    beat(outbox, "w-new", concurrency=4)
    r.zadd(outbox.keys.workers, {"w-gone": int((before - 2 * HEARTBEAT_TTL) * 1000)})

    workers = outbox.workers()
    assert [w.id for w in workers] == ["w-new", "w-old", "w-gone"]
    new, old, gone = workers
    assert new.live and new.concurrency == 4 and new.in_flight == 0
    assert new.pid == os.getpid() and new.host == socket.gethostname()
    assert before <= new.started <= time.time()
    # last_seen is the workers ZSET's score: milliseconds
    assert new.started - 0.001 <= new.last_seen <= time.time()
    assert old.concurrency == 1 and old.last_seen < new.last_seen
    assert gone == WorkerHeartbeat("w-gone", gone.last_seen, live=False)
    assert gone.last_seen == pytest.approx(before - 2 * HEARTBEAT_TTL, abs=0.002)
    assert [w.id for w in outbox.live_workers()] == ["w-new", "w-old"]


def test_a_worker_whose_heartbeat_key_expired_is_not_live(outbox, r):
    beat(outbox, "w1")
    assert [w.id for w in outbox.live_workers()] == ["w1"]
    r.delete(outbox.keys.heartbeat("w1"))  # as its TTL would
    assert outbox.live_workers() == []
    (gone,) = outbox.workers()
    assert not gone.live and gone.pid is None


def test_no_workers_is_an_empty_list(outbox):
    assert outbox.workers() == [] and outbox.live_workers() == []


def test_the_heartbeat_record_keeps_its_stored_shape():
    record = WorkerHeartbeat("w1", 12.5, host="h", pid=7, started=10.0, in_flight=1, concurrency=3)
    assert record.to_json() == (
        '{"id": "w1", "host": "h", "pid": 7, "started": 10.0, "last_seen": 12.5, '
        '"in_flight": 1, "concurrency": 3}'
    )
    assert WorkerHeartbeat.from_json("w1", 12.5, record.to_json()) == record
    assert WorkerHeartbeat.from_json("w1", 12.5, b"not json") == WorkerHeartbeat("w1", 12.5)


# --- the server ------------------------------------------------------------------------


@pytest.mark.standalone
def test_server_settings_reads_eviction_and_persistence(outbox, r):
    (server,) = outbox.server_settings()
    assert server == ServerSettings(
        node=outbox.url,
        maxmemory_policy="noeviction",
        aof_enabled=False,  # the test server runs with appendonly no and no save points
        appendfsync=r.config_get("appendfsync")["appendfsync"],
        save="",
    )
    assert read_server_settings(outbox.url) == [server]
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        assert [s.maxmemory_policy for s in read_server_settings(outbox.url)] == ["allkeys-lru"]
        assert [s.maxmemory_policy for s in outbox.server_settings()] == ["allkeys-lru"]
    finally:
        r.config_set("maxmemory-policy", "noeviction")


def test_an_unreachable_server_raises_outbox_unavailable():
    url = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(OutboxUnavailable, match=r"127\.0\.0\.1"):
        read_server_settings(url, timeout=0.5)


@pytest.mark.cluster
def test_on_a_cluster_every_primary_is_read(cluster_outbox, cluster_node_url):
    outbox = cluster_outbox()
    (server,) = outbox.server_settings()  # the one-node cluster has one primary
    assert server.node == cluster_node_url.removeprefix("redis://").split("/")[0]
    assert server.maxmemory_policy == "noeviction"
    assert read_server_settings(cluster_node_url, cluster=True) == [server]


# --- indices, search and workspaces -----------------------------------------------------------


def test_index_totals_and_a_page_of_all_sessions_newest_first(outbox):
    for i in range(5):
        accept(outbox, f"ws{i % 2}", f"s{i}", f"m{i}")
        time.sleep(0.003)  # index scores are in ms: keep them apart
    outbox.park_workspace("ws1", "hold")
    assert outbox.index_totals() == IndexTotals(workspaces=2, sessions=5, attention=2)

    page = outbox.session_page("allsessions", 2, 2)
    assert page.total == 5 and page.totals == outbox.index_totals() and page.workers == []
    assert [(s.workspace_id, s.session_id) for s in page.sessions] == [("ws0", "s2"), ("ws1", "s1")]
    assert [e.text for e in page.sessions[0].snapshot.entries] == ["m2"]
    assert all(s.score_ms is not None for s in page.sessions)

    attention = outbox.session_page("attention", 1, 10)  # oldest first
    assert [s.session_id for s in attention.sessions] == ["s1", "s3"]


def test_a_page_among_given_sessions_keeps_only_indexed_ones_unless_told(outbox):
    accept(outbox, "ws", "s1", "one")
    among = [("ws", "nope"), ("ws", "s1")]
    indexed = outbox.session_page("allsessions", 1, 10, among=among)
    assert indexed.total == 1 and [s.session_id for s in indexed.sessions] == ["s1"]
    given = outbox.session_page("allsessions", 1, 10, among=among, indexed_only=False)
    assert given.total == 2 and [s.session_id for s in given.sessions] == ["nope", "s1"]
    assert given.sessions[0].snapshot.entries == [] and given.sessions[0].score_ms is None
    with pytest.raises(ValueError, match="pageable"):
        outbox.session_page("wsdue", 1, 10)


def test_search_names_workspaces_sessions_and_entries(outbox):
    accept(outbox, "ws", "s1", "one")
    accept(outbox, "other", "s1", "two")
    entry = outbox.list("ws", "s1")[0]

    found = outbox.search("s1")
    assert sorted(found.sessions) == [("other", "s1"), ("ws", "s1")]
    assert found.workspace_id is None and found.entry_id is None
    assert (
        outbox.search("ws").sessions == [("ws", "s1")] and outbox.search("ws").workspace_id == "ws"
    )
    assert outbox.search("ws s1").sessions == [("ws", "s1")]
    by_entry = outbox.search(f"ws/{entry.id}")
    assert (by_entry.sessions, by_entry.entry_id, by_entry.exact) == (
        [("ws", "s1")],
        entry.id,
        True,
    )
    assert by_entry.workspace_sessions == 1
    exact = outbox.search(f"ws/s9/{entry.id}")  # named exactly: not looked up
    assert (exact.sessions, exact.exact) == ([("ws", "s9")], True)
    unknown = outbox.search("e-unknown")
    assert unknown.sessions is None and unknown.entry_id == "e-unknown"
    with pytest.raises(InvalidIdentifier):
        outbox.search("ws/bad id!")
    for query in ("/", "a/b/c/d"):
        with pytest.raises(ValueError):
            outbox.search(query)


def test_workspace_summaries_and_session_counts(outbox):
    accept(outbox, "ws", "s2", "a")
    accept(outbox, "ws", "s2", "b")
    accept(outbox, "ws", "s1", "c")
    (ws, empty) = outbox.workspace_summaries(["ws", "none"])
    assert [(s.session_id, s.entries, s.leased) for s in ws.sessions] == [
        ("s1", 1, False),
        ("s2", 2, False),
    ]
    assert (ws.entry_count, ws.leased) == (3, 0)
    assert empty.sessions == [] and empty.entry_count == 0
    assert outbox.session_counts(["ws", "none"]) == [2, 0]


def test_entry_counts_stop_after_max_sessions(outbox):
    accept(outbox, "w1", "s1", "a")
    accept(outbox, "w1", "s2", "b")
    accept(outbox, "w2", "s1", "c")
    outbox.park_workspace("w2", "hold")
    assert outbox.entry_counts() == {"pending": 2, "parked": 1}
    assert outbox.entry_counts(max_sessions=2) == {"pending": 2}  # w1's two sessions only
