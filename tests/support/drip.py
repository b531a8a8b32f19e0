"""A hostile HTTP server on real TCP (127.0.0.1, a free port) that answers every request
with the same bytes, one byte every ``interval`` seconds: the slow drip that keeps a
per-read timeout from ever firing (tests/opencode/test_opencode_hostile.py)::

    async with DripServer(head=b"HTTP/1.1 200 OK\\r\\n...", body=b"[...]", interval=0.2) as s:
        ... s.base_url, s.requests ...

``head`` (the status line and headers) is dripped too unless ``head_at_once``; ``body``
follows it. The connection stays open after the answer until the client closes it or the
server stops.
"""

from __future__ import annotations

import asyncio
import contextlib


class DripServer:
    """Answers each request by dripping ``head`` then ``body`` (see the module docstring)."""

    def __init__(
        self, head: bytes, body: bytes = b"", *, interval: float, head_at_once: bool = False
    ) -> None:
        self.head, self.body, self.interval = head, body, interval
        self.head_at_once = head_at_once
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> DripServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
            if length:
                await reader.readexactly(length)
            self.requests += 1
            if self.head_at_once:
                writer.write(self.head)
                await writer.drain()
            for byte in (b"" if self.head_at_once else self.head) + self.body:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(self.interval)
            await reader.read()  # until the client closes
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server stops (it cancels this task)
        finally:
            self._tasks.discard(task)
            writer.close()
