"""The consumer's refusal paths and robustness in process, on a real Valkey and a real
channels-redis layer (README "Live updates (WebSocket)"). The same codes
through uvicorn and daphne: tests/django/ws/test_refusals_on_servers.py."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox, reset_outbox
from django_outbox.ws.consumer import socket_ttl, socket_user_id
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import redis_channel_layers
from tests.support.valkey import ValkeyProcess
from tests.support.ws_session import origin_refusal_line

POLICY = "tests.support.policies.own_workspace"


def user(name="alice", pk="alice", authenticated=True):
    return SimpleNamespace(
        is_authenticated=authenticated, is_active=True, is_staff=False, username=name, pk=pk
    )


def layers_on(url):
    return redis_channel_layers(url, expiry=10)


def communicator(ws="alice", ses="s1", who=None):
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{ws}/sessions/{ses}/"
    )
    comm.scope["user"] = who if who is not None else user()
    return comm


async def first(comm):
    """The first thing the consumer sends after accepting (a frame as JSON, or the close)."""
    connected, _ = await comm.connect()
    assert connected
    output = await comm.receive_output(5)
    if output["type"] == "websocket.close":
        return output
    return json.loads(output["text"])


async def cleanup():
    await get_outbox().aclose()
    layer = get_channel_layer()
    if layer is not None:
        await layer.flush()
        await layer.close_pools()


@pytest.fixture
def layers(valkey):
    with override_settings(CHANNEL_LAYERS=layers_on(valkey), OUTBOX={"ACCESS_POLICY": POLICY}):
        yield


async def test_a_deeply_nested_frame_gets_an_error_and_the_socket_stays(layers, r):
    watch = get_outbox().keys.session("alice", "s1").watch
    comm = communicator()
    assert (await first(comm))["type"] == "queue.snapshot"
    assert r.get(watch) == "1"
    for frame in ("[" * 50_000, '{"a":' * 12_000):  # json.loads raises RecursionError
        await comm.send_to(text_data=frame)
        error = json.loads(await comm.receive_from(5))
        assert (error["type"], error["code"]) == ("error", "malformed")
    await comm.send_to(text_data='{"type": "resync"}')
    assert json.loads(await comm.receive_from(5))["type"] == "queue.current"  # nothing new
    await comm.disconnect()
    assert r.get(watch) is None
    assert r.zcard(get_outbox().keys.sockets("alice")) == 0
    await cleanup()


async def test_any_failure_while_handling_a_frame_keeps_the_socket_and_the_counts(
    layers, r, monkeypatch, caplog
):
    """Not only RecursionError: whatever a handler raises answers an error frame, and the
    watcher is uncounted when the socket closes."""
    from django_outbox.ws.consumer import OutboxConsumer

    async def broken(self, fresh):
        raise RuntimeError("policy backend exploded at 10.0.0.7:5432")

    comm = communicator()
    assert (await first(comm))["type"] == "queue.snapshot"
    monkeypatch.setattr(OutboxConsumer, "_allowed", broken)
    await comm.send_to(text_data='{"type": "resync"}')
    error = json.loads(await comm.receive_from(5))
    assert (error["type"], error["code"]) == ("error", "internal")
    assert "10.0.0.7" not in error["detail"]
    assert "policy backend exploded" in caplog.text  # the cause is in the log
    await comm.disconnect()
    assert r.get(get_outbox().keys.session("alice", "s1").watch) is None
    await cleanup()


async def test_an_unavailable_snapshot_names_no_server(valkey, tmp_path, caplog):
    """The error frame is a fixed text; the cause (host and port of
    Valkey) goes to the server's log only."""
    store = ValkeyProcess(tmp_path / "store").start()
    try:
        with override_settings(
            CHANNEL_LAYERS=layers_on(valkey),
            OUTBOX={"ACCESS_POLICY": POLICY, "VALKEY_URL": store.url},
        ):
            reset_outbox()
            comm = communicator()
            assert (await first(comm))["type"] == "queue.snapshot"
            store.stop()
            await comm.send_to(text_data='{"type": "resync"}')
            error = json.loads(await comm.receive_from(30))
            assert (error["type"], error["code"]) == ("error", "unavailable")
            assert str(store.port) not in error["detail"] and "127.0.0.1" not in error["detail"]
            assert str(store.port) in caplog.text
            await comm.disconnect()  # uncounting fails (Valkey is down): logged, no crash
            await cleanup()
    finally:
        store.stop()
        reset_outbox()


async def test_valkey_down_on_connect_closes_4503_after_accepting(valkey, tmp_path, caplog):
    store = ValkeyProcess(tmp_path / "store").start()
    store.stop()
    with override_settings(
        CHANNEL_LAYERS=layers_on(valkey),
        OUTBOX={"ACCESS_POLICY": POLICY, "VALKEY_URL": store.url},
    ):
        reset_outbox()
        try:
            comm = communicator()
            assert await first(comm) == {"type": "websocket.close", "code": 4503}
            assert "closed with 4503" in caplog.text
            await comm.disconnect()
            await cleanup()
        finally:
            reset_outbox()


async def test_no_channel_layer_closes_4500_and_logs_why(valkey, r, caplog):
    with override_settings(CHANNEL_LAYERS={}, OUTBOX={"ACCESS_POLICY": POLICY}):
        comm = communicator()
        with caplog.at_level(logging.ERROR, "django_outbox.consumers"):
            assert await first(comm) == {"type": "websocket.close", "code": 4500}
        assert "CHANNEL_LAYERS is missing" in caplog.text
        await comm.disconnect()
        assert r.get(get_outbox().keys.session("alice", "s1").watch) is None
        await get_outbox().aclose()


async def test_the_socket_bound_is_per_user_and_frees_on_close(valkey, r):
    config = {"ACCESS_POLICY": POLICY, "WS_MAX_SOCKETS_PER_USER": 2}
    with override_settings(CHANNEL_LAYERS=layers_on(valkey), OUTBOX=config):
        key = get_outbox().keys.sockets("alice")
        one, two, three = communicator(), communicator(ses="s2"), communicator(ses="s3")
        assert (await first(one))["type"] == "queue.snapshot"
        assert (await first(two))["type"] == "queue.snapshot"
        assert await first(three) == {"type": "websocket.close", "code": 4429}
        assert await three.receive_nothing()  # no frame before or after the close
        await three.disconnect()
        assert r.get(get_outbox().keys.session("alice", "s3").watch) is None
        # every socket expires on Valkey's clock within socket_ttl()
        assert r.zcard(key) == 2 and 0 < r.pttl(key) <= socket_ttl() * 1000
        await one.disconnect()
        assert r.zcard(key) == 1
        four = communicator(ses="s3")
        assert (await first(four))["type"] == "queue.snapshot"
        for comm in (two, four):
            await comm.disconnect()
        assert r.exists(key) == 0
        await cleanup()


async def test_the_socket_bound_zero_is_off(valkey, r):
    config = {"ACCESS_POLICY": POLICY, "WS_MAX_SOCKETS_PER_USER": 0}
    with override_settings(CHANNEL_LAYERS=layers_on(valkey), OUTBOX=config):
        comms = [communicator(ses=f"s{i}") for i in range(21)]  # one over the default
        for comm in comms:
            assert (await first(comm))["type"] == "queue.snapshot"
        assert r.exists(get_outbox().keys.sockets("alice")) == 0
        await asyncio.gather(*(comm.disconnect() for comm in comms))
        await cleanup()


async def test_sockets_of_a_dead_server_expire_and_refresh_keeps_one_counted(valkey, r):
    """The core's counting: a socket nobody refreshes stops counting after its TTL (a
    killed server process never uncounts its sockets); a refreshed one stays."""
    outbox = get_outbox()
    key = outbox.keys.sockets("7")
    assert await outbox.aopen_socket("7", "dead", limit=2, ttl=0.3)
    assert await outbox.aopen_socket("7", "live", limit=2, ttl=0.3)
    assert not await outbox.aopen_socket("7", "third", limit=2, ttl=0.3)
    assert await outbox.aopen_socket("7", "dead", limit=2, ttl=0.3)  # the same one again
    await outbox.arefresh_socket("7", "live", ttl=60)
    deadline = time.monotonic() + 5
    while not await outbox.aopen_socket("7", "third", limit=2, ttl=60):  # until "dead" expires
        assert time.monotonic() < deadline, r.zrange(key, 0, -1, withscores=True)
        await asyncio.sleep(0.05)
    assert set(r.zrange(key, 0, -1)) == {"live", "third"}
    await outbox.aclose_socket("7", "live")
    await outbox.aclose_socket("7", "third")
    assert r.exists(key) == 0
    await outbox.aclose()


async def test_refresh_socket_pushes_the_expiry(layers, r):
    """The method the periodic per-socket check calls."""
    from django_outbox.ws.consumer import OutboxConsumer

    seen = []
    original = OutboxConsumer.connect

    async def connect(self):
        await original(self)
        seen.append(self)

    OutboxConsumer.connect = connect
    try:
        comm = communicator()
        assert (await first(comm))["type"] == "queue.snapshot"
    finally:
        OutboxConsumer.connect = original
    (consumer,) = seen
    key = get_outbox().keys.sockets("alice")
    r.pexpire(key, 5000)
    r.zadd(key, {consumer.socket_id: 1})  # as if it were about to expire
    await consumer.refresh_socket()
    assert r.zscore(key, consumer.socket_id) > 1 and r.pttl(key) > 5000
    await comm.disconnect()
    assert r.exists(key) == 0
    await cleanup()


def test_who_is_counted():
    assert socket_user_id(user(pk=7)) == "7"
    assert socket_user_id(user(authenticated=False)) is None  # anonymous: not bounded
    assert socket_user_id(user(pk=None)) is None
    assert socket_user_id(None) is None


def test_the_setting_is_validated(valkey):
    from django.core.exceptions import ImproperlyConfigured

    from django_outbox.conf import outbox_settings

    for bad in (-1, "20", 2.5, True):
        with override_settings(OUTBOX={"WS_MAX_SOCKETS_PER_USER": bad}):
            with pytest.raises(ImproperlyConfigured, match="WS_MAX_SOCKETS_PER_USER"):
                outbox_settings()
    with override_settings(OUTBOX={"WS_MAX_SOCKETS_PER_USER": None}):
        assert outbox_settings().config.ws_max_sockets_per_user == 0
    with override_settings(OUTBOX={}):
        assert outbox_settings().config.ws_max_sockets_per_user == 20


async def test_a_failure_on_connect_closes_4500_after_accepting(layers, r, monkeypatch, caplog):
    """An access policy that raises is no HTTP 500 on the handshake: accept, close 4500,
    nothing counted."""
    from django_outbox.ws.consumer import OutboxConsumer

    async def broken(self, fresh):
        raise RuntimeError("policy backend exploded")

    monkeypatch.setattr(OutboxConsumer, "_allowed", broken)
    comm = communicator()
    assert await first(comm) == {"type": "websocket.close", "code": 4500}
    assert "policy backend exploded" in caplog.text
    await comm.disconnect()
    assert r.get(get_outbox().keys.session("alice", "s1").watch) is None
    assert r.exists(get_outbox().keys.sockets("alice")) == 0
    await cleanup()


async def test_a_failing_layer_receive_is_retried_not_a_crash(valkey):
    """channels calls the layer's receive outside dispatch: a stale connection there used
    to end the socket with a traceback; it is retried and updates still arrive."""
    layer = {"default": {"BACKEND": "tests.support.flaky_layer.FlakyReceiveLayer", "CONFIG": {}}}
    with override_settings(CHANNEL_LAYERS=layer, OUTBOX={"ACCESS_POLICY": POLICY}):
        comm = communicator()
        assert (await first(comm))["type"] == "queue.snapshot"
        await get_outbox().aaccept("alice", "s1", user_id="u", client_message_id="k", text="t")
        update = json.loads(await comm.receive_from(5))
        assert update["type"] == "queue.update" and update["state"] == "queued"
        await comm.disconnect()
        await get_outbox().aclose()


LONG_PASSWORD = "pw" * 150  # longer than what of an Origin reaches the log


@pytest.mark.parametrize(
    ("origin", "password"),
    [
        ("https://u:pw@evil.example", "pw"),
        ("https://u:pw@evil.example:8443/path?x=1", "pw"),
        (f"https://u:{LONG_PASSWORD}@evil.example", "pwpw"),  # redacted before it is cut
    ],
)
async def test_a_refused_origin_carrying_credentials_is_logged_redacted(origin, password, caplog):
    """A foreign ``Origin`` with a password in it is closed 4403 and logged with the
    password replaced: the log shows where the socket came from, not its secret. A
    password too long to be logged whole is redacted all the same (not cut first, which
    would leave a fragment no pattern recognises)."""
    line = await origin_refusal_line(origin.encode(), caplog)
    assert "u:***@evil.example" in line and "is not allowed" in line
    assert password not in line


@pytest.mark.parametrize("debug", [True, False], ids=["debug", "production"])
@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost:8000", "http://localhost:8000"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("[::1]:8000", "http://[::1]:8000"),
    ],
)
async def test_with_no_allowed_hosts_only_debug_lets_localhost_origins_in(debug, host, origin):
    """``AllowedHostsOriginValidator`` with ``ALLOWED_HOSTS = []`` follows Django: under
    ``DEBUG`` the hosts Django's own host check admits then (localhost, 127.0.0.1 and
    [::1], IPv6 loopback included) reach the application; in production an empty list
    allows no Origin at all, localhost included (docs/howto/deploy.md)."""
    from django_outbox.ws.origin import AllowedHostsOriginValidator

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    with override_settings(DEBUG=debug, ALLOWED_HOSTS=[]):
        validator = AllowedHostsOriginValidator(app)
    comm = WebsocketCommunicator(  # a page of this very server (same scheme, host, port)
        validator, "/ws/x/", headers=[(b"origin", origin.encode()), (b"host", host.encode())]
    )
    connected, _ = await comm.connect()
    assert connected  # accepted either way; a refusal is closed at once with 4403
    closed = await comm.receive_output(5)
    assert closed == {"type": "websocket.close", "code": 1000 if debug else 4403}
    await comm.disconnect()


@pytest.mark.parametrize(("interval", "ttl"), [(1.0, 60.0), (20.0, 60.0), (30.0, 90.0)])
async def test_a_socket_stays_counted_for_three_checks_and_at_least_a_minute(
    valkey, r, interval, ttl
):
    """A socket's entry in its user's count lives three ``WS_CHECK_INTERVAL`` (each check
    refreshes it, so one missed refresh never frees a slot) and never less than a minute:
    read on Valkey's clock after a real connect."""
    config = {"ACCESS_POLICY": POLICY, "WS_MAX_SOCKETS_PER_USER": 2, "WS_CHECK_INTERVAL": interval}
    with override_settings(CHANNEL_LAYERS=layers_on(valkey), OUTBOX=config):
        assert socket_ttl() == ttl
        comm = communicator()
        assert (await first(comm))["type"] == "queue.snapshot"
        pttl = r.pttl(get_outbox().keys.sockets("alice"))
        assert ttl * 1000 - 5000 < pttl <= ttl * 1000
        await comm.disconnect()
        await cleanup()
