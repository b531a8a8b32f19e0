"""A fake ``opencode serve`` for the demo: same routes and JSON shapes, adjustable behaviour.

Run: ``python -m example_project.fake_agent --port 4096 [--state FILE] [--password PW]``.

Routes (as opencode 1.18.33 answers them; README "The built-in opencode deliverer"): those of
``example_project/fake_server.py`` (health, create a session, post a prompt, the transcript,
one message), where a prompt "thinks" for the latency before its answer, plus
``GET /session`` / ``GET /session/{id}``; a message route whose session id does not start
with ``ses`` answers 500 ``UnknownError``.

The transcript is kept in ``--state`` (JSON, rewritten atomically after every change), so
it survives restarts and the outbox's verifier reads what was really stored.

Behaviour knobs (not opencode's; for the demo and its smoke run):

- environment defaults: ``DEMO_AGENT_LATENCY`` (seconds a turn takes, default 2),
  ``DEMO_AGENT_CUT_RATE`` (probability of dropping the connection after storing a prompt:
  an ambiguous outcome), ``DEMO_AGENT_ERROR_RATE`` (probability of answering 500 before
  storing: the verifier then finds nothing and the outbox resends),
  ``DEMO_AGENT_BUSY_RATE`` (probability of answering 429 with ``Retry-After: 1`` before
  storing: the HTTP agent's "busy, come back then", ``example_project/http_agent.py``)
- ``GET /_fake/control`` → the knobs, the rules and ``posts`` (how many POSTs each prompt
  text received); ``POST /_fake/control`` with any of ``{"latency", "cutRate",
  "errorRate", "busyRate", "rules": [rule, ...], "clearRules": true}``. A rule is
  ``{"match": text substring ("" matches any prompt), "action": "cut_after_store" |
  "cut_before_store" | "error" | "delay" | "busy", "seconds"?, "status"?, "times"?: N
  (default 1; 0 = forever), "session"?: a session ID (default "": any session)}``; the
  first rule that matches a prompt applies. ``busy`` answers 429 with ``Retry-After:
  <seconds>`` (whole seconds, at least 1) before storing.

HTTP Basic auth on every route when ``--password`` (or ``OPENCODE_SERVER_PASSWORD``) is set,
user ``opencode``, like opencode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from example_project.fake_server import (
    Cut,
    FakeOpencodeServer,
    Reply,
    Request,
    Turn,
    bad_request,
    injected_error,
    json_reply,
    not_found,
)

ACTIONS = ("cut_after_store", "cut_before_store", "error", "delay", "busy")


@dataclass
class Rule:
    """What to do with the next prompts whose text contains ``match``."""

    match: str
    action: str  #: one of ACTIONS
    seconds: float = 0.0  #: "delay": how long the turn takes; "busy": the Retry-After
    status: int = 500  #: "error": the status answered
    times: int = 1  #: prompts it applies to, then it is dropped (0 = forever)
    session: str = ""  #: the only session it applies to ("" = any)

    @classmethod
    def parse(cls, raw: Any) -> Rule:
        """A rule from its JSON shape; raises ``ValueError`` for a bad one."""
        if not isinstance(raw, dict) or raw.get("action") not in ACTIONS:
            raise ValueError(f"a rule needs an action among {ACTIONS}: {raw!r}")
        rule = cls(
            match=str(raw.get("match", "")),
            action=raw["action"],
            seconds=float(raw.get("seconds", 0)),
            status=int(raw.get("status", 500)),
            times=int(raw.get("times", 1)),
            session=str(raw.get("session", "")),
        )
        if rule.seconds < 0 or rule.times < 0 or not 400 <= rule.status <= 599:
            raise ValueError(f"bad rule values: {raw!r}")
        return rule

    def as_dict(self) -> dict[str, Any]:
        """The rule's JSON shape."""
        return {
            "match": self.match,
            "action": self.action,
            "seconds": self.seconds,
            "status": self.status,
            "times": self.times,
            "session": self.session,
        }


class FakeAgent(FakeOpencodeServer):
    """The demo's agent: the fake opencode server with a transcript file and the demo's
    knobs (``latency`` in seconds; ``cut_rate``, ``error_rate`` and ``busy_rate``,
    probabilities 0-1)."""

    label = "fake agent"  #: how its log lines name it

    def __init__(
        self,
        *,
        state_path: Path | None,
        password: str | None,
        latency: float,
        cut_rate: float = 0.0,
        error_rate: float = 0.0,
        busy_rate: float = 0.0,
    ) -> None:
        super().__init__(password=password, directory=os.getcwd())
        self.state_path = state_path
        self.latency = latency
        self.cut_rate = cut_rate
        self.error_rate = error_rate
        self.busy_rate = busy_rate
        self.rules: list[Rule] = []
        self.posts: dict[str, int] = {}  #: prompt text -> POSTs received
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
        """Write the sessions, transcripts and post counts to ``state_path`` (atomically)."""
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        data = {"sessions": self.sessions, "transcripts": self.transcripts, "posts": self.posts}
        tmp.write_text(json.dumps(data, ensure_ascii=False), "utf-8")
        os.replace(tmp, self.state_path)

    def changed(self) -> None:
        self.save()

    # -- the knobs --------------------------------------------------------------------

    def route(self, method: str, parts: list[str]) -> tuple[str, tuple[str, ...]] | None:
        if parts == ["_fake", "control"]:
            return ("control", ()) if method == "POST" else ("knobs", ())
        if method == "GET" and parts == ["session"]:
            return "list_sessions", ()
        if method == "GET" and len(parts) == 2 and parts[0] == "session":
            return "get_session", (parts[1],)
        if len(parts) >= 3 and parts[0] == "session" and parts[2] == "message":
            if not parts[1].startswith("ses"):
                return "bad_session_id", ()
        return super().route(method, parts)

    def on_list_sessions(self, request: Request) -> Reply:
        """``GET /session``: every session object."""
        return json_reply(200, list(self.sessions.values()))

    def on_get_session(self, request: Request, sid: str) -> Reply:
        """``GET /session/{id}``."""
        found = self.sessions.get(sid)
        return json_reply(200, found) if found else not_found(f"Session not found: {sid}")

    def on_bad_session_id(self, request: Request) -> Reply:
        """A message route whose session id does not start with ``ses``: 500."""
        return json_reply(500, {"name": "UnknownError", "data": {"message": "bad id"}})

    def knobs(self) -> dict[str, Any]:
        """The knobs, the rules and the post counts (``GET /_fake/control``)."""
        return {
            "latency": self.latency,
            "cutRate": self.cut_rate,
            "errorRate": self.error_rate,
            "busyRate": self.busy_rate,
            "rules": [r.as_dict() for r in self.rules],
            "posts": self.posts,
        }

    def on_knobs(self, request: Request) -> Reply:
        """``GET /_fake/control``."""
        return json_reply(200, self.knobs())

    def on_control(self, request: Request) -> Reply:
        """``POST /_fake/control``: change the knobs and rules (400 for a bad value)."""
        try:
            body = request.json()
            if not isinstance(body, dict):
                raise ValueError("send a JSON object")
            values = {}
            for key in ("latency", "cutRate", "errorRate", "busyRate"):
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
        self.busy_rate = values.get("busyRate", self.busy_rate)
        if body.get("clearRules"):
            self.rules.clear()
        self.rules.extend(rules)
        return json_reply(200, self.knobs())

    def _rule_for(self, session_id: str, text: str) -> Rule | None:
        for rule in self.rules:
            if rule.match in text and rule.session in ("", session_id):
                if rule.times:
                    rule.times -= 1
                    if rule.times == 0:
                        self.rules.remove(rule)
                return rule
        return None

    def plan_turn(self, session_id: str, text: str) -> Turn | Reply:
        """Count the post; the first matching rule, else a random busy answer, error or cut,
        else a turn of ``latency`` seconds."""
        self.posts[text] = self.posts.get(text, 0) + 1
        rule = self._rule_for(session_id, text)
        action = rule.action if rule else None
        if action is None and random.random() < self.busy_rate:
            action = "busy"
        if action is None and random.random() < self.error_rate:
            action = "error"
        if action is None and random.random() < self.cut_rate:
            action = "cut_after_store"
        if action == "cut_before_store":
            self.save()
            raise Cut
        if action == "error":
            self.save()
            return injected_error(rule.status if rule else 500)
        if action == "busy":
            self.save()
            wait = max(1, math.ceil(rule.seconds)) if rule else 1
            busy = json_reply(429, {"name": "Busy", "data": {"retryAfter": wait}})
            busy.headers.append(("retry-after", str(wait)))
            return busy
        return Turn(
            seconds=rule.seconds if rule and action == "delay" else self.latency,
            answer=f"Done thinking about {text[:60]!r}.",
            cut_after_store=action == "cut_after_store",
        )


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw else default


async def main(argv: list[str] | None = None, agent_class: type[FakeAgent] = FakeAgent) -> int:
    """Serve ``agent_class`` (the fake opencode agent, or a layer of it such as the demo's
    HTTP agent) until SIGTERM or SIGINT; 2 when the port cannot be bound."""
    parser = argparse.ArgumentParser(description=(agent_class.__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4096)
    parser.add_argument("--state", type=Path, default=None, help="JSON file for the transcript")
    parser.add_argument("--password", default=os.environ.get("OPENCODE_SERVER_PASSWORD") or None)
    parser.add_argument("--latency", type=float, default=_env_float("DEMO_AGENT_LATENCY", 2.0))
    args = parser.parse_args(argv)
    agent = agent_class(
        state_path=args.state,
        password=args.password,
        latency=args.latency,
        cut_rate=_env_float("DEMO_AGENT_CUT_RATE", 0.0),
        error_rate=_env_float("DEMO_AGENT_ERROR_RATE", 0.0),
        busy_rate=_env_float("DEMO_AGENT_BUSY_RATE", 0.0),
    )
    try:
        server = await asyncio.start_server(agent.serve, args.host, args.port)
    except OSError as exc:
        print(f"{agent.label}: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"{agent.label} listening on http://{args.host}:{args.port}", flush=True)
    await stop.wait()
    server.close()
    await agent.close_connections()
    with contextlib.suppress(Exception):
        await server.wait_closed()
    agent.save()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
