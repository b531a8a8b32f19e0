"""Steering events over the real queue WebSocket (channels-redis layer): edited, moved,
cancelled and expired reach a watcher with increasing versions (docs/howto/steering.md)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, redis_channel_layers

ALICE = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")
WS, SES = "alice", "s1"
ACTORS = ("editedBy", "movedBy", "cancelledBy")


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    with override_settings(
        CHANNEL_LAYERS=config, OUTBOX={"ACCESS_POLICY": "tests.support.policies.own_workspace"}
    ):
        yield config


async def receive(comm, timeout=5):
    return json.loads(await comm.receive_from(timeout))


async def test_steering_changes_reach_a_watcher(layers):
    outbox = get_outbox()
    first = await aaccept(outbox, "a", ws=WS, ses=SES)
    second = await aaccept(outbox, "b", ws=WS, ses=SES, expires_after=0.001)
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{WS}/sessions/{SES}/"
    )
    comm.scope["user"] = ALICE
    connected, _ = await comm.connect()
    assert connected
    snap = await receive(comm)
    assert snap["type"] == "queue.snapshot"
    assert snap["entries"][1]["expiresAt"] > snap["entries"][1]["acceptedAt"]
    await outbox.aedit(WS, SES, first.id, text="a, edited", actor="user:u")
    await outbox.amove(WS, SES, second.id, to="next", actor="staff:1")
    await outbox.acancel(WS, SES, first.id, actor="user:u")
    # The one left is past its expiry: the claim that reaches it marks it expired.
    await outbox.adeliver_once(WS, SES, deliverer=_never)
    updates = [await receive(comm) for _ in range(4)]
    assert [(u["state"], u["entry"]["id"]) for u in updates] == [
        ("edited", first.id),
        ("moved", second.id),
        ("cancelled", first.id),
        ("expired", second.id),
    ]
    assert updates[0]["entry"]["text"] == "a, edited"
    # Who made each change reaches the watcher with the entry (never a text of theirs).
    assert [u["entry"].get(k) for u, k in zip(updates, ACTORS, strict=False)] == [
        "user:u",
        "staff:1",
        "user:u",
    ]
    assert updates[3]["entry"]["status"] == "expired"
    versions = [snap["version"]] + [u["version"] for u in updates]
    assert versions == sorted(set(versions))
    await comm.disconnect()
    await outbox.aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()


async def _never(entry, **kwargs):
    raise AssertionError(f"an expired prompt was sent: {entry.text}")
