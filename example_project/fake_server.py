"""The core of the fake ``opencode serve``: HTTP/1.1 on asyncio streams and h11, and the
opencode routes the outbox uses, with the same JSON shapes as opencode 1.18.33
(README "The built-in opencode deliverer").

Two layers build on :class:`FakeOpencodeServer` and add their own knobs:

- ``example_project/fake_agent.py``, the demo's agent: a transcript file, latency, random
  cuts and errors, rules set over ``/_fake/control`` (README "The demo");
- ``tests/support/fake_opencode.py``, the tests' server: a fault per route, a log of requests,
  pagination, a listener that stops and starts again.

Routes here (a layer may add more by overriding :meth:`FakeOpencodeServer.route`):

- ``GET /global/health`` → ``{"healthy": true, "version": "fake"}``
- ``POST /session`` → a session object whose ``id`` starts with ``ses_``
- ``POST /session/{id}/message`` ``{"parts": [...], "messageID"?, "model"?}``: stores the user
  message first (a repeated ``messageID`` appends its parts to that message, as opencode
  does), then runs the turn the layer plans (:meth:`FakeOpencodeServer.plan_turn`) and
  answers the assistant message
- ``POST /session/{id}/abort``: ends the session's running turn (docs/howto/cutting.md)
- ``GET /session/{id}/message`` (the transcript: ``[{"info", "parts"}, ...]``) and
  ``GET /session/{id}/message/{messageID}`` (404 ``NotFoundError`` before it exists)

HTTP Basic auth on every route when a password is set (user ``opencode`` unless told
otherwise), like opencode. The example project holds this module, not ``tests/``: the example
project is what users copy, and it must not need the test suite.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import secrets
import time
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any

import h11

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@dataclass
class Request:
    """One HTTP request as read: ``path`` is the target as sent, query string included."""

    method: str
    path: str
    headers: dict[str, str]  #: names in lower case
    body: bytes

    @property
    def parts(self) -> list[str]:
        """The path's segments, without the query string: ``["session", "ses_…", "message"]``."""
        return [p for p in self.path.split("?", 1)[0].split("/") if p]

    def json(self) -> Any:
        """The body as JSON; raises ``ValueError`` when it is not (an empty body is not)."""
        return json.loads(self.body)


@dataclass
class Reply:
    """One HTTP answer; ``content-length`` is added when it is sent.

    With ``stream``, the body is those chunks instead of ``body``, sent as they are made (a
    huge answer costs the server one chunk of memory): ``length`` is then the declared
    ``content-length``, or None for chunked transfer encoding.
    """

    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    stream: AsyncIterable[bytes] | None = None
    length: int | None = None


@dataclass
class Turn:
    """What happens to a prompt once it is stored (see :meth:`FakeOpencodeServer.plan_turn`)."""

    seconds: float = 0.0  #: how long the turn takes (``math.inf``: until the server stops)
    answer: str = "ok"  #: the assistant's text
    cut_after_store: bool = False  #: drop the connection once the prompt is stored


class Cut(Exception):
    """Drop the connection without answering."""


def json_reply(status: int, value: Any) -> Reply:
    """A JSON answer."""
    return Reply(status, json.dumps(value).encode(), [("content-type", "application/json")])


def not_found(message: str) -> Reply:
    """opencode's 404: ``{"name": "NotFoundError", "data": {"message": ...}}``."""
    return json_reply(404, {"name": "NotFoundError", "data": {"message": message}})


def bad_request(message: str) -> Reply:
    """opencode's 400 for a payload it cannot read."""
    return json_reply(400, {"name": "BadRequest", "data": {"message": message, "kind": "Payload"}})


def injected_error(status: int) -> Reply:
    """The answer of a fault that a layer injects: ``status`` with an ``UnknownError``."""
    return json_reply(status, {"name": "UnknownError", "data": {"message": "injected"}})


async def sleep(seconds: float) -> None:
    """``asyncio.sleep``, where ``math.inf`` waits until the task is cancelled."""
    if seconds == math.inf:
        await asyncio.Event().wait()
    elif seconds > 0:
        await asyncio.sleep(seconds)


def prompt_text(parts: list[Any]) -> str:
    """The text of a prompt's parts, joined by spaces (what rules match against)."""
    return " ".join(str(p.get("text", "")) for p in parts if isinstance(p, dict)).strip()


class FakeOpencodeServer:
    """opencode's sessions and transcripts behind an h11 server.

    Serve it with ``asyncio.start_server(server.serve, host, port)``; stop with
    ``close_connections()`` after closing the listener. ``sessions`` maps a session id to its
    session object, ``transcripts`` a session id to its messages (``{"info", "parts"}``).
    """

    def __init__(
        self, *, password: str | None = None, username: str = "opencode", directory: str = "/tmp"
    ) -> None:
        self.password = password
        self.username = username
        self.directory = directory  #: the ``directory`` of the sessions it creates
        self.honour_message_id = True  #: False: ignore the client's messageID (a new one)
        self.sessions: dict[str, dict[str, Any]] = {}
        self.transcripts: dict[str, list[dict[str, Any]]] = {}
        self._last_ms = 0
        self._counter = 0
        self._tasks: set[asyncio.Task[None]] = set()
        #: session id -> set by ``POST /session/{id}/abort``: ends the running turn
        self._aborts: dict[str, asyncio.Event] = {}

    # -- layer hooks ------------------------------------------------------------------

    def plan_turn(self, session_id: str, text: str) -> Turn | Reply:
        """Before a prompt (its joined ``text``) is stored: the turn to run, or a reply to
        answer instead (nothing stored). May raise :class:`Cut` to drop the connection."""
        return Turn()

    def changed(self) -> None:
        """Called after every change to the sessions or transcripts."""

    # -- sessions and transcripts -----------------------------------------------------

    def new_id(self, prefix: str) -> str:
        """opencode's ID shape: prefix, 12 hex digits of time and counter, 14 base62."""
        ms = int(time.time() * 1000)
        if ms <= self._last_ms:
            self._counter += 1
        else:
            self._last_ms, self._counter = ms, 0
        value = (self._last_ms * 0x1000 + self._counter) & 0xFFFF_FFFF_FFFF
        return f"{prefix}_{value:012x}" + "".join(secrets.choice(_BASE62) for _ in range(14))

    def new_session(self) -> dict[str, Any]:
        """Create an empty session; returns its session object."""
        sid = self.new_id("ses")
        now = int(time.time() * 1000)
        session = {
            "id": sid,
            "slug": "fake-session",
            "projectID": "global",
            "directory": self.directory,
            "title": "New session",
            "version": "fake",
            "time": {"created": now, "updated": now},
        }
        self.sessions[sid] = session
        self.transcripts[sid] = []
        self.changed()
        return session

    def _store_prompt(
        self, sid: str, mid: str, parts: list[Any], model: dict[str, Any] | None
    ) -> None:
        transcript = self.transcripts[sid]
        user = next((m for m in transcript if m["info"]["id"] == mid), None)
        if user is None:
            info = {
                "id": mid,
                "sessionID": sid,
                "role": "user",
                "time": {"created": int(time.time() * 1000)},
                "agent": "build",
                "model": model or {"providerID": "fake", "modelID": "fake"},
            }
            user = {"info": info, "parts": []}
            transcript.append(user)
        for part in parts:
            user["parts"].append(
                {**part, "id": self.new_id("prt"), "sessionID": sid, "messageID": mid}
            )
        self.changed()

    async def _run_turn(self, sid: str, parent: str, turn: Turn) -> dict[str, Any]:
        assistant_id = self.new_id("msg")
        assistant = {
            "info": {
                "id": assistant_id,
                "sessionID": sid,
                "role": "assistant",
                "parentID": parent,
                "time": {"created": int(time.time() * 1000)},
            },
            "parts": [],
        }
        self.transcripts[sid].append(assistant)
        aborted = self._aborts.setdefault(sid, asyncio.Event())
        aborted.clear()
        turn_done = asyncio.ensure_future(sleep(turn.seconds))
        abort_seen = asyncio.ensure_future(aborted.wait())
        try:
            await asyncio.wait({turn_done, abort_seen}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            turn_done.cancel()
            abort_seen.cancel()
        assistant["info"]["time"]["completed"] = int(time.time() * 1000)
        assistant["parts"].append(
            {
                "id": self.new_id("prt"),
                "sessionID": sid,
                "messageID": assistant_id,
                "type": "text",
                "text": turn.answer,
            }
        )
        self.changed()
        return assistant

    # -- HTTP plumbing ----------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: read requests, answer them, until either side is done."""
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read(conn, reader)
                if request is None:
                    break
                try:
                    reply = await self.dispatch(request)
                except Cut:
                    writer.transport.abort()
                    return
                if reply.stream is not None:
                    await self._send_stream(conn, writer, reply)
                    break
                data = conn.send(
                    h11.Response(
                        status_code=reply.status,
                        headers=[*reply.headers, ("content-length", str(len(reply.body)))],
                    )
                )
                data += conn.send(h11.Data(data=reply.body)) or b""
                data += conn.send(h11.EndOfMessage()) or b""
                writer.write(data)
                await writer.drain()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.transport.abort()

    async def _send_stream(
        self, conn: h11.Connection, writer: asyncio.StreamWriter, reply: Reply
    ) -> None:
        """Send a streamed reply chunk by chunk, waiting for the peer to take each one."""
        assert reply.stream is not None
        headers = list(reply.headers)
        if reply.length is not None:
            headers.append(("content-length", str(reply.length)))
        writer.write(conn.send(h11.Response(status_code=reply.status, headers=headers)) or b"")
        async for chunk in reply.stream:
            writer.write(conn.send(h11.Data(data=chunk)) or b"")
            await writer.drain()
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        await writer.drain()

    async def _read(self, conn: h11.Connection, reader: asyncio.StreamReader) -> Request | None:
        head: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                return Request(head.method.decode(), head.target.decode(), headers, body)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def close_connections(self) -> None:
        """Drop every open connection (pending turns end unanswered)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def authorised(self, request: Request) -> bool:
        """True without a password, else when the request carries the Basic credentials."""
        if self.password is None:
            return True
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return request.headers.get("authorization") == f"Basic {token}"

    # -- routes -----------------------------------------------------------------------

    async def dispatch(self, request: Request) -> Reply:
        """Answer one request (401 without the credentials, 404 off the routes)."""
        if not self.authorised(request):
            return Reply(401, b"Unauthorized", [("www-authenticate", 'Basic realm="Secure Area"')])
        found = self.route(request.method, request.parts)
        if found is None:
            return not_found(f"No route for {request.method} {request.path}")
        name, args = found
        return await self.handle(name, request, *args)

    def route(self, method: str, parts: list[str]) -> tuple[str, tuple[str, ...]] | None:
        """The route of a request: ``(name, path arguments)``, or None. The handler of
        route ``name`` is the method ``on_<name>(request, *arguments)``."""
        if method == "GET" and parts == ["global", "health"]:
            return "health", ()
        if method == "POST" and parts == ["session"]:
            return "create_session", ()
        if len(parts) >= 3 and parts[0] == "session" and parts[2] == "message":
            if method == "POST" and len(parts) == 3:
                return "post_message", (parts[1],)
            if method == "GET" and len(parts) == 3:
                return "list_messages", (parts[1],)
            if method == "GET" and len(parts) == 4:
                return "get_message", (parts[1], parts[3])
        if method == "POST" and len(parts) == 3 and parts[0] == "session" and parts[2] == "abort":
            return "abort", (parts[1],)
        return None

    async def handle(self, name: str, request: Request, *args: str) -> Reply:
        """Run route ``name``'s handler (a layer wraps this to inject faults)."""
        reply = getattr(self, f"on_{name}")(request, *args)
        if asyncio.iscoroutine(reply):
            reply = await reply
        return reply

    def on_health(self, request: Request) -> Reply:
        """``GET /global/health``."""
        return json_reply(200, {"healthy": True, "version": "fake"})

    def on_create_session(self, request: Request) -> Reply:
        """``POST /session``: the new session object."""
        return json_reply(200, self.new_session())

    async def on_post_message(self, request: Request, sid: str) -> Reply:
        """``POST /session/{id}/message``: validate, plan the turn, store, run the turn."""
        if sid not in self.transcripts:
            return not_found(f"Session not found: {sid}")
        try:
            body = request.json()
        except ValueError:
            return bad_request("Invalid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("parts"), list):
            return bad_request('Missing key\n  at ["parts"]')
        mid = body.get("messageID")
        if mid is not None and (not isinstance(mid, str) or not mid.startswith("msg")):
            return bad_request(f'Expected a string starting with "msg", got {json.dumps(mid)}')
        model = body.get("model")
        if model is not None and (
            not isinstance(model, dict) or "providerID" not in model or "modelID" not in model
        ):
            return bad_request('Missing key\n  at ["model"]["providerID"]')
        turn = self.plan_turn(sid, prompt_text(body["parts"]))
        if isinstance(turn, Reply):
            return turn
        if mid is None or not self.honour_message_id:
            mid = self.new_id("msg")
        self._store_prompt(sid, mid, body["parts"], model)
        if turn.cut_after_store:
            raise Cut
        return json_reply(200, await self._run_turn(sid, mid, turn))

    def on_abort(self, request: Request, sid: str) -> Reply:
        """``POST /session/{id}/abort``: end the running turn (it completes at once); 200
        ``true`` whether or not one runs, as opencode answers."""
        if sid not in self.transcripts:
            return not_found(f"Session not found: {sid}")
        self._aborts.setdefault(sid, asyncio.Event()).set()
        return json_reply(200, True)

    def on_list_messages(self, request: Request, sid: str) -> Reply:
        """``GET /session/{id}/message``: the whole transcript."""
        if sid not in self.transcripts:
            return not_found(f"Session not found: {sid}")
        return json_reply(200, self.transcripts[sid])

    def on_get_message(self, request: Request, sid: str, mid: str) -> Reply:
        """``GET /session/{id}/message/{messageID}``."""
        for message in self.transcripts.get(sid, []):
            if message["info"]["id"] == mid:
                return json_reply(200, message)
        return not_found(f"Message not found: {mid}")
