"""The queue WebSocket's refusals and limits through real servers, uvicorn and daphne
(README "Live updates (WebSocket)").

A close before the handshake is accepted is an HTTP 403 on the wire (the client sees
1006), so every refusal accepts and then closes with its code: these tests read the codes
with the ``websockets`` client from ``tests/support/asgi/refusals.py`` served by each server.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from django_outbox.core.keys import KeySpace
from tests.support.refusals_server import MAX_SOCKETS, asgi_server, open_sockets, path
from tests.support.valkey import ValkeyProcess, wait_until

pytestmark = pytest.mark.slow
KINDS = ("uvicorn", "daphne")
DEFAULT = object()


@pytest.fixture(scope="module")
def servers(valkey, tmp_path_factory):
    """Both servers on the suite's Valkey: ``{kind: (address, log path)}``."""
    tmp = tmp_path_factory.mktemp("ws-wire")
    with (
        asgi_server("uvicorn", valkey, tmp / "uvicorn.log") as uvicorn,
        asgi_server("daphne", valkey, tmp / "daphne.log") as daphne,
    ):
        yield {"uvicorn": (uvicorn, tmp / "uvicorn.log"), "daphne": (daphne, tmp / "daphne.log")}


async def outcome(address, route, *, origin=DEFAULT, user=None, frames=()):
    """Open a socket, send ``frames``; answer what came back first: ``("frame", json)``,
    ``("close", code)`` or ``("http", status)`` (a refused handshake)."""
    origin = f"http://{address}" if origin is DEFAULT else origin
    headers = {"Cookie": f"user={user}"} if user else None
    try:
        async with connect(
            f"ws://{address}{route}", origin=origin, additional_headers=headers, open_timeout=10
        ) as ws:
            for frame in frames:
                await ws.send(frame)
            try:
                return "frame", json.loads(await asyncio.wait_for(ws.recv(), 10))
            except ConnectionClosed as exc:
                return "close", exc.rcvd.code if exc.rcvd else None
    except InvalidStatus as exc:
        return "http", exc.response.status_code


def watchers(valkey: str, ws: str = "alice", ses: str = "s1") -> str | None:
    client = redis.Redis.from_url(valkey, decode_responses=True)
    try:
        return client.get(KeySpace().session(ws, ses).watch)
    finally:
        client.close()


@pytest.mark.parametrize("kind", KINDS)
async def test_refusals_reach_the_client_as_close_codes(servers, kind, valkey):
    address, _ = servers[kind]
    assert await outcome(address, path("bob")) == ("close", 4403)  # the policy refuses
    assert await outcome(address, path("alice", "-x")) == ("close", 4400)
    assert await outcome(address, path("alice", "a:b")) == ("close", 4400)
    kind_, frame = await outcome(address, path())
    assert kind_ == "frame" and frame["type"] == "queue.snapshot"
    wait_until(lambda: watchers(valkey) is None, 10, message="no watcher left")
    wait_until(lambda: open_sockets(valkey) == 0, 10, message="no socket counted")


@pytest.mark.parametrize("kind", KINDS)
async def test_origin_refusals_are_logged_and_closed_4403(servers, kind):
    address, log = servers[kind]
    assert await outcome(address, path(), origin=None) == ("close", 4403)
    wait_until(lambda: "no Origin header" in log.read_text(), 10, message="the log line")
    foreign = "http://evil.example:8443"
    assert await outcome(address, path(), origin=foreign) == ("close", 4403)
    wait_until(lambda: f"Origin '{foreign}' is not allowed" in log.read_text(), 10)
    # What an attacker sends is logged redacted and cut short.
    long_one = "http://user:hunter2@evil.example/" + "x" * 5000
    assert await outcome(address, path(), origin=long_one) == ("close", 4403)
    wait_until(lambda: "evil.example/xxx" in log.read_text(), 10)
    text = log.read_text()
    assert "hunter2" not in text and "x" * 200 not in text


async def test_sockets_per_user_are_bounded_across_server_processes(servers, valkey):
    uvicorn, daphne = servers["uvicorn"][0], servers["daphne"][0]
    origin = {uvicorn: f"http://{uvicorn}", daphne: f"http://{daphne}"}
    held = []
    for address in (uvicorn, daphne, uvicorn):  # MAX_SOCKETS = 3, on two processes
        ws = await connect(f"ws://{address}{path()}", origin=origin[address])
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "queue.snapshot"
        held.append(ws)
    try:
        assert open_sockets(valkey) == MAX_SOCKETS
        for address in (uvicorn, daphne):
            assert await outcome(address, path()) == ("close", 4429)
        assert await outcome(daphne, path("bob"), user="bob") != ("close", 4429)  # per user
        assert watchers(valkey) == str(MAX_SOCKETS)  # a 4429 counted no watcher
        await held.pop().close()
        wait_until(lambda: open_sockets(valkey) == MAX_SOCKETS - 1, 10, message="one closed")
        kind_, frame = await outcome(daphne, path())
        assert kind_ == "frame" and frame["type"] == "queue.snapshot"
    finally:
        for ws in held:
            await ws.close()
    wait_until(lambda: open_sockets(valkey) == 0, 10, message="every socket uncounted")
    wait_until(lambda: watchers(valkey) is None, 10, message="every watcher uncounted")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deeply_nested_frame_gets_an_error_and_leaks_nothing(servers, kind, valkey):
    address, _ = servers[kind]
    async with connect(f"ws://{address}{path()}", origin=f"http://{address}") as ws:
        assert json.loads(await ws.recv())["type"] == "queue.snapshot"
        await ws.send("[" * 50_000)  # under MAX_FRAME_BYTES; json.loads: RecursionError
        error = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (error["type"], error["code"]) == ("error", "malformed")
        await ws.send('{"type": "resync"}')  # answered: nothing changed since the snapshot
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["type"] == "queue.current"
        assert watchers(valkey) == "1"
    wait_until(lambda: watchers(valkey) is None, 10, message="the watcher uncounted")
    wait_until(lambda: open_sockets(valkey) == 0, 10, message="the socket uncounted")


@pytest.mark.parametrize("kind", KINDS)
async def test_no_channel_layer_closes_4500_and_says_why(valkey, tmp_path, kind):
    log = tmp_path / "server.log"
    with asgi_server(kind, valkey, log, OUTBOX_TEST_NO_LAYER="1") as address:
        assert await outcome(address, path()) == ("close", 4500)
        wait_until(lambda: "CHANNEL_LAYERS is missing" in log.read_text(), 10, message="log")
    assert watchers(valkey) is None and open_sockets(valkey) == 0


@pytest.mark.parametrize("kind", KINDS)
async def test_the_first_handshake_after_a_valkey_restart_is_served(tmp_path, kind):
    server = ValkeyProcess(tmp_path / "valkey").start()
    log = tmp_path / "server.log"
    try:
        with asgi_server(kind, server.url, log) as address:
            for _ in range(2):  # pooled connections in the layer and the outbox
                kind_, frame = await outcome(address, path())
                assert kind_ == "frame" and frame["type"] == "queue.snapshot"
            server.restart()
            first = await outcome(address, path())
            assert first[0] != "http", log.read_text()  # never a 500 on the handshake
            assert first == ("frame", first[1]) and first[1]["type"] == "queue.snapshot", first
    finally:
        server.stop()
    text = log.read_text()
    assert "Traceback" not in text and " 500" not in text, text
    print(text)
