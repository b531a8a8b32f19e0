"""A queue socket whose application task is cancelled ends whole, in process: an ASGI
server cancels it at shutdown or when a connection drops without a disconnect message,
and nothing of the socket (its periodic check above all, and its channel-layer receive)
may run on after it (docs/howto/deploy.md#stopping-the-server). Real channels-redis
layer, real Valkey; the same on real servers: tests/django/ws/test_shutdown_on_servers.py."""

from __future__ import annotations

import asyncio
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
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, redis_channel_layers

POLICY = "tests.support.policies.own_workspace"
CHECK_INTERVAL = 0.2


@pytest.fixture
def layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    outbox = {"ACCESS_POLICY": POLICY, "WS_CHECK_INTERVAL": CHECK_INTERVAL}
    with override_settings(CHANNEL_LAYERS=config, OUTBOX=outbox):
        yield


def communicator(workspace: str = "alice"):
    """A socket of alice's on ``workspace``'s session s1 (another workspace: refused 4403)."""
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), f"/ws/outbox/workspaces/{workspace}/sessions/s1/"
    )
    comm.scope["user"] = SimpleNamespace(
        is_authenticated=True, is_active=True, is_staff=False, username="alice"
    )
    return comm


def socket_checks() -> list[asyncio.Task]:
    """The running periodic checks of queue sockets in this event loop."""
    return [
        t
        for t in asyncio.all_tasks()
        if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "OutboxConsumer._checks"
    ]


async def ended_within(seconds: float) -> bool:
    """Whether every socket check has ended within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while socket_checks():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def tidy() -> None:
    await get_outbox().aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()


async def connected() -> WebsocketCommunicator:
    await aaccept(get_outbox(), "k1", ws="alice")
    comm = communicator()
    connected, _ = await comm.connect()
    assert connected
    assert json.loads(await comm.receive_from(5))["type"] == "queue.snapshot"
    deadline = time.monotonic() + 5
    while not socket_checks():
        assert time.monotonic() < deadline, "the socket's periodic check never started"
        await asyncio.sleep(0.02)
    return comm


async def test_a_cancelled_socket_stops_its_periodic_check(layers):
    """The server cancels the application task (no disconnect message): the socket's
    check ends with it instead of re-joining its group and refreshing its counts on."""
    comm = await connected()
    comm.future.cancel()
    with pytest.raises(asyncio.CancelledError):
        await comm.future
    try:
        assert await ended_within(3 * CHECK_INTERVAL + 1)
    finally:
        for task in socket_checks():
            task.cancel()
        await tidy()


async def test_a_check_ends_even_when_its_cancellation_was_swallowed(layers, monkeypatch):
    """A library that swallows the cancellation (Python 3.11's wait_for inside redis-py's
    send returns a result that arrived with the cancel) must not leave the check looping:
    it ends at its next turn."""
    entered = asyncio.Event()

    async def swallowing_check(self, grace=0.0):
        entered.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # what the race in wait_for amounts to

    monkeypatch.setattr(OutboxConsumer, "check", swallowing_check)
    comm = await connected()
    try:
        await asyncio.wait_for(entered.wait(), 5)
        (task,) = socket_checks()
        task.cancel()
        assert await ended_within(3 * CHECK_INTERVAL + 1)
        assert task.cancelled()
    finally:
        await comm.disconnect()
        await tidy()


async def refused(comm: WebsocketCommunicator) -> None:
    """Connect ``comm`` (bob's workspace: alice may not see it): accepted, then closed 4403."""
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_output(5)) == {"type": "websocket.close", "code": 4403}


async def ended(comm: WebsocketCommunicator) -> None:
    """Tell the application its socket is gone; it must end at once, without an error."""
    await comm.send_input({"type": "websocket.disconnect", "code": 4403})
    done, _ = await asyncio.wait({comm.future}, timeout=3)
    assert done, "the socket's application did not end"
    assert comm.future.exception() is None


async def test_a_receive_whose_cancellation_the_layer_swallows_still_ends_with_its_socket(
    layers, monkeypatch
):
    """A server slow to exit after refused sockets: channels-redis's receive can lose a
    cancellation (one arriving while
    redis-py's ``wait_for`` sends a command, on Python 3.11: a refused socket's receive is
    cancelled right as it sends its first ones) and then waits on for a message that never
    comes; channels awaits that receive when the socket ends, so the application did not
    end, and uvicorn's exit waited for it. The socket ends at once, and the receive too."""
    layer = get_channel_layer()
    receiving, receive_ended = asyncio.Event(), asyncio.Event()

    async def swallowing_receive(channel):
        receiving.set()
        swallowed = False
        try:
            while True:
                try:
                    await asyncio.sleep(30)  # a BZPOPMIN that gets nothing
                except asyncio.CancelledError:
                    if swallowed:
                        raise
                    swallowed = True  # what the race in wait_for amounts to
        finally:
            receive_ended.set()

    monkeypatch.setattr(layer, "receive", swallowing_receive)
    comm = communicator("bob")
    try:
        await refused(comm)
        await asyncio.wait_for(receiving.wait(), 5)
        await ended(comm)
        await asyncio.wait_for(receive_ended.wait(), 3)
    finally:
        comm.future.cancel()
        await tidy()


async def test_a_receive_failing_once_the_socket_is_closing_is_neither_retried_nor_raised(
    layers, monkeypatch
):
    """Closing, a socket waits for its end instead of retrying a failed receive (the layer
    gone with a server that stops); raised, the failure would end the application with
    "Exception in ASGI application" in the server's log."""
    layer = get_channel_layer()
    calls = 0
    fail = asyncio.Event()

    async def failing_receive(channel):
        nonlocal calls
        calls += 1
        await fail.wait()
        raise ConnectionError("the channel layer is gone")

    monkeypatch.setattr(layer, "receive", failing_receive)
    monkeypatch.setattr(OutboxConsumer, "LAYER_RETRY_DELAY", 0.0)
    comm = communicator("bob")
    try:
        await refused(comm)  # closing from here on
        fail.set()
        done, _ = await asyncio.wait({comm.future}, timeout=0.5)
        assert not done, "the application ended with the receive's failure"
        assert calls == 1, "the failed receive was retried"
        await ended(comm)
    finally:
        comm.future.cancel()
        await tidy()
