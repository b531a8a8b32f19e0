"""The queue snapshot says how the session's recent prompts ended, so a page that was not
connected when they did learns it on reconnect (docs/reference/websocket.md#how-prompts-ended).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.core.entry import parse_time
from django_outbox.outbox import get_outbox
from django_outbox.ws.routing import websocket_urlpatterns
from django_outbox.ws.truth import snapshot_frames
from tests.support.helpers import aaccept, redis_channel_layers

ALICE = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    policy = {"ACCESS_POLICY": "tests.support.policies.own_workspace"}
    with override_settings(CHANNEL_LAYERS=config, OUTBOX=policy):
        yield config


async def noop(entry, **kwargs):
    return None


async def snapshot_of(ws="alice", ses="s1"):
    """Connect, read the whole snapshot (its pages), disconnect: its last page."""
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{ws}/sessions/{ses}/"
    )
    comm.scope["user"] = ALICE
    connected, _ = await comm.connect()
    assert connected
    frame = json.loads(await comm.receive_from(5))
    while frame["page"] < frame["pages"]:
        frame = json.loads(await comm.receive_from(5))
    await comm.disconnect()
    return frame


async def test_a_reconnecting_socket_is_told_how_the_prompts_it_missed_ended(layers):
    outbox = get_outbox()
    before = await snapshot_of()
    assert before["entries"] == [] and before["ended"] == []

    sent = await aaccept(outbox, "sent", ws="alice")
    dropped = await aaccept(outbox, "dropped", ws="alice")
    cancelled = await aaccept(outbox, "cancelled", ws="alice")
    kept = await aaccept(outbox, "kept", ws="alice")
    assert await outbox.adeliver_once("alice", "s1", noop)
    await outbox.adismiss("alice", "s1", dropped.id)
    await outbox.acancel("alice", "s1", cancelled.id)

    after = await snapshot_of()
    assert [e["id"] for e in after["entries"]] == [kept.id]
    assert [(e["id"], e["how"]) for e in after["ended"]] == [
        (cancelled.id, "cancelled"),
        (dropped.id, "dismissed"),
        (sent.id, "delivered"),
    ]
    stamps = [parse_time(e["at"]) for e in after["ended"]]
    assert stamps == sorted(stamps, reverse=True)
    assert set(after["ended"][0]) == {"id", "how", "at"}  # no text: nothing but the ending
    await outbox.aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()


def test_only_the_last_page_carries_the_endings_and_every_page_stays_in_bounds():
    entries = [{"id": f"e{i}", "text": "x" * 300} for i in range(10)]
    at = "2026-12-01T21:00:00.000000Z"
    ended = [{"id": f"gone{i}", "how": "delivered", "at": at} for i in range(5)]
    frames = snapshot_frames("w", "s", 7, entries, 1500, ack="tok", ended=ended)
    pages = [json.loads(f) for f in frames]
    assert len(pages) > 1 and all(len(f.encode()) <= 1500 for f in frames)
    assert [("ended" in p, "ack" in p) for p in pages] == [(False, False)] * (len(pages) - 1) + [
        (True, True)
    ]
    assert pages[-1]["ended"] == ended
    assert [e["id"] for p in pages for e in p["entries"]] == [e["id"] for e in entries]
