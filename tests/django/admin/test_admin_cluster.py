"""The outbox admin on Valkey Cluster: pages merged from the sharded global indices.

On a cluster the workspaces SET, the all-sessions ZSET and the attention ZSET
are split into ``CLUSTER_SHARDS`` copies (``KeySpace.index_keys``); the admin
reads every copy and merges them, so paging, totals, search and actions behave
as on a standalone server (tests/django/admin/test_admin.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time

import pytest
from django.test import override_settings
from redis.cluster import RedisCluster, key_slot
from redis.exceptions import RedisClusterException

from django_outbox.admin import OutboxEntryAdmin
from django_outbox.core.entry import Status
from django_outbox.core.paging import in_index_order, merge_index_pages
from django_outbox.core.worker import Worker
from django_outbox.outbox import get_outbox
from tests.support.admin import (
    ALL_PERMS,
    CHANGELIST,
    accept,
    fail_once,
    hold_lease,
    login,
    page_link,
    post_action,
    staff,
    texts,
)
from tests.support.helpers import QUICK_PASSWORD_HASHERS

pytestmark = [pytest.mark.cluster, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


PER_PAGE = 3


@pytest.fixture(params=[8, 3], ids=["8 shards", "3 shards"])
def shards(request):
    return request.param


@pytest.fixture
def boxes(cluster_outbox, cluster_node_url, shards, monkeypatch):
    """(outbox, failing outbox) on the one-node cluster, the admin's outbox on it too,
    and small pages so paging shows with a handful of sessions."""
    monkeypatch.setattr(OutboxEntryAdmin, "sessions_per_page", PER_PAGE)
    settings = {"VALKEY_URL": cluster_node_url, "CLUSTER": True, "CLUSTER_SHARDS": shards}
    with override_settings(OUTBOX=settings):
        assert get_outbox().cluster and get_outbox().keys.shards == shards
        yield (
            cluster_outbox(cluster_shards=shards),
            cluster_outbox(cluster_shards=shards, max_attempts=1),
        )


@pytest.fixture
def operator(django_user_model):
    return login(staff(django_user_model, *ALL_PERMS))


def spread(outbox, count: int) -> list[str]:
    """``count`` workspace IDs taken round-robin from the shards (neighbours differ)."""
    by_shard: dict[int, list[str]] = {}
    for i in range(20 * outbox.keys.shards):
        by_shard.setdefault(outbox.keys.shard_of(f"ws{i}"), []).append(f"ws{i}")
    runs = itertools.zip_longest(*by_shard.values())
    return [ws for run in runs for ws in run if ws is not None][:count]


def shown(response) -> list[tuple[str, str]]:
    assert response.status_code == 200
    return [(v.workspace_id, v.session_id) for v in response.context["page"].sessions]


def tick() -> None:
    time.sleep(0.003)  # index scores are in ms: keep them apart


def make_errors(failing, pairs: list[tuple[str, str]]) -> None:
    for ws, ses in pairs:
        accept(failing, ws, ses, f"text of {ws}/{ses}")
        fail_once(failing, ws, ses, f"failed {ws}/{ses}")
        tick()


# --- the views --------------------------------------------------------------------------


def test_attention_view_merges_the_shards_oldest_first_and_pages(admin_client, boxes):
    outbox, failing = boxes
    workspaces = spread(outbox, 7)
    errors = [(ws, f"s{i}") for i, ws in enumerate(workspaces[:6])]
    make_errors(failing, errors)
    parked = workspaces[6]
    accept(outbox, parked, "p1", "to park")
    outbox.park_workspace(parked, "maintenance")
    accept(outbox, workspaces[0], "quiet", "just pending")
    expected = [*errors, (parked, "p1")]
    assert len({outbox.keys.shard_of(ws) for ws, _ in expected}) >= 2

    first = admin_client.get(CHANGELIST)
    assert shown(first) == expected[:3]
    page = first.context["page"]
    assert (page.total, page.attention_total, page.sessions_total) == (7, 7, 8)
    assert page.workspaces == 7
    content = first.content.decode()
    assert "Sessions needing attention: 7" in content
    assert "global session indices are not kept" not in content
    assert "failed " in content and "just pending" not in content

    second = admin_client.get(page_link(first, "next"))
    assert shown(second) == expected[3:6]
    last = admin_client.get(page_link(second, "next"))
    assert shown(last) == expected[6:]
    assert "maintenance" in last.content.decode()
    assert page_link(last, "next") is None  # (was: page 4 is empty)
    assert shown(admin_client.get(page_link(last, "prev"))) == expected[3:6]

    errors_only = admin_client.get(CHANGELIST, {"status": "error"})
    assert {row.session_id for row in errors_only.context["rows"]} == {"s0", "s1", "s2"}
    parked = admin_client.get(CHANGELIST, {"status": "parked"})
    parked = admin_client.get(page_link(admin_client.get(page_link(parked, "next")), "next"))
    assert shown(parked) == expected[6:]


def test_all_sessions_view_is_newest_first(admin_client, boxes):
    outbox, _ = boxes
    workspaces = spread(outbox, 5)
    made = []
    for i, ws in enumerate(workspaces):
        accept(outbox, ws, f"s{i}", f"message {i}")
        made.append((ws, f"s{i}"))
        tick()
    accept(outbox, workspaces[0], "s0", "a second message keeps the first accept's time")
    newest_first = made[::-1]

    first = admin_client.get(CHANGELIST, {"status": "all"})
    assert shown(first) == newest_first[:3]
    page = first.context["page"]
    assert (page.total, page.sessions_total, page.attention_total) == (5, 5, 0)
    assert shown(admin_client.get(page_link(first, "next"))) == newest_first[3:]
    pending = admin_client.get(CHANGELIST, {"status": "pending"})
    pending = admin_client.get(page_link(pending, "next"))
    assert len(pending.context["rows"]) == 3  # s1's entry and s0's two
    assert shown(admin_client.get(CHANGELIST)) == []  # nothing needs attention


def test_a_session_blocked_behind_a_lease_needs_attention(admin_client, boxes):
    outbox, _ = boxes
    first = accept(outbox, "held", "ses", "first")
    second = accept(outbox, "held", "ses", "second")
    hold_lease(outbox, "held", "ses", token="holder42abcdef")
    rows = {r.entry.id: r for r in admin_client.get(CHANGELIST).context["rows"]}
    assert rows[first.id].state == "delivering" and rows[second.id].state == "blocked"
    assert rows[second.id].lease.startswith("holder42")
    blocked = admin_client.get(CHANGELIST, {"status": "blocked"})
    assert [r.entry.id for r in blocked.context["rows"]] == [second.id]


def test_ties_are_broken_by_member_as_in_one_zset(boxes, r):
    """The merge orders equal scores as one ZSET would (compared on a standalone one)."""
    outbox, _ = boxes
    members = {f"w{i} s{j}": 1000 + (i * j) % 3 for i in range(6) for j in range(4)}
    r.zadd("one", members)
    copies: dict[int, list[tuple[str, float]]] = {}
    for member, score in members.items():
        copies.setdefault(outbox.keys.shard_of(member.split()[0]), []).append((member, score))
    for descending, command in ((False, r.zrange), (True, r.zrevrange)):
        whole = [tuple(m.split()) for m in command("one", 0, -1)]
        answers = [
            in_index_order([(*m.split(), s) for m, s in run], descending) for run in copies.values()
        ]
        answers = [[(f"{ws} {ses}", score) for ws, ses, score in a] for a in answers]
        merged = merge_index_pages(answers, descending)
        assert [(ws, ses) for ws, ses, _ in merged] == whole


def test_paging_on_continues_after_the_last_session_shown_across_shards(admin_client, boxes):
    """On a cluster: sessions of page 1 (the last one shown among them) are
    resolved; the next page starts right after it, merged from every shard's copy."""
    outbox, failing = boxes
    workspaces = spread(outbox, 9)
    errors = [(ws, f"s{i}") for i, ws in enumerate(workspaces)]
    make_errors(failing, errors)
    first = admin_client.get(CHANGELIST)
    assert shown(first) == errors[:3]
    for ws, ses in errors[1:3]:
        entry = failing.list(ws, ses)[0]
        failing.dismiss(ws, ses, entry.id)
    second = admin_client.get(page_link(first, "next"))
    assert shown(second) == errors[3:6]
    assert second.context["page"].offset == 1  # errors[0] is still before it
    third = admin_client.get(page_link(second, "next"))
    assert shown(third) == errors[6:]
    assert page_link(third, "next") is None
    assert shown(admin_client.get(page_link(third, "prev"))) == errors[3:6]


def test_equal_scores_in_several_shards_page_as_in_one_zset(boxes, cluster_node_url):
    """Sessions of one score in every shard's copy (indexed in the same millisecond),
    written straight into the copies: forward and back, with or without the tie
    offsets, the pages list what one ZSET holding them all would list."""
    outbox, _ = boxes
    admin = get_outbox()
    workspaces = spread(outbox, 2 * outbox.keys.shards)
    members = {
        index: {f"{ws} t{j:02d}": 1000 + 1000 * (j % 2) for ws in workspaces for j in range(6)}
        for index in ("attention", "allsessions")
    }
    client = RedisCluster.from_url(cluster_node_url, decode_responses=True)
    try:
        for index, scored in members.items():
            for member, score in scored.items():
                shard = outbox.keys.shard_of(member.split()[0])
                client.zadd(outbox.keys.index(index, shard), {member: score})
    finally:
        client.close()

    for index, descending in (("attention", False), ("allsessions", True)):
        expected = [
            f"{ws} {ses}"
            for ws, ses, _ in in_index_order(
                [(*m.split(), s) for m, s in members[index].items()], descending
            )
        ]
        for strip in (False, True):
            page = admin.session_page(index, PER_PAGE)
            seen = []
            while True:
                seen += [f"{v.workspace_id} {v.session_id}" for v in page.sessions]
                if not page.has_next:
                    break
                position = page.sessions[-1].position
                if strip:
                    position = dataclasses.replace(position, tie=0)
                page = admin.session_page(index, PER_PAGE, after=position)
                assert page.offset == len(seen)
            assert seen == expected
        position = page.sessions[-1].position
        back: list[str] = []
        while True:
            page = admin.session_page(index, PER_PAGE, before=position)
            back = [f"{v.workspace_id} {v.session_id}" for v in page.sessions] + back
            if not page.has_previous:
                break
            position = page.sessions[0].position
        assert back == expected[:-1]


# --- search -------------------------------------------------------------------------------


def test_search_finds_workspaces_sessions_and_names_across_shards(admin_client, boxes):
    outbox, failing = boxes
    workspaces = spread(outbox, 4)
    named = [(ws, "shared") for ws in workspaces]
    assert len({outbox.keys.shard_of(ws) for ws, _ in named}) >= 2
    make_errors(failing, named[:2])
    for ws, ses in named[2:]:
        accept(outbox, ws, ses, f"text of {ws}/{ses}")
        tick()
    ws0 = workspaces[0]
    accept(outbox, ws0, "other", "another session")

    def found(**params):
        response = admin_client.get(CHANGELIST, params)
        return shown(response), response.context["page"]

    sessions, page = found(status="all", q="shared")
    assert sessions == named[::-1][:3]  # every workspace's "shared", newest first
    assert page.total == 4 and page.workspace_id is None
    first = admin_client.get(CHANGELIST, {"status": "all", "q": "shared"})
    assert shown(admin_client.get(page_link(first, "next"))) == named[:1]
    sessions, page = found(q="shared")  # the attention view keeps the two in error
    assert sessions == named[:2] and page.total == 2

    sessions, page = found(status="all", q=ws0)
    assert sessions == [(ws0, "other"), (ws0, "shared")]
    assert page.workspace_id == ws0
    content = admin_client.get(CHANGELIST, {"status": "all", "q": ws0}).content.decode()
    assert f"Workspace {ws0}" in content  # the workspace tools

    last = workspaces[-1]
    assert found(status="all", q=f"{last}/shared")[0] == [(last, "shared")]
    assert found(status="all", q=f"{last} shared")[0] == [(last, "shared")]
    entry = outbox.list(last, "shared")[0]
    assert found(status="all", q=f"{last}/{entry.id}")[0] == [(last, "shared")]
    # An unknown word is taken for an entry ID, looked for in the index page only.
    missing = admin_client.get(CHANGELIST, {"status": "all", "q": "nothing-here"})
    assert missing.context["rows"] == [] and missing.context["page"].entry_id == "nothing-here"
    assert found(status="all", q=entry.id)[1].total == 5  # the whole index, paged


def test_a_workspace_named_like_its_session_is_listed_once(admin_client, boxes):
    outbox, _ = boxes
    accept(outbox, "twin", "twin", "one")
    accept(outbox, "other", "twin", "two")
    sessions = shown(admin_client.get(CHANGELIST, {"status": "all", "q": "twin"}))
    assert sorted(sessions) == [("other", "twin"), ("twin", "twin")]


# --- actions and the workers panel ---------------------------------------------------------------


def test_retry_and_dismiss_from_the_changelist(operator, boxes):
    outbox, failing = boxes
    workspaces = spread(outbox, 2)
    make_errors(failing, [(workspaces[0], "a"), (workspaces[1], "b")])
    rows = {row.workspace_id: row for row in operator.get(CHANGELIST).context["rows"]}
    assert set(rows) == set(workspaces)

    response = post_action(operator, "retry_entries", [rows[workspaces[0]].ref])
    assert any("Re-armed 1 entry" in m for m in texts(response))
    assert outbox.list(workspaces[0], "a")[0].status is Status.PENDING
    response = post_action(operator, "dismiss_entries", [rows[workspaces[1]].ref])
    assert any("Dismissed 1 entry" in m for m in texts(response))
    assert outbox.list(workspaces[1], "b") == []

    after = operator.get(CHANGELIST)
    assert shown(after) == [] and after.context["page"].attention_total == 0
    assert after.context["page"].sessions_total == 2  # an emptied session stays listed


def test_workers_panel_reads_heartbeats_in_several_slots(admin_client, boxes, cluster_node_url):
    outbox, _ = boxes
    ids = ["w-a", "w-b", "w-c"]
    assert len({key_slot(outbox.keys.heartbeat(w).encode()) for w in ids}) > 1

    async def noop(entry, **kwargs):
        return None

    async def beat():
        try:
            for wid in ids[:2]:
                await Worker(
                    outbox, noop, concurrency=2, tick=1, stop=asyncio.Event(), worker_id=wid
                ).beat()
        finally:
            await outbox.aclose()

    asyncio.run(beat())
    client = RedisCluster.from_url(cluster_node_url)
    try:
        client.zadd(outbox.keys.workers, {"w-c": int(time.time() * 1000) - 60_000})
        with pytest.raises(RedisClusterException):  # why the admin reads them one by one
            client.execute_command("MGET", *(outbox.keys.heartbeat(w) for w in ids))
    finally:
        client.close()

    workers = {w.id: w for w in admin_client.get(CHANGELIST).context["page"].workers}
    assert workers["w-a"].live and workers["w-b"].live and not workers["w-c"].live
    assert workers["w-a"].concurrency == 2
