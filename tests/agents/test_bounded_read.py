"""The bounded read the built-in HTTP agents share (docs/explanation/security.md,
"Credentials and hostile agents"): a real loopback HTTP server answers, httpx streams it,
and the limit is exact: an answer of exactly ``limit`` bytes is read whole, one byte more
is refused, whether its length is declared or only seen while reading."""

import httpx
import pytest

from django_outbox.delivery.base import Unreadable, read_bounded
from tests.support.http_agent import AgentServer
from tests.support.scripted_http import Answer, ScriptedServer


@pytest.fixture
def server():
    agent = AgentServer().start()
    yield agent
    agent.stop()


async def answer(server, payload, headers=None, limit=10):
    """POST to the server, which answers 200 with ``payload``; read it bounded by ``limit``."""
    server.plan = [("status", 200, headers or {}, payload)]
    async with httpx.AsyncClient() as client:
        request = client.build_request("POST", server.url + "/w/w/s/s/prompts", content=b"{}")
        response = await client.send(request, stream=True)
        try:
            return bytes(await read_bounded(response, limit))
        finally:
            await response.aclose()


async def test_an_answer_of_exactly_the_limit_is_read_whole(server):
    # Non-ASCII: the limit counts bytes, and 5 "é" are 10 of them.
    payload = "ééééé".encode()
    assert len(payload) == 10
    assert await answer(server, payload, limit=10) == payload


async def test_one_byte_over_the_declared_limit_is_refused(server):
    with pytest.raises(Unreadable, match="an answer of 11 bytes; the limit is 10"):
        await answer(server, b"x" * 11, limit=10)


@pytest.fixture
def undeclared():
    """``undeclared(payload)``: the URL of a loopback server that answers 200 with
    ``payload`` chunked, so with no Content-Length: the length is seen only while reading."""
    servers = []

    def make(payload):
        server = ScriptedServer().on("GET", "/", Answer(200, body=payload, chunked=True))
        servers.append(server.start())
        return server.url + "/"

    yield make
    for server in servers:
        server.stop()


async def read_undeclared(url, limit):
    async with httpx.AsyncClient() as client:
        async with client.stream("GET", url) as response:
            assert "content-length" not in response.headers
            return bytes(await read_bounded(response, limit))


async def test_an_undeclared_answer_of_exactly_the_limit_is_read_whole(undeclared):
    payload = "ééééé".encode()
    assert await read_undeclared(undeclared(payload), 10) == payload


async def test_one_byte_over_the_limit_while_reading_is_refused(undeclared):
    with pytest.raises(Unreadable, match="an answer over 10 bytes"):
        await read_undeclared(undeclared(b"x" * 11), 10)


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY", " Identity "])
async def test_identity_is_read_in_any_case(server, encoding):
    payload = b'{"ok": true}'
    assert await answer(server, payload, {"Content-Encoding": encoding}, limit=100) == payload


async def test_a_compressed_answer_is_refused(server):
    with pytest.raises(Unreadable, match="gzip-compressed"):
        await answer(server, b"x", {"Content-Encoding": "gzip"}, limit=100)
