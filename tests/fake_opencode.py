"""A fake ``opencode serve`` on real HTTP (127.0.0.1, a free port), for tests.

Same routes and JSON shapes as opencode 1.18.33 (``opencode-notes.md``), as far
as the outbox uses them::

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
(answer 200 with these raw bytes). :meth:`stop` closes the listener and every
connection (new connections are refused); :meth:`start` listens again on the
same port. ``honour_message_id=False`` mimics a server that ignores the
client's messageID. Built on asyncio streams and h11 (httpx's own HTTP/1.1
parser).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import secrets
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import h11

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


@dataclass
class Fault:
    delay: float = 0.0  #: seconds before answering (POST message: the turn, after storing)
    status: int | None = None  #: answer this status instead (before storing anything)
    cut: str | None = None  #: "before_store" | "after_store": drop the connection
    body: bytes | None = None  #: answer 200 with these raw bytes instead


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _Reply:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


class _Cut(Exception):
    """Drop the connection without answering."""


def _json_reply(status: int, value: Any) -> _Reply:
    return _Reply(status, json.dumps(value).encode(), [("content-type", "application/json")])


def _not_found(message: str) -> _Reply:
    return _json_reply(404, {"name": "NotFoundError", "data": {"message": message}})


def _bad_request(message: str) -> _Reply:
    return _json_reply(400, {"name": "BadRequest", "data": {"message": message, "kind": "Payload"}})


class FakeOpencode:
    """An opencode-compatible HTTP server with fault knobs (see the module docstring)."""

    def __init__(
        self, *, password: str | None = None, username: str = "opencode", port: int = 0
    ) -> None:
        self.password = password
        self.username = username
        self.port = port
        self.honour_message_id = True
        self.page_size: int | None = None  #: paginate the list like opencode's ?limit=
        self.faults: dict[str, Fault] = {}
        self.requests: list[Request] = []
        self.sessions: dict[str, list[dict[str, Any]]] = {}
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._counter = 0
        self._last_ms = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeOpencode:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop every open connection (pending turns end unanswered)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    # -- state ------------------------------------------------------------------------

    def _new_id(self, prefix: str) -> str:
        ms = int(time.time() * 1000)
        if ms <= self._last_ms:
            self._counter += 1
        else:
            self._last_ms, self._counter = ms, 0
        value = (ms * 0x1000 + self._counter) & 0xFFFF_FFFF_FFFF
        return f"{prefix}_{value:012x}" + "".join(secrets.choice(_BASE62) for _ in range(14))

    def create_session(self) -> str:
        sid = self._new_id("ses")
        self.sessions[sid] = []
        return sid

    def messages(self, session_id: str) -> list[dict[str, Any]]:
        return self.sessions[session_id]

    def user_texts(self, session_id: str) -> list[list[str]]:
        """The text parts of each user message, in transcript order."""
        return [
            [p["text"] for p in m["parts"] if p["type"] == "text"]
            for m in self.sessions[session_id]
            if m["info"]["role"] == "user"
        ]

    # -- HTTP -------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(conn, reader)
                if request is None:
                    break
                self.requests.append(request)
                try:
                    reply = await self._dispatch(request)
                except _Cut:
                    writer.transport.abort()
                    return
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

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> Request | None:
        head: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                return Request(head.method.decode(), head.target.decode(), headers, body)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    def _authorised(self, request: Request) -> bool:
        if self.password is None:
            return True
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return request.headers.get("authorization") == f"Basic {token}"

    async def _dispatch(self, request: Request) -> _Reply:
        if not self._authorised(request):
            return _Reply(401, b"", [("www-authenticate", 'Basic realm="Secure Area"')])
        parts = request.path.split("?", 1)[0].strip("/").split("/")
        method = request.method
        if method == "GET" and parts == ["global", "health"]:
            return _json_reply(200, {"healthy": True, "version": "fake"})
        if method == "POST" and parts == ["session"]:
            return await self._faulted("create_session", request, self._create_session)
        if len(parts) >= 3 and parts[0] == "session" and parts[2] == "message":
            sid = parts[1]
            if method == "POST" and len(parts) == 3:
                return await self._faulted(
                    "post_message", request, lambda r: self._post_message(sid, r)
                )
            if method == "GET" and len(parts) == 3:
                return await self._faulted("list_messages", request, lambda r: self._list(sid, r))
            if method == "GET" and len(parts) == 4:
                return await self._faulted(
                    "get_message", request, lambda r: self._get(sid, parts[3])
                )
        return _not_found(f"No route for {method} {request.path}")

    async def _faulted(self, route: str, request: Request, handler: Any) -> _Reply:
        fault = self.faults.get(route, Fault())
        if fault.cut == "before_store":
            raise _Cut
        if fault.status is not None:
            await self._sleep(fault.delay)
            return _json_reply(
                fault.status, {"name": "UnknownError", "data": {"message": "injected"}}
            )
        if fault.body is not None:
            await self._sleep(fault.delay)
            return _Reply(200, fault.body, [("content-type", "application/json")])
        if route != "post_message":  # POST message sleeps in its turn, after storing
            await self._sleep(fault.delay)
        reply = handler(request)
        if asyncio.iscoroutine(reply):
            reply = await reply
        if fault.cut == "after_store":
            raise _Cut
        return reply

    @staticmethod
    async def _sleep(seconds: float) -> None:
        if seconds == math.inf:
            await asyncio.Event().wait()
        elif seconds > 0:
            await asyncio.sleep(seconds)

    def _create_session(self, request: Request) -> _Reply:
        sid = self.create_session()
        now = int(time.time() * 1000)
        return _json_reply(
            200,
            {
                "id": sid,
                "slug": "fake-session",
                "projectID": "global",
                "directory": "/tmp",
                "title": "New session",
                "version": "fake",
                "time": {"created": now, "updated": now},
            },
        )

    async def _post_message(self, sid: str, request: Request) -> _Reply:
        if sid not in self.sessions:
            return _not_found(f"Session not found: {sid}")
        try:
            body = request.json()
        except ValueError:
            return _bad_request("Invalid JSON")
        if not isinstance(body, dict) or not isinstance(body.get("parts"), list):
            return _bad_request('Missing key\n  at ["parts"]')
        mid = body.get("messageID")
        if mid is not None and (not isinstance(mid, str) or not mid.startswith("msg")):
            return _bad_request(f'Expected a string starting with "msg", got {json.dumps(mid)}')
        model = body.get("model")
        if model is not None and (
            not isinstance(model, dict) or "providerID" not in model or "modelID" not in model
        ):
            return _bad_request('Missing key\n  at ["model"]["providerID"]')
        if mid is None or not self.honour_message_id:
            mid = self._new_id("msg")
        transcript = self.sessions[sid]
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
        for part in body["parts"]:
            user["parts"].append(
                {**part, "id": self._new_id("prt"), "sessionID": sid, "messageID": mid}
            )
        fault = self.faults.get("post_message", Fault())
        if fault.cut == "after_store":
            raise _Cut
        # The turn: an assistant message that completes after the fault's delay.
        assistant_id = self._new_id("msg")
        assistant = {
            "info": {
                "id": assistant_id,
                "sessionID": sid,
                "role": "assistant",
                "parentID": mid,
                "time": {"created": int(time.time() * 1000)},
            },
            "parts": [],
        }
        transcript.append(assistant)
        await self._sleep(fault.delay)
        assistant["info"]["time"]["completed"] = int(time.time() * 1000)
        assistant["parts"].append(
            {
                "id": self._new_id("prt"),
                "sessionID": sid,
                "messageID": assistant_id,
                "type": "text",
                "text": "ok",
            }
        )
        return _json_reply(200, assistant)

    def _list(self, sid: str, request: Request) -> _Reply:
        """The transcript; with ``page_size``, newest page first and a ``Link: rel=next``
        to older ones (opencode does this when asked for ``?limit=``)."""
        if sid not in self.sessions:
            return _not_found(f"Session not found: {sid}")
        transcript = self.sessions[sid]
        if self.page_size is None:
            return _json_reply(200, transcript)
        query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(request.path).query))
        end = int(query.get("before", len(transcript)))
        start = max(0, end - self.page_size)
        reply = _json_reply(200, transcript[start:end])
        if start > 0:
            link = f"{self.base_url}/session/{sid}/message?limit={self.page_size}&before={start}"
            reply.headers.append(("link", f'<{link}>; rel="next"'))
        return reply

    def _get(self, sid: str, mid: str) -> _Reply:
        for message in self.sessions.get(sid, []):
            if message["info"]["id"] == mid:
                return _json_reply(200, message)
        return _not_found(f"Message not found: {mid}")
