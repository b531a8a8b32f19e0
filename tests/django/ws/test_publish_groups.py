"""Which sockets a ``queue.update`` reaches: its own session's, through the session's
Channels group (django_outbox/ws/publish.py; docs/reference/websocket.md)."""

from __future__ import annotations

from django_outbox.outbox import get_outbox
from tests.django.ws.test_consumer import STAFF, close_all, communicator, layers, receive
from tests.support.helpers import aaccept

__all__ = ["layers"]  # the fixture, imported for this module's tests


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
    await close_all(own, other)
