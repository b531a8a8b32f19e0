"""The queue WebSocket on a real channels-redis layer (README "Live updates (WebSocket)")."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.apps import apps
from django.test import override_settings

from django_outbox.outbox import EventListener, Outbox, get_outbox
from django_outbox.ws import publish
from django_outbox.ws.publish import group_name
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, redis_channel_layers
from tests.support.paths import ROOT

STAFF = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=True, username="staff")
ALICE = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")
ANONYMOUS = SimpleNamespace(is_authenticated=False, is_active=False, is_staff=False, username="")
POLICY = "tests.support.policies.own_workspace"


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    with override_settings(CHANNEL_LAYERS=config, OUTBOX={"ACCESS_POLICY": POLICY}):
        yield config


def communicator(ws="alice", ses="s1", user=ALICE):
    app = URLRouter(websocket_urlpatterns)
    comm = WebsocketCommunicator(app, f"/ws/outbox/workspaces/{ws}/sessions/{ses}/")
    comm.scope["user"] = user
    return comm


async def receive(comm, timeout=5):
    return json.loads(await comm.receive_from(timeout))


async def close_all(*comms):
    for comm in comms:
        await comm.disconnect()
    await get_outbox().aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()


def watch(outbox, ws, ses):
    """Count a watcher by hand (what the consumer does on connect)."""
    import redis

    client = redis.Redis.from_url(outbox.url)
    client.set(outbox.keys.session(ws, ses).watch, 1)
    client.close()


async def test_snapshot_then_ordered_updates(layers):
    await aaccept(get_outbox(), "k0", ws="alice")
    comm = communicator()
    connected, _ = await comm.connect()
    assert connected
    snap = await receive(comm)
    assert snap["type"] == "queue.snapshot" and [e["text"] for e in snap["entries"]] == ["k0"]
    for i in range(1, 4):
        await aaccept(get_outbox(), f"k{i}", ws="alice")
    updates = [await receive(comm) for _ in range(3)]
    assert [u["type"] for u in updates] == ["queue.update"] * 3
    assert [u["state"] for u in updates] == ["queued"] * 3
    versions = [u["version"] for u in updates]
    assert versions == sorted(versions) and versions[0] > snap["version"]
    assert updates[0]["entry"]["clientMessageID"] == "k1"
    assert updates[0]["workspaceID"] == "alice" and updates[0]["sessionID"] == "s1"
    await close_all(comm)


async def test_resync_answers_a_fresh_snapshot(layers):
    comm = communicator()
    await comm.connect()
    await receive(comm)
    await aaccept(get_outbox(), "k1", ws="alice")
    await receive(comm)
    await comm.send_to(text_data=json.dumps({"type": "resync"}))
    snap = await receive(comm)
    listed = await get_outbox().asnapshot("alice", "s1")
    assert snap["type"] == "queue.snapshot" and snap["version"] == listed.version
    assert [e["id"] for e in snap["entries"]] == [e.id for e in listed.entries]
    await close_all(comm)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("not json", "malformed"),
        ("[1, 2]", "unknown_type"),
        ('{"type": "hello"}', "unknown_type"),
        ("{}", "unknown_type"),
    ],
)
async def test_bad_frames_get_an_error_and_the_socket_stays_up(layers, frame, code):
    comm = communicator()
    await comm.connect()
    await receive(comm)
    await comm.send_to(text_data=frame)
    error = await receive(comm)
    assert error["type"] == "error" and error["code"] == code
    await comm.send_to(text_data='{"type": "resync"}')
    assert (await receive(comm))["type"] == "queue.current"  # answered: nothing changed
    await close_all(comm)


async def test_binary_and_oversized_frames_close_only_that_socket(layers):
    binary, big, other = communicator(), communicator(), communicator()
    for comm in (binary, big, other):
        await comm.connect()
        await receive(comm)
    await binary.send_to(bytes_data=b"\x00\x01")
    assert (await binary.receive_output(5)) == {"type": "websocket.close", "code": 1003}
    await big.send_to(text_data="x" * (2 * 1024 * 1024))
    assert (await big.receive_output(5)) == {"type": "websocket.close", "code": 1009}
    await aaccept(get_outbox(), "k1", ws="alice")
    assert (await receive(other))["type"] == "queue.update"
    await close_all(other)


async def test_a_frame_of_exactly_the_bound_is_read_and_one_byte_more_closes_1009(layers):
    """The client frame bound is MAX_FRAME_BYTES bytes of UTF-8, inclusive: a resync padded
    to exactly the bound is answered, the same frame one byte longer closes with 1009."""
    from django_outbox.ws.consumer import MAX_FRAME_BYTES

    head, tail = '{"type": "resync"', "}"
    at_bound = head + " " * (MAX_FRAME_BYTES - len(head) - len(tail)) + tail
    assert len(at_bound.encode()) == MAX_FRAME_BYTES
    fits, over = communicator(), communicator()
    for comm in (fits, over):
        await comm.connect()
        await receive(comm)
    await fits.send_to(text_data=at_bound)
    assert (await receive(fits))["type"] == "queue.current"  # read and answered
    await over.send_to(text_data=at_bound[:-1] + " }")
    assert (await over.receive_output(5)) == {"type": "websocket.close", "code": 1009}
    await close_all(fits)


async def test_the_frame_bound_counts_utf8_bytes_not_characters(layers):
    """MAX_FRAME_BYTES bounds a client frame's UTF-8 bytes: a resync whose characters are
    under the bound but whose two-byte letters take it over closes with 1009
    (docs/reference/websocket.md)."""
    from django_outbox.ws.consumer import MAX_FRAME_BYTES

    frame = '{"type": "resync", "pad": "' + "\u00e9" * (MAX_FRAME_BYTES // 2 + 16) + '"}'
    assert len(frame) < MAX_FRAME_BYTES < len(frame.encode())
    comm = communicator()
    await comm.connect()
    await receive(comm)
    await comm.send_to(text_data=frame)
    assert (await comm.receive_output(5)) == {"type": "websocket.close", "code": 1009}
    await close_all()


async def refused_with(comm) -> int | None:
    """Connect; the close code if the socket is accepted and then closed at once (a
    refusal as a real server carries it), else None."""
    connected, _ = await comm.connect()
    assert connected  # accepted: a close before accepting would be an HTTP 403 on the wire
    first = await comm.receive_output(5)
    return first["code"] if first["type"] == "websocket.close" else None


@pytest.mark.parametrize(
    ("ws", "ses", "user", "code"),
    [
        ("bob", "s1", ALICE, 4403),  # another user's workspace
        ("alice", "s1", ANONYMOUS, 4403),
        ("alice", "a:b", ALICE, 4400),  # would alias keys
        ("alice", "x" * 200, ALICE, 4400),  # too long for the allow-list (and a group name)
        ("alice", "-x", ALICE, 4400),
    ],
)
async def test_refused_handshakes(layers, ws, ses, user, code):
    comm = communicator(ws, ses, user)
    assert await refused_with(comm) == code
    assert await comm.receive_nothing()  # no frame before or after the close
    await close_all()


async def test_no_user_in_scope_is_refused(layers):
    comm = communicator()
    del comm.scope["user"]
    assert await refused_with(comm) == 4403
    await close_all()


async def test_disconnect_discards_the_group(layers, r):
    comm = communicator()
    await comm.connect()
    await receive(comm)
    group_keys = [k for k in r.keys("asgi:group:*")]
    assert len(group_keys) == 1 and r.zcard(group_keys[0]) == 1
    await comm.disconnect()
    assert r.zcard(group_keys[0]) == 0
    await close_all()


def test_the_old_routing_module_gives_the_same_routes():
    """README's and users' asgi.py import django_outbox.routing; it re-exports ws.routing."""
    from django_outbox import routing

    assert routing.websocket_urlpatterns is websocket_urlpatterns


@pytest.mark.parametrize(
    "module",
    [
        "django_outbox.routing",
        "django_outbox.ws.routing",
        "django_outbox.ws.consumer",
        "django_outbox.ws.publish",
    ],
)
def test_each_websocket_module_imports_first_in_a_fresh_interpreter(module):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
    }
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()


def test_group_names_are_short_and_safe():
    name = group_name("w" * 128, "s" * 128)
    assert len(name) < 100 and all(c.isalnum() or c in "._-" for c in name)
    assert group_name("a", "b:c") != group_name("a:b", "c")


async def test_slow_reader_sees_a_gap_and_resyncs(valkey):
    # channel capacity 5; a reader that stops reading while 10 messages are
    # accepted and delivered (30 events) loses events, sees the gap, and resyncs.
    config = redis_channel_layers(valkey, capacity=5, expiry=10)
    with override_settings(CHANNEL_LAYERS=config, OUTBOX={"ACCESS_POLICY": POLICY}):
        layer = get_channel_layer()
        stalled = await layer.new_channel()  # a consumer that is not reading
        outbox = get_outbox()
        watch(outbox, "alice", "s1")
        await layer.group_add(group_name("alice", "s1"), stalled)

        async def deliver(entry, **kwargs):
            return None

        entries = [await aaccept(get_outbox(), f"k{i}", ws="alice") for i in range(10)]
        start = entries[0].seq - 1  # the version before the first accept
        while await outbox.adeliver_once("alice", "s1", deliver):
            pass
        final = await outbox.asnapshot("alice", "s1")
        assert final.version - start == 30  # 10 accepts, 10 stagings, 10 sends
        versions = []
        while True:
            try:
                message = await asyncio.wait_for(layer.receive(stalled), 0.3)
            except TimeoutError:
                break
            versions.append(message["version"])
        assert 0 < len(versions) <= 5 and versions[-1] < final.version  # a gap
        comm = communicator()
        await comm.connect()
        snap = await receive(comm)
        assert snap["version"] == final.version and snap["entries"] == []
        await comm.send_to(text_data='{"type": "resync"}')
        assert (await receive(comm))["version"] == final.version
        await close_all(comm)


async def test_a_failed_publish_never_fails_the_mutation(valkey, caplog):
    # the channel layer's Valkey is unreachable; accepts still answer
    config = redis_channel_layers("redis://127.0.0.1:1/0")
    with override_settings(CHANNEL_LAYERS=config):
        watch(get_outbox(), "w1", "s1")
        before = publish.stats.failed
        entry = await aaccept(get_outbox(), "k1")
        assert entry.status == "pending"
        assert publish.stats.failed == before + 1
        assert "could not publish" in caplog.text
        await get_outbox().aclose()


@pytest.mark.parametrize(
    ("configured", "logged_as"),
    [(None, "django_outbox.ws"), ("django_outbox.events", "django_outbox.events")],
)
async def test_the_publisher_logs_as_django_outbox_ws_or_under_its_old_name_if_configured(
    valkey, caplog, configured, logged_as
):
    # A logging config that still names the 0.1.0 logger keeps getting its records.
    config = redis_channel_layers("redis://127.0.0.1:1/0")
    with override_settings(CHANNEL_LAYERS=config), caplog.at_level(logging.INFO, configured):
        watch(get_outbox(), "w1", "s1")
        await aaccept(get_outbox(), "k1")
        await get_outbox().aclose()
    (record,) = [r for r in caplog.records if "could not publish" in r.getMessage()]
    assert record.name == logged_as


def test_the_publisher_is_subscribed_once_when_the_app_is_ready():
    apps.get_app_config("django_outbox").ready()  # a second time changes nothing
    subscribed = EventListener(publish.publish, publish.apublish)
    assert Outbox.event_listeners.count(subscribed) == 1


def test_sync_mutations_publish_too(valkey, r):
    config = redis_channel_layers(valkey)
    with override_settings(CHANNEL_LAYERS=config):
        before = publish.stats.published
        get_outbox().accept("w1", "s1", user_id="u", client_message_id="k0", text="t")
        assert publish.stats.published == before  # nobody watches: nothing to publish
        watch(get_outbox(), "w1", "s1")
        get_outbox().accept("w1", "s1", user_id="u", client_message_id="k", text="t")
        assert publish.stats.published == before + 1


async def test_clients_are_counted_while_connected(layers, r):
    key = get_outbox().keys.session("alice", "s1").watch
    one, two = communicator(), communicator()
    await one.connect()
    await receive(one)
    await two.connect()
    await receive(two)
    assert r.get(key) == "2" and 0 < r.ttl(key) <= 24 * 3600
    await one.disconnect()
    assert r.get(key) == "1"
    await two.disconnect()
    assert r.get(key) is None
    await close_all()


async def test_a_worker_process_delivery_reaches_the_socket(layers, valkey):
    comm = communicator()
    await comm.connect()
    await receive(comm)
    entry = await aaccept(get_outbox(), "k1", ws="alice")
    assert (await receive(comm))["state"] == "queued"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": valkey,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.worker",
        "OUTBOX_TEST_CHANNEL_LAYER": valkey,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "django",
        "outbox_worker",
        "--once",
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert await asyncio.wait_for(proc.wait(), 60) == 0
    states = [(await receive(comm, timeout=10)) for _ in range(2)]
    assert [s["state"] for s in states] == ["delivering", "sent"]
    assert states[1]["entry"]["id"] == entry.id
    await close_all(comm)


async def test_nothing_is_relayed_once_a_close_is_decided(layers):
    # Between the close frame and the server's disconnect the socket is still in its
    # session's group: an update published then is not sent after the close
    # (docs/reference/websocket.md#close-codes).
    outbox_settings = {"ACCESS_POLICY": POLICY, "WS_RESYNC_BUDGET": 1, "WS_RESYNC_INTERVAL": 0.01}
    with override_settings(OUTBOX=outbox_settings):
        comm = communicator()
        connected, _ = await comm.connect()
        assert connected
        assert (await receive(comm))["type"] == "queue.snapshot"
        await comm.send_to(text_data=json.dumps({"type": "resync"}))
        assert (await receive(comm))["type"] == "queue.current"  # nothing changed since
        await comm.send_to(text_data=json.dumps({"type": "resync"}))  # past the budget
        assert await comm.receive_output(5) == {
            "type": "websocket.close",
            "code": 4429,
            "reason": "too many resyncs",
        }
        other = communicator(ses="s1")  # an open socket on the same session's group
        await other.connect()
        assert (await receive(other))["type"] == "queue.snapshot"
        await aaccept(get_outbox(), "after-the-close", ws="alice")
        update = await receive(other)  # the update reached the group...
        assert (update["type"], update["entry"]["text"]) == ("queue.update", "after-the-close")
        assert await comm.receive_nothing(timeout=1)  # ...but not the closing socket
        await close_all(comm, other)
