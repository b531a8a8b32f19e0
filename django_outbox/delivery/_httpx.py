"""What the built-in HTTP agents share: one httpx client per event loop, and a bounded
read of an answer (docs/explanation/security.md, "Credentials and hostile agents")."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable

import httpx


class Unreadable(Exception):
    """An answer not read: larger than the limit, or compressed though none was asked for
    (the clients ask for ``identity``, so what is read is what is counted); the agents
    raise it too for what they will not follow or parse (a next link elsewhere, not JSON)."""


class LoopClients:
    """One :class:`httpx.AsyncClient` per running event loop (a client is bound to the
    loop it was made on), made by ``factory`` on first use or after it was closed."""

    def __init__(self, factory: Callable[[], httpx.AsyncClient]) -> None:
        self._factory = factory
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    def get(self) -> httpx.AsyncClient:
        """The running loop's client. Raises ``RuntimeError`` outside a running loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                client = self._clients[loop] = self._factory()
            return client

    async def aclose(self) -> None:
        """Close the running loop's client (a no-op if it has none)."""
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    @property
    def any_open(self) -> bool:
        """True while some event loop still holds an open client."""
        with self._lock:
            return any(not c.is_closed for c in self._clients.values())


async def read_bounded(response: httpx.Response, limit: int) -> bytearray:
    """The raw body of a streamed ``response``, at most ``limit`` bytes. Raises
    :class:`Unreadable` for a compressed body or one over ``limit`` (declared or read),
    httpx errors as they come."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise Unreadable(f"a {encoding}-compressed answer, though none was asked for")
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise Unreadable(f"an answer of {declared} bytes; the limit is {limit}")
    body = bytearray()
    async for chunk in response.aiter_raw():  # raw: a chunk is at most 64 KiB
        body += chunk
        if len(body) > limit:
            raise Unreadable(f"an answer over {limit} bytes")
    return body
