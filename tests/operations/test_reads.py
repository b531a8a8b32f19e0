"""The core's read methods (django_outbox/core/reads.py) against real Valkey.

Index pages, search and the cleanup summary are also covered through the admin
(tests/django/admin/test_admin.py, tests/django/admin/test_admin_cluster.py); this file
holds what the admin does not show: the heartbeat record's round trip, the server-settings
probe the checks and the worker's preflight share, and the reads' own contracts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import time

import pytest

from django_outbox.core.errors import InvalidIdentifier, OutboxUnavailable
from django_outbox.core.heartbeats import HEARTBEAT_TTL, WorkerHeartbeat
from django_outbox.core.paging import (
    SEEK_ROUNDS,
    CopyPage,
    IndexPosition,
    copy_page_plan,
    merge_copies,
)
from django_outbox.core.reads import (
    IndexTotals,
    ServerSettings,
    read_server_settings,
)
from django_outbox.core.worker import Worker
from tests.support.valkey import free_port


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
    record = WorkerHeartbeat(
        "w1", 12.5, host="h", pid=7, started=10.0, in_flight=1, concurrency=3, steps=40
    )
    assert record.to_json() == (
        '{"id": "w1", "host": "h", "pid": 7, "started": 10.0, "last_seen": 12.5, '
        '"in_flight": 1, "concurrency": 3, "steps": 40}'
    )
    # a record written before "steps" existed still reads (a rolling upgrade)
    old = '{"id": "w1", "host": "h", "pid": 7, "started": 10.0, "last_seen": 12.5}'
    assert WorkerHeartbeat.from_json("w1", 12.5, old).steps is None
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

    first = outbox.session_page("allsessions", 2)
    assert [s.session_id for s in first.sessions] == ["s4", "s3"]
    assert (first.offset, first.has_previous, first.has_next) == (0, False, True)
    page = outbox.session_page("allsessions", 2, after=first.sessions[-1].position)
    assert page.total == 5 and page.totals == outbox.index_totals() and page.workers == []
    assert [(s.workspace_id, s.session_id) for s in page.sessions] == [("ws0", "s2"), ("ws1", "s1")]
    assert [e.text for e in page.sessions[0].snapshot.entries] == ["m2"]
    assert all(s.score_ms is not None for s in page.sessions)
    assert (page.offset, page.has_previous, page.has_next) == (2, True, True)
    back = outbox.session_page("allsessions", 2, before=page.sessions[0].position)
    assert [s.session_id for s in back.sessions] == ["s4", "s3"]
    assert (back.offset, back.has_previous, back.has_next) == (0, False, True)

    attention = outbox.session_page("attention", 10)  # oldest first
    assert [s.session_id for s in attention.sessions] == ["s1", "s3"]
    assert not attention.has_next


def test_a_page_among_given_sessions_keeps_only_indexed_ones_unless_told(outbox):
    accept(outbox, "ws", "s1", "one")
    among = [("ws", "nope"), ("ws", "s1")]
    indexed = outbox.session_page("allsessions", 10, among=among)
    assert indexed.total == 1 and [s.session_id for s in indexed.sessions] == ["s1"]
    given = outbox.session_page("allsessions", 10, among=among, indexed_only=False)
    assert given.total == 2 and [s.session_id for s in given.sessions] == ["nope", "s1"]
    assert given.sessions[0].snapshot.entries == [] and given.sessions[0].score_ms is None
    with pytest.raises(ValueError, match="pageable"):
        outbox.session_page("wsdue", 10)


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


# --- paging by position -----------------------------------------------------------------


def tie(r, key: str, ws: str, count: int, score: int) -> list[str]:
    """``count`` members of ``ws`` written into an index with one score, as the scripts
    write sessions indexed in the same millisecond (parking a workspace indexes its
    sessions in one round trip, so mostly but not surely in one millisecond)."""
    members = [f"{ws} t{i:03d}" for i in range(count)]
    r.zadd(key, dict.fromkeys(members, score))
    return members


def walk(outbox, index: str, per_page: int, hint=lambda position: position) -> list[str]:
    """Every session of ``index`` by following the pages forward; ``hint`` may rewrite
    each position's tie offset before it is used."""
    page = outbox.session_page(index, per_page)
    seen = []
    while True:
        seen += [f"{s.workspace_id} {s.session_id}" for s in page.sessions]
        assert len(page.sessions) == per_page or not page.has_next
        if not page.has_next:
            return seen
        page = outbox.session_page(index, per_page, after=hint(page.sessions[-1].position))


@pytest.mark.parametrize("index", ["attention", "allsessions"])
def test_pages_among_equal_scores_follow_member_order_whatever_the_tie_hint(outbox, r, index):
    """Sessions of one score are paged by member (as one ZSET orders them, reversed
    for all sessions, newest first); a missing, wrong or forged tie offset only costs
    probes."""
    key = outbox.keys.index(index)
    expected = [
        *tie(r, key, "early", 5, 1000),
        *tie(r, key, "big", 40, 2000),
        *tie(r, key, "late", 5, 3000),
    ]
    if index == "allsessions":
        expected.reverse()

    assert walk(outbox, index, 3) == expected
    assert walk(outbox, index, 3, lambda p: dataclasses.replace(p, tie=0)) == expected
    assert walk(outbox, index, 3, lambda p: dataclasses.replace(p, tie=10**6)) == expected
    assert walk(outbox, index, 3, lambda p: dataclasses.replace(p, tie=1)) == expected
    assert walk(outbox, index, 7, lambda p: dataclasses.replace(p, tie=p.tie + 20)) == expected

    # Paging back from the last session lists all the others, a page at a time.
    position = outbox.session_page(index, 50).sessions[-1].position
    back: list[str] = []
    while True:
        page = outbox.session_page(index, 3, before=position)
        back = [f"{s.workspace_id} {s.session_id}" for s in page.sessions] + back
        assert page.offset == len(expected) - 1 - len(back) and page.has_next
        if not page.has_previous:
            break
        position = page.sessions[0].position
    assert back == expected[:-1]


@pytest.mark.standalone  # counts the round trips to one index; a cluster's is sharded
def test_its_tie_offset_spares_a_position_among_equal_scores_the_probes(outbox, r, monkeypatch):
    """Deep among 40 equal scores, a page finds its sessions in one round trip (the
    index with the counts; the snapshots follow) when the position carries its tie
    offset, in more without."""
    tie(r, outbox.keys.index("attention"), "big", 40, 2000)
    trips = []
    execute_many = outbox.execute_many
    monkeypatch.setattr(
        outbox, "execute_many", lambda calls: trips.append(1) or execute_many(calls)
    )
    page = outbox.session_page("attention", 3)
    for _ in range(8):
        trips.clear()
        page = outbox.session_page("attention", 3, after=page.sessions[-1].position)
        assert len(trips) == 1
    assert page.sessions[-1].session_id == "t026"
    trips.clear()
    unknown = dataclasses.replace(page.sessions[0].position, tie=0)
    assert outbox.session_page("attention", 3, after=unknown).sessions[0].session_id == "t025"
    assert len(trips) > 1


def test_a_position_among_equal_scores_survives_more_than_a_page_resolved_before_it(outbox, r):
    key = outbox.keys.index("attention")
    members = tie(r, key, "big", 40, 2000)
    page = outbox.session_page("attention", 3)
    for _ in range(5):  # 18 sessions in, among the 40 of one score
        page = outbox.session_page("attention", 3, after=page.sessions[-1].position)
    position = page.sessions[-1].position
    assert (position.session_id, position.tie) == ("t017", 18)
    r.zrem(key, *members[5:18])  # 13 resolved before it, and its own session
    after = outbox.session_page("attention", 3, after=position)
    assert [s.session_id for s in after.sessions] == ["t018", "t019", "t020"]
    assert after.offset == 5 and after.has_previous and after.has_next
    assert [s.tie for s in after.sessions] == [6, 7, 8]  # their places now
    r.zadd(key, dict.fromkeys([f"big a{i:02d}" for i in range(30)], 2000))  # 30 before it
    after = outbox.session_page("attention", 3, after=position)
    assert [s.session_id for s in after.sessions] == ["t018", "t019", "t020"]
    assert after.offset == 35


def run_plan(r, plan, between):
    """Drive a read plan against real Valkey, calling ``between(n)`` before its n-th
    round trip (from 1): the index may change between two of them."""
    answers, rounds = None, 0
    while True:
        try:
            calls = plan.send(answers)
        except StopIteration as done:
            return done.value, rounds
        rounds += 1
        between(rounds)
        pipe = r.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call)
        answers = pipe.execute()


@pytest.mark.parametrize("descending", [False, True])
def test_a_copy_finds_its_position_while_the_ties_change_between_round_trips(r, descending):
    """Between every two round trips of a search among 60 equal scores, three sessions
    before the position leave and two arrive: the copy still answers the rows right
    after the position, and says how many lay at or before it at the last read."""
    key = "paging-churn"
    members = [f"big t{i:03d}" for i in range(60)]
    r.zadd(key, dict.fromkeys(members, 2000))
    r.zadd(key, {"early a": 1000, "late z": 3000})
    position = IndexPosition(2000.0, "big", "t030" if not descending else "t029")
    before = members[:30] if not descending else members[30:][::-1]
    later = members[31:] if not descending else members[:29][::-1]
    arrived: list[str] = []

    def churn(n: int) -> None:
        if n > 1 and before:
            r.zrem(key, *before[:3])
            del before[:3]
            new = [f"big {'a' if not descending else 'z'}{n:02d}{i}" for i in range(2)]
            r.zadd(key, dict.fromkeys(new, 2000))
            arrived.extend(new)

    plan = copy_page_plan(key, position, 4, 3, descending, hint=0)
    page, rounds = run_plan(r, plan, churn)
    assert rounds > 2 and page.complete
    assert [f"{ws} {ses}" for ws, ses, _ in page.rows] == later[:4]
    assert page.passed == 1 + len(before) + len(arrived) + 1  # early/late, the rest, itself


def test_a_copy_that_cannot_catch_its_position_gives_up_with_no_rows(r):
    """Twenty sessions arrive before the position between every two round trips: the
    copy stops after ``SEEK_ROUNDS`` and answers no rows, marked incomplete (the merge
    then shows nothing past the position rather than risk skipping a session)."""
    key = "paging-outrun"
    r.zadd(key, {f"big t{i:03d}": 2000 for i in range(40)})
    position = IndexPosition(2000.0, "big", "t030")

    def flood(n: int) -> None:
        r.zadd(key, {f"big a{n:02d}{i:02d}": 2000 for i in range(20)})

    page, rounds = run_plan(r, copy_page_plan(key, position, 4, 3, False), flood)
    assert rounds == SEEK_ROUNDS
    assert (page.rows, page.complete) == ([], False)


def test_positions_page_a_search_and_given_sessions(outbox):
    for i in range(5):
        accept(outbox, "ws", f"s{i}", f"m{i}")
        time.sleep(0.003)
    among = [("ws", f"s{i}") for i in range(5)] + [("ws", "nope")]
    first = outbox.session_page("allsessions", 2, among=among)
    assert [s.session_id for s in first.sessions] == ["s4", "s3"] and first.total == 5
    second = outbox.session_page("allsessions", 2, among=among, after=first.sessions[-1].position)
    assert [s.session_id for s in second.sessions] == ["s2", "s1"] and second.offset == 2
    back = outbox.session_page("allsessions", 2, among=among, before=second.sessions[0].position)
    assert [s.session_id for s in back.sessions] == ["s4", "s3"] and not back.has_previous

    given = outbox.session_page("allsessions", 2, among=among, indexed_only=False)
    assert [s.session_id for s in given.sessions] == ["s0", "s1"] and given.has_next
    rest = outbox.session_page(
        "allsessions", 2, among=among, indexed_only=False, after=given.sessions[-1].position
    )
    assert [s.session_id for s in rest.sessions] == ["s2", "s3"] and rest.offset == 2
    elsewhere = IndexPosition(None, "ws", "gone")  # not among them: the first page
    again = outbox.session_page("allsessions", 2, among=among, indexed_only=False, after=elsewhere)
    assert [s.session_id for s in again.sessions] == ["s0", "s1"] and again.offset == 0


def test_a_page_is_after_a_position_or_before_one_with_a_score(outbox):
    position = IndexPosition(1.0, "ws", "s1")
    with pytest.raises(ValueError, match="not both"):
        outbox.session_page("attention", 10, after=position, before=position)
    with pytest.raises(ValueError, match="needs a score"):
        outbox.session_page("attention", 10, after=IndexPosition(None, "ws", "s1"))
    beyond = outbox.session_page("attention", 10, after=IndexPosition(1e300, "ws", "s1"))
    assert beyond.sessions == [] and not beyond.has_next


def test_a_position_reads_back_from_its_text_and_refuses_anything_else():
    for position in (
        IndexPosition(1712345678901.0, "ws-1", "s.2", 3),
        IndexPosition(0.5, "w", "s"),
        IndexPosition(-2.0, "w", "s", 7),
        IndexPosition(3.0, "w", "s", 2**31),  # the largest tie offset a position may carry
        IndexPosition(None, "w", "s"),
    ):
        assert IndexPosition.from_text(position.to_text()) == position
    assert IndexPosition(1712345678901.0, "ws", "s", 3).to_text() == "1712345678901~ws~s~3"
    for text in (
        "",
        "1~ws~s",
        "1~ws~s~1~x",
        "nan~ws~s~1",
        "inf~ws~s~1",
        "x~ws~s~1",
        "1~ws~s~-1",
        "1~ws~s~1.5",
        f"1~ws~s~{2**31 + 1}",
        "1~../x~s~1",
        "1~ws~<script>~1",
        "1~~s~1",
        "1~ws~s ~1",
    ):
        with pytest.raises(ValueError):
            IndexPosition.from_text(text)


def test_a_copy_that_gave_up_bounds_the_merge():
    rows = [("a", f"s{i}", float(i)) for i in range(6)]
    done = CopyPage([rows[0], rows[2], rows[4]])
    stuck = CopyPage([rows[1]], complete=False)
    assert merge_copies([done, stuck], descending=False) == ([rows[0], rows[1]], True)
    assert merge_copies([done, CopyPage([], complete=False)], descending=False) == ([], True)
    backwards = [done, CopyPage([rows[3]], complete=False)]
    assert merge_copies(backwards, descending=True) == ([rows[4], rows[3]], True)
    assert merge_copies([done], descending=False) == ([rows[0], rows[2], rows[4]], False)


# -- the warning about corrupt members -------------------------------------------------------


def _skipped_warning(outbox, r, members, caplog) -> str:
    """The one warning ``outbox.workspaces()`` logs for ``members`` written by hand into
    the workspaces index beside a good workspace."""
    key = outbox.keys.index_keys("workspaces")[0]
    r.sadd(key, "good-ws", *members)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="django_outbox"):
        assert outbox.workspaces() == ["good-ws"]
    (record,) = [x for x in caplog.records if "corrupt member" in x.getMessage()]
    return record.getMessage()


@pytest.mark.standalone  # one copy of the workspaces index
def test_a_corrupt_member_is_logged_escaped_never_raw(outbox, r, caplog):
    # Whatever bytes another program wrote, the warning shows them escaped: no terminal
    # control sequence or line break of theirs reaches an operator's log.
    message = _skipped_warning(outbox, r, [b"a\x1b[2J\nFAKE ERROR"], caplog)
    assert "\x1b" not in message and "\n" not in message
    assert "\\x1b[2J\\nFAKE ERROR" in message
    assert message.startswith("outbox: skipped 1 corrupt member(s)")


@pytest.mark.standalone
@pytest.mark.parametrize(("count", "more"), [(3, False), (4, True)])
def test_the_warning_shows_three_members_and_says_when_there_are_more(
    outbox, r, caplog, count, more
):
    members = [f"bad id {i}!" for i in range(count)]
    message = _skipped_warning(outbox, r, members, caplog)
    assert f"skipped {count} corrupt member(s)" in message
    assert sum(f"bad id {i}!" in message for i in range(count)) == 3
    assert message.endswith(" ...") is more


# --- one-line rules of the reads that the admin does not walk --------------------------------


@pytest.mark.standalone
def test_server_settings_never_name_the_node_with_its_password(outbox):
    """A node is shown to staff by its URL, credentials masked (docs/howto/valkey.md):
    the nopass default user takes any password, so the probe connects with one."""
    url = outbox.url.replace("redis://", "redis://default:s3cret-pw@", 1)
    for server in (*read_server_settings(url), *outbox.server_settings()):
        assert "s3cret-pw" not in server.node
    (server,) = read_server_settings(url)
    assert server.node.endswith(outbox.url.split("@")[-1].removeprefix("redis://"))


def test_an_entry_search_reads_exactly_max_sessions_and_counts_them_all(outbox):
    """``ws/entry`` reads the first ``max_sessions`` sessions by ID, the last of them
    included, and reports how many the workspace has (docs/reference/admin.md)."""
    for ses in ("s1", "s2", "s3"):
        accept(outbox, "ws", ses, f"m-{ses}")
    in_s2 = outbox.list("ws", "s2")[0].id
    in_s3 = outbox.list("ws", "s3")[0].id
    found = outbox.search(f"ws/{in_s2}", max_sessions=2)
    assert found.sessions == [("ws", "s2")] and found.workspace_sessions == 3
    beyond = outbox.search(f"ws/{in_s3}", max_sessions=2)
    assert beyond.sessions == [] and beyond.workspace_sessions == 3


def test_most_overdue_is_the_session_due_first(outbox):
    """The session waiting longest past its due time, with that time in epoch seconds
    (docs/howto/observe.md, ``outbox status``); None when nothing is due."""
    assert outbox.most_overdue() is None
    before = time.time()
    accept(outbox, "wb", "first", "a")
    time.sleep(0.005)  # due times are in ms: keep them apart
    accept(outbox, "wa", "second", "b")  # sorts first by workspace, due later
    overdue = outbox.most_overdue()
    assert (overdue.workspace_id, overdue.session_id) == ("wb", "first")
    assert before - 1 <= overdue.due_at <= time.time() + 1
