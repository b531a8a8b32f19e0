"""A session's version never goes backwards, even across cleanup, and watchers of a
cleaned session are told."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, accept, redis_channel_layers

WS, SES = "alice", "s1"
ALICE = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")


def test_the_version_after_cleanup_and_a_new_accept_is_above_every_earlier_one(outbox):
    accept(outbox, "k1", ws=WS)
    accept(outbox, "k2", ws=WS)
    before = outbox.snapshot(WS, SES).version
    outbox.cleanup_workspace(WS)
    empty = outbox.snapshot(WS, SES).version
    assert empty >= before  # an empty (cleaned) session does not report 0
    entry = accept(outbox, "k1", ws=WS)  # the case: accept, deliver, accept again
    after = outbox.snapshot(WS, SES).version
    assert after > before and after > empty
    assert entry.seq > before  # accept order stays the version order


def test_versions_grow_by_one_per_change_within_a_session(outbox):
    first = accept(outbox, "k1")
    second = accept(outbox, "k2")
    assert second.seq == first.seq + 1
    assert outbox.snapshot("w1", "s1").version == second.seq


def test_every_cleanup_of_the_same_session_keeps_climbing(outbox):
    seen = []
    for round_ in range(5):
        accept(outbox, f"k{round_}", ws=WS)
        seen.append(outbox.snapshot(WS, SES).version)
        outbox.cleanup_workspace(WS)
        seen.append(outbox.snapshot(WS, SES).version)
    assert seen == sorted(seen)
    assert len(set(seen[::2])) == 5  # strictly increasing across the accepts


def test_cleanup_tells_listeners_each_entry_is_gone(outbox, signals_log):
    a = accept(outbox, "k1", ws=WS)
    b = accept(outbox, "k2", ws=WS)
    version = outbox.snapshot(WS, SES).version
    outbox.cleanup_workspace(WS)
    gone = [(e.id, kw["state"], kw["version"]) for e, kw in signals_log.calls["updated"][2:]]
    assert {entry_id for entry_id, _, _ in gone} == {a.id, b.id}
    assert all(state == "dismissed" and v > version for _, state, v in gone)


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    with override_settings(
        CHANNEL_LAYERS=config, OUTBOX={"ACCESS_POLICY": "tests.support.policies.own_workspace"}
    ):
        yield config


@pytest.mark.standalone  # channels-redis needs a standalone server (README "Valkey Cluster")
async def test_a_watcher_of_a_cleaned_session_sees_its_entries_dismissed_then_new_ones(layers):
    outbox = get_outbox()
    old = await aaccept(outbox, "k1", ws=WS)
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{WS}/sessions/{SES}/"
    )
    comm.scope["user"] = ALICE
    connected, _ = await comm.connect()
    assert connected
    snapshot = await comm.receive_json_from(5)
    assert [e["id"] for e in snapshot["entries"]] == [old.id]
    try:
        await outbox.acleanup_workspace(WS)
        dismissed = await comm.receive_json_from(5)
        assert (dismissed["state"], dismissed["entry"]["id"]) == ("dismissed", old.id)
        assert dismissed["version"] > snapshot["version"]
        new = await aaccept(outbox, "k1", ws=WS)  # the same key is free again
        queued = await comm.receive_json_from(5)
        assert (queued["state"], queued["entry"]["id"]) == ("queued", new.id)
        assert queued["version"] > dismissed["version"]  # a client applies it
    finally:
        await comm.disconnect()
        await outbox.aclose()
        layer = get_channel_layer()
        await layer.flush()
        await layer.close_pools()
