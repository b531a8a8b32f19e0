"""The consumer calls the scope's ``outbox_revalidate`` at every resync and periodic check
(docs/explanation/security.md#live-connections), in process on a real Valkey and a real
channels-redis layer. Through uvicorn and daphne with the documented token middleware:
tests/django/ws/test_revocation_on_servers.py."""

from __future__ import annotations

import asyncio
import json
import logging
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import redis_channel_layers

POLICY = "tests.support.policies.own_workspace"
ALICE = SimpleNamespace(
    is_authenticated=True, is_active=True, is_staff=False, username="alice", pk="alice"
)


def layers_on(url):
    return redis_channel_layers(url, expiry=10)


def communicator():
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), "/ws/outbox/workspaces/alice/sessions/s1/"
    )
    comm.scope["user"] = ALICE
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
    await layer.flush()
    await layer.close_pools()


def _settings(valkey, check: float):
    outbox = {"ACCESS_POLICY": POLICY, "WS_CHECK_INTERVAL": check}
    return override_settings(CHANNEL_LAYERS=layers_on(valkey), OUTBOX=outbox)


@pytest.fixture
def layers(valkey):
    """No periodic check within a test: only resyncs ask."""
    with _settings(valkey, 30.0):
        yield


@pytest.fixture
def checking(valkey):
    """A periodic check every 0.2 s."""
    with _settings(valkey, 0.2):
        yield


class Hook:
    """A re-validation hook answering ``answers`` in turn (then the last one again);
    ``calls`` counts them."""

    def __init__(self, *answers, asynchronous=False) -> None:
        self.answers = list(answers)
        self.calls = 0
        if asynchronous:
            self.hook = self.acall

    def _next(self, scope):
        assert scope["path"].startswith("/ws/outbox/")
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def __call__(self, scope):
        return self._next(scope)

    async def acall(self, scope):
        return self._next(scope)


async def opened(hook):
    comm = communicator()
    comm.scope["outbox_revalidate"] = getattr(hook, "hook", hook)
    snapshot = await first(comm)
    assert snapshot["type"] == "queue.snapshot"
    return comm


async def closed_code(comm, timeout=5.0):
    """The close the consumer sends next (failing on any frame before it)."""
    output = await comm.receive_output(timeout)
    assert output["type"] == "websocket.close", output
    return output["code"]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
async def test_a_resync_asks_the_hook_and_false_closes_4403_before_any_snapshot(
    layers, r, asynchronous
):
    hook = Hook(False, asynchronous=asynchronous)
    comm = await opened(hook)
    assert hook.calls == 0  # the middleware has just authenticated: connect does not ask
    await comm.send_to(text_data='{"type": "resync"}')
    assert await closed_code(comm) == 4403
    assert hook.calls == 1
    await comm.wait(1)
    await cleanup()


async def test_every_periodic_check_asks_the_hook(checking, r):
    hook = Hook(True, True, False)
    comm = await opened(hook)
    assert await closed_code(comm, timeout=5.0) == 4403  # the third check
    assert hook.calls == 3
    await comm.wait(1)
    await cleanup()


async def test_a_true_answer_keeps_the_socket_and_its_resyncs(layers, r):
    hook = Hook(True, asynchronous=True)
    comm = await opened(hook)
    await comm.send_to(text_data='{"type": "resync"}')
    frame = json.loads(await comm.receive_from(5))
    assert frame["type"] in ("queue.snapshot", "queue.current")  # answered, not closed
    assert hook.calls >= 1
    await comm.disconnect()
    await cleanup()


async def test_a_hook_that_raises_closes_4503_and_logs_redacted(layers, r, caplog):
    hook = Hook(RuntimeError("token store at redis://u:hunter22@db:6379 is down"))
    comm = await opened(hook)
    caplog.set_level(logging.WARNING, logger="django_outbox.consumers")
    await comm.send_to(text_data='{"type": "resync"}')
    assert await closed_code(comm) == 4503  # the client reconnects and authenticates afresh
    assert "outbox_revalidate raised RuntimeError" in caplog.text
    assert "hunter22" not in caplog.text
    await comm.wait(1)
    await cleanup()


@pytest.mark.parametrize("answer", ["yes", 1, None], ids=["text", "one", "none"])
async def test_an_answer_that_is_not_a_bool_refuses(layers, r, caplog, answer):
    comm = await opened(Hook(answer))
    await comm.send_to(text_data='{"type": "resync"}')
    assert await closed_code(comm) == 4403
    assert "not a bool" in caplog.text
    await comm.wait(1)
    await cleanup()


async def test_a_sync_hook_returning_a_coroutine_refuses_and_leaks_nothing(layers, r, caplog):
    async def verdict():
        return True

    comm = await opened(Hook(verdict()))
    await comm.send_to(text_data='{"type": "resync"}')
    assert await closed_code(comm) == 4403
    await asyncio.sleep(0)
    await comm.wait(1)
    await cleanup()
