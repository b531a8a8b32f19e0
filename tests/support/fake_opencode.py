"""A fake ``opencode serve`` on real HTTP (127.0.0.1, a free port), for tests.

The server is ``example_project/fake_server.py`` (opencode 1.18.33's routes and JSON shapes,
as far as the outbox uses them); this layer adds the tests' knobs::

    async with FakeOpencode(password=None) as fake:
        sid = fake.create_session()            # or POST /session
        fake.faults["post_message"] = Fault(delay=5)
        ... fake.base_url, fake.messages(sid), fake.requests ...

``POST /session/{id}/message`` stores the user message first (a repeated
``messageID`` appends its parts to that message, like opencode), then runs a
"turn" of ``Fault.delay`` seconds (``math.inf``: until the server stops) and
answers the assistant message. Fault knobs, per route name (``create_session``,
``post_message``, ``list_messages``, ``get_message``): ``delay``, ``status``
(answer it instead, nothing stored), ``cut`` (``"before_store"`` /
``"after_store"``: drop the connection after reading the request), ``body``
(answer 200 with these raw bytes), ``headers`` (added to a ``status`` or ``body``
answer), ``huge`` (answer ``status`` or 200 with a body of
that many bytes, made lazily as it is sent; ``declare_length=False`` sends it chunked,
without a ``content-length``). :meth:`stop` closes the listener and every
connection (new connections are refused); :meth:`start` listens again on the
same port. ``honour_message_id=False`` mimics a server that ignores the
client's messageID; ``page_size`` paginates the transcript, its ``Link: rel=next``
pointing at ``next_link_base`` + path (default :attr:`FakeOpencode.base_url`; ``""``
gives a relative link; another server's URL makes a hostile agent).
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass
from typing import Any

from example_project.fake_server import (
    Cut,
    FakeOpencodeServer,
    Reply,
    Request,
    Turn,
    injected_error,
    json_reply,
    sleep,
)


@dataclass
class Fault:
    """What one route does wrong (``FakeOpencode.faults[route name]``)."""

    delay: float = 0.0  #: seconds before answering (POST message: the turn, after storing)
    status: int | None = None  #: answer this status instead (before storing anything)
    headers: tuple[tuple[str, str], ...] = ()  #: with ``status`` or ``body``: extra headers
    cut: str | None = None  #: "before_store" | "after_store": drop the connection
    body: bytes | None = None  #: answer 200 (or ``status``) with these raw bytes instead
    huge: int | None = None  #: answer ``status`` (or 200) with this many bytes, made lazily
    declare_length: bool = True  #: with ``huge``: send a content-length (else chunked)


#: One chunk of a ``huge`` body.
HUGE_CHUNK = 64 * 1024


async def huge_body(size: int):
    """``size`` bytes of a JSON array that never closes (``[`` and spaces), made lazily."""
    yield b"["
    left = size - 1
    blank = b" " * HUGE_CHUNK
    while left > 0:
        yield blank[: min(left, HUGE_CHUNK)]
        left -= HUGE_CHUNK


class FakeOpencode(FakeOpencodeServer):
    """An opencode-compatible HTTP server with fault knobs (see the module docstring)."""

    def __init__(
        self, *, password: str | None = None, username: str = "opencode", port: int = 0
    ) -> None:
        super().__init__(password=password, username=username)
        self.port = port
        self.page_size: int | None = None  #: paginate the list like opencode's ?limit=
        #: where ``Link: rel=next`` points: None is this server, "" a relative link
        self.next_link_base: str | None = None
        self.faults: dict[str, Fault] = {}
        self.requests: list[Request] = []
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeOpencode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Listen on ``port`` (a free one the first time when 0)."""
        self._server = await asyncio.start_server(self.serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every open connection (pending turns end unanswered)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self.close_connections()
        if server is not None:
            await server.wait_closed()

    # -- state ------------------------------------------------------------------------

    def create_session(self) -> str:
        """A new empty session; returns its id."""
        return self.new_session()["id"]

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        """The session's transcript: ``[{"info", "parts"}, ...]``."""
        return self.transcripts[session_id]

    def user_texts(self, session_id: str) -> list[list[str]]:
        """The text parts of each user message, in transcript order."""
        return [
            [p["text"] for p in m["parts"] if p["type"] == "text"]
            for m in self.transcripts[session_id]
            if m["info"]["role"] == "user"
        ]

    # -- the knobs --------------------------------------------------------------------

    async def dispatch(self, request: Request) -> Reply:
        self.requests.append(request)
        return await super().dispatch(request)

    async def handle(self, name: str, request: Request, *args: str) -> Reply:
        fault = self.faults.get(name, Fault())
        if fault.cut == "before_store":
            raise Cut
        if fault.huge is not None:
            await sleep(fault.delay)
            return Reply(
                fault.status or 200,
                headers=[("content-type", "application/json")],
                stream=huge_body(fault.huge),
                length=fault.huge if fault.declare_length else None,
            )
        if fault.status is not None:
            await sleep(fault.delay)
            if fault.body is not None:  # an error answer whose body the test chose
                reply = Reply(fault.status, fault.body, [("content-type", "text/plain")])
            else:
                reply = injected_error(fault.status)
            reply.headers.extend(fault.headers)
            return reply
        if fault.body is not None:
            await sleep(fault.delay)
            return Reply(200, fault.body, [("content-type", "application/json"), *fault.headers])
        if name != "post_message":  # POST message sleeps in its turn, after storing
            await sleep(fault.delay)
        reply = await super().handle(name, request, *args)
        if fault.cut == "after_store":
            raise Cut
        return reply

    def plan_turn(self, session_id: str, text: str) -> Turn | Reply:
        fault = self.faults.get("post_message", Fault())
        return Turn(seconds=fault.delay, cut_after_store=fault.cut == "after_store")

    def on_list_messages(self, request: Request, sid: str) -> Reply:
        """The transcript; with ``page_size``, newest page first and a ``Link: rel=next``
        to older ones (opencode does this when asked for ``?limit=``)."""
        if sid not in self.transcripts or self.page_size is None:
            return super().on_list_messages(request, sid)
        transcript = self.transcripts[sid]
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.path).query))
        end = int(query.get("before", len(transcript)))
        start = max(0, end - self.page_size)
        reply = json_reply(200, transcript[start:end])
        if start > 0:
            base = self.base_url if self.next_link_base is None else self.next_link_base
            link = f"{base}/session/{sid}/message?limit={self.page_size}&before={start}"
            reply.headers.append(("link", f'<{link}>; rel="next"'))
        return reply
