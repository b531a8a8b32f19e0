"""What bounds the bytes queued to a socket whose client stops reading, in process
(docs/explanation/security.md#slow-readers, docs/reference/websocket.md#acknowledgements):
the read receipts, the acknowledgement token on a snapshot's last page, and the consumer
on a real channels-redis layer holding back, skipping and closing (4408). The same through
uvicorn and daphne: test_slow_readers_on_servers.py."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox
from django_outbox.ws.consumer import OutboxConsumer
from django_outbox.ws.publish import group_name
from django_outbox.ws.routing import websocket_urlpatterns
from django_outbox.ws.truth import ReadReceipts, SocketState, snapshot_frames
from tests.support.helpers import aaccept, redis_channel_layers

POLICY = "tests.support.policies.own_workspace"
FULL = 102_400


# -- the pieces ----------------------------------------------------------------------------


def test_receipts_count_what_was_sent_and_what_an_echoed_token_covers():
    reads = ReadReceipts()
    reads.count(100)
    first = reads.new_token()
    reads.expect(first, reads.sent)
    reads.snapshot_end = reads.sent
    reads.count(50)
    second = reads.new_token()
    reads.expect(second, reads.sent)
    assert (reads.unread, reads.snapshot_unread) == (150, True)
    assert not reads.ack("forged") and not reads.ack(None) and reads.unread == 150
    assert reads.ack(first) and (reads.unread, reads.snapshot_unread) == (50, False)
    assert not reads.ack(first)  # spent
    assert reads.ack(second) and reads.unread == 0
    assert first != second and len(first) == 16


def test_an_old_token_acknowledges_only_up_to_its_frame_and_few_are_kept():
    reads = ReadReceipts()
    tokens = []
    for _ in range(12):
        reads.count(10)
        tokens.append(reads.new_token())
        reads.expect(tokens[-1], reads.sent)
    assert not reads.ack(tokens[0])  # forgotten: only the newest eight are kept
    assert reads.ack(tokens[5]) and reads.unread == 60
    assert reads.ack(tokens[11]) and reads.unread == 0


def test_only_the_last_page_carries_the_token_and_pages_stay_under_the_bound():
    entries = [{"id": f"e{i}", "text": "x" * (1000 + i)} for i in range(50)]
    frames = snapshot_frames("w1", "s1", 7, entries, 10_000, ack="T" * 16)
    pages = [json.loads(f) for f in frames]
    assert len(pages) > 5 and all(len(f.encode()) <= 10_000 for f in frames)
    assert [p.get("ack") for p in pages] == [None] * (len(pages) - 1) + ["T" * 16]
    assert [e for p in pages for e in p["entries"]] == entries


@pytest.mark.parametrize(
    ("snapshot", "version", "empty", "held", "unchanged"),
    [
        (5, 5, False, 5, True),  # nothing since the snapshot
        (5, 6, False, 6, False),  # an update went out since: the client may have a gap
        (5, 5, False, 6, False),  # Valkey moved on
        (5, 5, False, 4, False),  # Valkey lost data
        (5, 6, False, 5, False),  # Valkey lost the update the socket was sent since
        (5, 5, True, None, True),  # the session is gone and the socket shows it empty
        (5, 5, False, None, False),  # the session is gone, the socket shows entries
        (None, None, False, None, False),  # no snapshot yet
    ],
)
def test_a_snapshot_that_would_repeat_the_last(snapshot, version, empty, held, unchanged):
    state = SocketState()
    if snapshot is not None:
        state.sent_snapshot(snapshot, empty)
        state.version = version
    assert state.unchanged_since_snapshot(held) is unchanged


# -- the consumer on a real channel layer ---------------------------------------------------


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    outbox = {"ACCESS_POLICY": POLICY, "WS_CHECK_INTERVAL": 0.3, "WS_RESYNC_INTERVAL": 0.1}
    with override_settings(CHANNEL_LAYERS=config, OUTBOX=outbox):
        yield


def communicator():
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), "/ws/outbox/workspaces/alice/sessions/s1/"
    )
    comm.scope["user"] = SimpleNamespace(
        is_authenticated=True, is_active=True, is_staff=False, username="alice"
    )
    return comm


async def snapshot(comm) -> list[dict]:
    """Read one whole snapshot (its pages)."""
    pages = [json.loads(await comm.receive_from(5))]
    while pages[-1]["type"] == "queue.snapshot" and pages[-1]["page"] < pages[-1]["pages"]:
        pages.append(json.loads(await comm.receive_from(5)))
    return pages


async def ack(comm, frame: dict) -> None:
    await comm.send_to(text_data=json.dumps({"type": "ack", "ack": frame["ack"]}))


async def finish(comm):
    await comm.disconnect()
    await get_outbox().aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()


async def test_a_resync_waits_for_the_last_snapshot_to_be_acknowledged(layers):
    """Nine full prompts make a snapshot over WS_MAX_FRAME_BYTES: a resync before it is
    acknowledged sends nothing; the acknowledgement lets the resync's snapshot go."""
    for i in range(9):
        await aaccept(get_outbox(), f"k{i}", "x" * FULL, ws="alice")
    comm = communicator()
    await comm.connect()
    first = await snapshot(comm)
    assert "ack" in first[-1] and all("ack" not in p for p in first[:-1])
    last = await aaccept(get_outbox(), "k9", "y", ws="alice")
    update = json.loads(await comm.receive_from(5))
    assert update["type"] == "queue.update" and "ack" not in update
    await comm.send_to(text_data='{"type": "resync"}')
    assert await comm.receive_nothing(0.25)  # held: the 900 KB snapshot may be unread
    await ack(comm, first[-1])
    second = await snapshot(comm)
    assert second[0]["type"] == "queue.snapshot" and second[-1]["entries"][-1]["id"] == last.id
    await finish(comm)


async def test_a_resync_of_an_unchanged_version_gets_queue_current(layers):
    await aaccept(get_outbox(), "k1", ws="alice")
    comm = communicator()
    await comm.connect()
    (first,) = await snapshot(comm)
    await comm.send_to(text_data='{"type": "resync"}')
    current = json.loads(await comm.receive_from(5))
    assert current == {
        "type": "queue.current",
        "workspaceID": "alice",
        "sessionID": "s1",
        "version": first["version"],
        "ack": current["ack"],
    }
    await finish(comm)


async def test_a_held_resync_closes_the_socket_with_4408_at_a_check(layers):
    for i in range(9):
        await aaccept(get_outbox(), f"k{i}", "x" * FULL, ws="alice")
    comm = communicator()
    await comm.connect()
    await snapshot(comm)  # read, never acknowledged
    await comm.send_to(text_data='{"type": "resync"}')
    started = time.monotonic()
    closed = await comm.receive_output(5)
    assert closed == {"type": "websocket.close", "code": 4408}
    assert time.monotonic() - started < 2 * 0.3 + 1  # two check intervals, with room
    await finish(comm)


async def test_updates_past_the_unread_bound_close_the_socket_with_4408(layers, monkeypatch):
    monkeypatch.setattr(OutboxConsumer, "MAX_UNREAD_BYTES", 8000)
    comm = communicator()
    await comm.connect()
    await snapshot(comm)
    layer = get_channel_layer()
    update = {"type": "queue.update", "version": 1, "state": "queued", "pad": "z" * 1000}
    for _ in range(12):  # 12 KB of updates, none acknowledged
        await layer.group_send(group_name("alice", "s1"), update)
    frames = []
    while (out := await comm.receive_output(5))["type"] == "websocket.send":
        frames.append(out)
    assert out == {"type": "websocket.close", "code": 4408}
    assert sum(len(f["text"].encode()) for f in frames) <= 8000
    await finish(comm)


async def test_a_reading_client_acknowledges_updates_when_the_check_asks(layers, monkeypatch):
    """Updates alone carry no token: the periodic check sends ``queue.current`` with one
    after updates went out, and a client that echoes it is never closed."""
    monkeypatch.setattr(OutboxConsumer, "MAX_UNREAD_BYTES", 8000)
    comm = communicator()
    await comm.connect()
    (first,) = await snapshot(comm)
    await ack(comm, first)
    layer = get_channel_layer()
    update = {"type": "queue.update", "version": 1, "state": "queued", "pad": "z" * 1000}
    deadline = time.monotonic() + 10
    sent = 0
    while sent < 30 and time.monotonic() < deadline:  # 30 KB in all, acknowledged as asked
        await layer.group_send(group_name("alice", "s1"), update)
        sent += 1
        while True:
            frame = json.loads(await comm.receive_from(5))
            if frame["type"] == "queue.current":
                await ack(comm, frame)
            if frame["type"] == "queue.update":
                break
        if sent % 5 == 0:  # let a check pass
            frame = json.loads(await comm.receive_from(5))
            assert frame["type"] == "queue.current"
            await ack(comm, frame)
    assert sent == 30  # 30 KB went out: far past the bound, and still open
    await comm.send_to(text_data='{"type": "resync"}')
    answer = json.loads(await comm.receive_from(5))
    assert answer["type"] in ("queue.current", "queue.snapshot")
    await finish(comm)


async def test_a_held_resync_does_not_hold_back_the_checks_snapshot(layers, r, monkeypatch):
    """While a requested snapshot waits for an acknowledgement, the periodic check still
    sends the snapshot it finds needed (Valkey ahead of the socket). The clock is frozen,
    so the waiting request never grows old enough to close the socket."""
    monkeypatch.setattr(OutboxConsumer, "clock", staticmethod(lambda: 1000.0))
    for i in range(9):
        await aaccept(get_outbox(), f"k{i}", "x" * FULL, ws="alice")
    comm = communicator()
    await comm.connect()
    first = await snapshot(comm)  # read, never acknowledged
    await comm.send_to(text_data='{"type": "resync"}')
    assert await comm.receive_nothing(0.4)  # held
    version = get_outbox().keys.session("alice", "s1").version
    r.set(version, first[0]["version"] + 5)  # an event the channel layer lost
    second = await snapshot(comm)
    assert {p["version"] for p in second} == {first[0]["version"] + 5}
    await finish(comm)


async def test_the_checks_queue_current_names_the_last_update_sent(layers):
    """The ``queue.current`` a check sends after updates says the socket was sent
    everything up to the newest update's version, not the older snapshot's."""
    await aaccept(get_outbox(), "k1", ws="alice")
    comm = communicator()
    await comm.connect()
    (first,) = await snapshot(comm)
    await ack(comm, first)
    await aaccept(get_outbox(), "k2", ws="alice")
    update = json.loads(await comm.receive_from(5))
    assert update["type"] == "queue.update" and update["version"] > first["version"]
    current = json.loads(await comm.receive_from(5))  # the next check (0.3 s) asks
    assert current["type"] == "queue.current"
    assert current["version"] == update["version"]
    await finish(comm)
