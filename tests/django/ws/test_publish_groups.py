"""Which sockets a ``queue.update`` reaches: its own session's, through the session's
Channels group (django_outbox/ws/publish.py; docs/reference/websocket.md)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest
import redis
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox
from django_outbox.signals import entry_updated
from django_outbox.ws import publish
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, redis_channel_layers

STAFF = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=True, username="staff")
ALICE = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    policy = "tests.support.policies.own_workspace"
    with override_settings(CHANNEL_LAYERS=config, OUTBOX={"ACCESS_POLICY": policy}):
        yield config


def communicator(ws, ses, user=ALICE):
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{ws}/sessions/{ses}/"
    )
    comm.scope["user"] = user
    return comm


async def receive(comm, timeout=5):
    return json.loads(await comm.receive_from(timeout))


def watch(outbox, ws, ses):
    """Count a watcher by hand (what the consumer does on connect)."""
    client = redis.Redis.from_url(outbox.url)
    client.set(outbox.keys.session(ws, ses).watch, 1)
    client.close()


async def test_sessions_whose_ids_run_together_alike_never_share_updates(layers):
    """``alice``/``s1`` and ``alic``/``es1`` spell the same characters end to end: each
    session's socket still gets only its own session's updates."""
    own = communicator("alice", "s1")
    other = communicator("alic", "es1", user=STAFF)
    for comm in (own, other):
        connected, _ = await comm.connect()
        assert connected
        assert (await receive(comm))["type"] == "queue.snapshot"
    await aaccept(get_outbox(), "for-alice", ws="alice", ses="s1")
    assert (await receive(own))["entry"]["clientMessageID"] == "for-alice"
    await aaccept(get_outbox(), "for-alic", ws="alic", ses="es1")
    update = await receive(other)  # published after alice's: it would come second
    assert (update["workspaceID"], update["sessionID"]) == ("alic", "es1")
    assert update["entry"]["clientMessageID"] == "for-alic"
    await own.disconnect()
    await other.disconnect()
    await get_outbox().aclose()


async def test_a_config_that_only_stops_the_old_logger_propagating_still_gets_its_records(
    valkey, caplog, capsys
):
    """A logging config that still names the 0.1.0 logger ``django_outbox.events`` with
    nothing but ``propagate: False`` keeps getting the publisher's records there
    (CHANGELOG: the deprecated logger name): they never reach the root logger's handlers."""
    unreachable = redis_channel_layers("redis://127.0.0.1:1/0")
    old = logging.getLogger("django_outbox.events")
    old.propagate = False
    try:
        with override_settings(CHANNEL_LAYERS=unreachable):
            watch(get_outbox(), "w1", "s1")
            await aaccept(get_outbox(), "k1")
            await get_outbox().aclose()
    finally:
        old.propagate = True
    assert not [r for r in caplog.records if "could not publish" in r.getMessage()]
    assert "could not publish" in capsys.readouterr().err  # the old logger's, unhandled


async def test_an_unwatched_session_publishes_nothing_even_when_its_events_are_built(layers):
    """A receiver of ``entry_updated`` makes the outbox build every event, watched or not;
    the publisher still sends nothing for a session no socket watches
    (docs/reference/websocket.md: events of unwatched sessions are not published)."""
    seen = []

    def receiver(sender, entry, **kwargs):
        seen.append(entry.client_message_id)

    entry_updated.connect(receiver, dispatch_uid="test-unwatched")
    try:
        before = publish.stats.published
        await aaccept(get_outbox(), "k-unwatched", ws="alice", ses="nobody")
        assert seen == ["k-unwatched"]
        assert publish.stats.published == before
        await get_outbox().aclose()
    finally:
        entry_updated.disconnect(dispatch_uid="test-unwatched")
