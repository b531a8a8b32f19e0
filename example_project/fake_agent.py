"""A fake ``opencode serve`` for the demo: same routes and JSON shapes, adjustable behaviour.

Run: ``python -m example_project.fake_agent --port 4096 [--state FILE] [--password PW]``.

Routes (as opencode 1.18.33 answers them, see ``opencode-notes.md``):

- ``GET /global/health`` → ``{"healthy": true, "version": "fake"}``
- ``POST /session`` → a session object whose ``id`` starts with ``ses_``
- ``GET /session`` / ``GET /session/{id}``
- ``POST /session/{id}/message`` ``{"parts": [...], "messageID"?, "model"?}``: stores the
  user message first (a repeated ``messageID`` appends its parts to that message, as
  opencode does), then "thinks" for the latency and answers the assistant message
- ``GET /session/{id}/message`` (the transcript: ``[{"info", "parts"}, ...]``) and
  ``GET /session/{id}/message/{messageID}`` (404 ``NotFoundError`` before it exists)

The transcript is kept in ``--state`` (JSON, rewritten atomically after every change), so
it survives restarts and the outbox's verifier reads what was really stored.

Behaviour knobs (not opencode's; for the demo and its smoke run):

- environment defaults: ``DEMO_AGENT_LATENCY`` (seconds a turn takes, default 2),
  ``DEMO_AGENT_CUT_RATE`` (probability of dropping the connection after storing a prompt:
  an ambiguous outcome), ``DEMO_AGENT_ERROR_RATE`` (probability of answering 500 before
  storing: the verifier then finds nothing and the outbox resends)
- ``GET /_fake/control`` → the knobs, the rules and ``posts`` (how many POSTs each prompt
  text received); ``POST /_fake/control`` with any of ``{"latency", "cutRate",
  "errorRate", "rules": [rule, ...], "clearRules": true}``. A rule is ``{"match": text
  substring ("" matches any prompt), "action": "cut_after_store" | "cut_before_store" |
  "error" | "delay", "seconds"?, "status"?, "times"?: N (default 1; 0 = forever)}``;
  the first rule that matches a prompt applies.

HTTP Basic auth on every route when ``--password`` (or ``OPENCODE_SERVER_PASSWORD``) is set,
user ``opencode``, like opencode. Built on asyncio streams and h11.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
ACTIONS = ("cut_after_store", "cut_before_store", "error", "delay")


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> list[str]:
        return [p for p in self.target.split("?", 1)[0].split("/") if p]

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Reply:
    status: int
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)


class Cut(Exception):
    """Drop the connection without answering."""


def json_reply(status: int, value: Any) -> Reply:
    return Reply(status, json.dumps(value).encode(), [("content-type", "application/json")])


def not_found(message: str) -> Reply:
    return json_reply(404, {"name": "NotFoundError", "data": {"message": message}})


def bad_request(message: str) -> Reply:
    return json_reply(400, {"name": "BadRequest", "data": {"message": message, "kind": "Payload"}})


@dataclass
class Rule:
    match: str
    action: str
    seconds: float = 0.0
    status: int = 500
    times: int = 1  # 0 = forever

    @classmethod
    def parse(cls, raw: Any) -> Rule:
        if not isinstance(raw, dict) or raw.get("action") not in ACTIONS:
            raise ValueError(f"a rule needs an action among {ACTIONS}: {raw!r}")
        rule = cls(
            match=str(raw.get("match", "")),
            action=raw["action"],
            seconds=float(raw.get("seconds", 0)),
            status=int(raw.get("status", 500)),
            times=int(raw.get("times", 1)),
        )
        if rule.seconds < 0 or rule.times < 0 or not 400 <= rule.status <= 599:
            raise ValueError(f"bad rule values: {raw!r}")
        return rule

    def as_dict(self) -> dict[str, Any]:
        return {
            "match": self.match,
            "action": self.action,
            "seconds": self.seconds,
            "status": self.status,
            "times": self.times,
        }


class FakeAgent:
    """The server's state and its HTTP handlers."""

    def __init__(
        self,
        *,
        state_path: Path | None,
        password: str | None,
        latency: float,
        cut_rate: float = 0.0,
        error_rate: float = 0.0,
    ) -> None:
        self.state_path = state_path
        self.password = password
        self.latency = latency
        self.cut_rate = cut_rate
        self.error_rate = error_rate
        self.rules: list[Rule] = []
        self.sessions: dict[str, dict[str, Any]] = {}
        self.transcripts: dict[str, list[dict[str, Any]]] = {}
        self.posts: dict[str, int] = {}
        self._last_ms = 0
        self._counter = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._load()

    # -- state ------------------------------------------------------------------------

    def _load(self) -> None:
        if self.state_path is None or not self.state_path.exists():
            return
        data = json.loads(self.state_path.read_text("utf-8"))
        self.sessions = data.get("sessions", {})
        self.transcripts = data.get("transcripts", {})
        self.posts = data.get("posts", {})

    def save(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        data = {"sessions": self.sessions, "transcripts": self.transcripts, "posts": self.posts}
        tmp.write_text(json.dumps(data, ensure_ascii=False), "utf-8")
        os.replace(tmp, self.state_path)

    def new_id(self, prefix: str) -> str:
        """opencode's ID shape: prefix, 12 hex digits of time and counter, 14 base62."""
        ms = int(time.time() * 1000)
        if ms <= self._last_ms:
            self._counter += 1
        else:
            self._last_ms, self._counter = ms, 0
        value = (self._last_ms * 0x1000 + self._counter) & 0xFFFF_FFFF_FFFF
        return f"{prefix}_{value:012x}" + "".join(secrets.choice(_BASE62) for _ in range(14))

    # -- HTTP plumbing ----------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
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
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _authorised(self, request: Request) -> bool:
        if self.password is None:
            return True
        token = base64.b64encode(f"opencode:{self.password}".encode()).decode()
        return request.headers.get("authorization") == f"Basic {token}"

    # -- routes -----------------------------------------------------------------------

    async def dispatch(self, request: Request) -> Reply:
        if not self._authorised(request):
            return Reply(401, b"Unauthorized", [("www-authenticate", 'Basic realm="Secure Area"')])
        method, parts = request.method, request.path
        if method == "GET" and parts == ["global", "health"]:
            return json_reply(200, {"healthy": True, "version": "fake"})
        if parts == ["_fake", "control"]:
            return self.control(request) if method == "POST" else json_reply(200, self.knobs())
        if parts == ["session"]:
            if method == "POST":
                return self.create_session()
            if method == "GET":
                return json_reply(200, list(self.sessions.values()))
        if len(parts) == 2 and parts[0] == "session" and method == "GET":
            found = self.sessions.get(parts[1])
            return json_reply(200, found) if found else not_found(f"Session not found: {parts[1]}")
        if len(parts) >= 3 and parts[0] == "session" and parts[2] == "message":
            sid = parts[1]
            if not sid.startswith("ses"):
                return json_reply(500, {"name": "UnknownError", "data": {"message": "bad id"}})
            if method == "POST" and len(parts) == 3:
                return await self.post_message(sid, request)
            if method == "GET" and len(parts) == 3:
                if sid not in self.transcripts:
                    return not_found(f"Session not found: {sid}")
                return json_reply(200, self.transcripts[sid])
            if method == "GET" and len(parts) == 4:
                for message in self.transcripts.get(sid, []):
                    if message["info"]["id"] == parts[3]:
                        return json_reply(200, message)
                return not_found(f"Message not found: {parts[3]}")
        return not_found(f"No route for {method} {request.target}")

    def knobs(self) -> dict[str, Any]:
        return {
            "latency": self.latency,
            "cutRate": self.cut_rate,
            "errorRate": self.error_rate,
            "rules": [r.as_dict() for r in self.rules],
            "posts": self.posts,
        }

    def control(self, request: Request) -> Reply:
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise ValueError("send a JSON object")
            values = {}
            for key in ("latency", "cutRate", "errorRate"):
                if key in body:
                    value = float(body[key])
                    if value < 0 or (key != "latency" and value > 1):
                        raise ValueError(f"{key} out of range")
                    values[key] = value
            rules = [Rule.parse(r) for r in body.get("rules", [])]
        except (ValueError, TypeError) as exc:
            return bad_request(str(exc))
        self.latency = values.get("latency", self.latency)
        self.cut_rate = values.get("cutRate", self.cut_rate)
        self.error_rate = values.get("errorRate", self.error_rate)
        if body.get("clearRules"):
            self.rules.clear()
        self.rules.extend(rules)
        return json_reply(200, self.knobs())

    def create_session(self) -> Reply:
        sid = self.new_id("ses")
        now = int(time.time() * 1000)
        session = {
            "id": sid,
            "slug": "fake-session",
            "projectID": "global",
            "directory": os.getcwd(),
            "title": "New session",
            "version": "fake",
            "time": {"created": now, "updated": now},
        }
        self.sessions[sid] = session
        self.transcripts[sid] = []
        self.save()
        return json_reply(200, session)

    def _rule_for(self, text: str) -> Rule | None:
        for rule in self.rules:
            if rule.match in text:
                if rule.times:
                    rule.times -= 1
                    if rule.times == 0:
                        self.rules.remove(rule)
                return rule
        return None

    async def post_message(self, sid: str, request: Request) -> Reply:
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
        text = " ".join(
            str(p.get("text", "")) for p in body["parts"] if isinstance(p, dict)
        ).strip()
        self.posts[text] = self.posts.get(text, 0) + 1
        rule = self._rule_for(text)
        action = rule.action if rule else None
        if action is None and random.random() < self.error_rate:
            action = "error"
        if action is None and random.random() < self.cut_rate:
            action = "cut_after_store"
        if action == "cut_before_store":
            self.save()
            raise Cut
        if action == "error":
            self.save()
            status = rule.status if rule else 500
            return json_reply(status, {"name": "UnknownError", "data": {"message": "injected"}})
        mid = mid or self.new_id("msg")
        transcript = self.transcripts[sid]
        user = next((m for m in transcript if m["info"]["id"] == mid), None)
        if user is None:
            info = {
                "id": mid,
                "sessionID": sid,
                "role": "user",
                "time": {"created": int(time.time() * 1000)},
                "agent": "build",
                "model": body.get("model") or {"providerID": "fake", "modelID": "fake"},
            }
            user = {"info": info, "parts": []}
            transcript.append(user)
        for part in body["parts"]:
            user["parts"].append(
                {**part, "id": self.new_id("prt"), "sessionID": sid, "messageID": mid}
            )
        self.save()
        if action == "cut_after_store":
            raise Cut
        # The turn: an assistant message that completes after the latency.
        assistant_id = self.new_id("msg")
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
        seconds = rule.seconds if rule and action == "delay" else self.latency
        await asyncio.sleep(seconds)
        assistant["info"]["time"]["completed"] = int(time.time() * 1000)
        assistant["parts"].append(
            {
                "id": self.new_id("prt"),
                "sessionID": sid,
                "messageID": assistant_id,
                "type": "text",
                "text": f"Done thinking about {text[:60]!r}.",
            }
        )
        self.save()
        return json_reply(200, assistant)


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4096)
    parser.add_argument("--state", type=Path, default=None, help="JSON file for the transcript")
    parser.add_argument("--password", default=os.environ.get("OPENCODE_SERVER_PASSWORD") or None)
    parser.add_argument("--latency", type=float, default=_env_float("DEMO_AGENT_LATENCY", 2.0))
    args = parser.parse_args(argv)
    agent = FakeAgent(
        state_path=args.state,
        password=args.password,
        latency=args.latency,
        cut_rate=_env_float("DEMO_AGENT_CUT_RATE", 0.0),
        error_rate=_env_float("DEMO_AGENT_ERROR_RATE", 0.0),
    )
    try:
        server = await asyncio.start_server(agent.serve, args.host, args.port)
    except OSError as exc:
        print(f"fake agent: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"fake agent listening on http://{args.host}:{args.port}", flush=True)
    await stop.wait()
    server.close()
    await agent.close_connections()
    with contextlib.suppress(Exception):
        await server.wait_closed()
    agent.save()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
