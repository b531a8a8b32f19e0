"""An in-house agent behind HTTP, for ``make demo AGENT=http``: what
``django_outbox.delivery.http`` delivers to (docs/howto/http-agent.md).

Run: ``python -m example_project.http_agent --port 4096 [--state FILE] [--password PW]``.

It is the demo's fake agent (``example_project/fake_agent.py``: its transcript file, its
knobs and rules, HTTP Basic auth) with the API an in-house agent would offer:

- ``POST /agent/w/{workspace_id}/s/{session_id}/prompts`` with ``Idempotency-Key`` and a
  JSON body whose ``text`` is the prompt (the HTTP agent's default ``BODY``; a merged
  delivery's ``parts`` lists each prompt, stored as one message's parts): stores the
  prompt under its key, runs the turn (the knobs' thinking time; a Stop ends it at once),
  answers 201 ``{"id": key}``. A key it stored before is answered 200 ``{"id": key,
  "duplicate": true}`` and is not run again: the agent honours the key. The first rule or
  random fault that applies comes first: 429 with ``Retry-After`` (``busy``), 500
  (``error``), a connection dropped before or after storing, a longer turn.
- ``GET /agent/w/{workspace_id}/s/{session_id}/prompts/{key}``: 200 once the key is
  stored, else 404 (the verifier's question: did the prompt arrive?).
- ``POST /agent/w/{workspace_id}/s/{session_id}/abort``: ends the session's running turn;
  202 whether or not one runs.

A session's prompts go to the transcript of ``session_id`` (made at its first prompt when
``POST /session`` did not make it), so the demo's page and the smoke run read it with the
fake opencode routes as before (``GET /session/{id}/message``). ``GET /_fake/control``
also reports ``replays``: per prompt text, the POSTs of a key already stored (an outbox
that never resends blindly makes none, whatever the faults).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any
from urllib.parse import unquote

from example_project.fake_agent import FakeAgent, main
from example_project.fake_server import Cut, Reply, Request, bad_request, json_reply, not_found


class HttpAgent(FakeAgent):
    """The demo's in-house HTTP agent: the fake agent's transcript and knobs behind the
    routes of the module docstring."""

    label = "http agent"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.replays: dict[str, int] = {}  #: prompt text -> POSTs of a stored key

    def route(self, method: str, parts: list[str]) -> tuple[str, tuple[str, ...]] | None:
        if parts[:1] != ["agent"]:
            return super().route(method, parts)
        parts = [unquote(p) for p in parts]
        if len(parts) < 6 or parts[1] != "w" or parts[3] != "s":
            return None
        session, tail = parts[4], parts[5:]
        if method == "POST" and tail == ["prompts"]:
            return "prompt", (session,)
        if method == "GET" and len(tail) == 2 and tail[0] == "prompts":
            return "lookup", (session, tail[1])
        if method == "POST" and tail == ["abort"]:
            return "abort_turn", (session,)
        return None

    def knobs(self) -> dict[str, Any]:
        return {**super().knobs(), "replays": self.replays}

    def _stored(self, session_id: str, key: str) -> bool:
        return any(
            m["info"]["id"] == key and m["info"]["role"] == "user"
            for m in self.transcripts.get(session_id, [])
        )

    async def on_prompt(self, request: Request, session_id: str) -> Reply:
        """``POST .../prompts``: 201 once the turn ran, 200 for a key stored before, 400
        without an ``Idempotency-Key`` or a ``text``; the knobs' faults before that."""
        key = request.headers.get("idempotency-key", "")
        if not key:
            return bad_request("Idempotency-Key is required")
        try:
            body = request.json()
        except ValueError:
            return bad_request("Invalid JSON")
        text = body.get("text") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text:
            return bad_request('Missing key\n  at ["text"]')
        if self._stored(session_id, key):
            self.replays[text] = self.replays.get(text, 0) + 1
            self.save()
            return json_reply(200, {"id": key, "duplicate": True})
        turn = self.plan_turn(session_id, text)
        if isinstance(turn, Reply):
            return turn
        self.transcripts.setdefault(session_id, [])
        model = body.get("model")
        # A merged delivery lists each prompt in ``parts`` (its ``text`` joins them): one
        # stored message with a text part per prompt, as opencode keeps it.
        parts = body.get("parts")
        if not (isinstance(parts, list) and parts and all(isinstance(p, str) for p in parts)):
            parts = [text]
        self._store_prompt(
            session_id,
            key,
            [{"type": "text", "text": part} for part in parts],
            model if isinstance(model, dict) else None,
        )
        if turn.cut_after_store:
            raise Cut
        await self._run_turn(session_id, key, turn)
        return json_reply(201, {"id": key})

    def on_lookup(self, request: Request, session_id: str, key: str) -> Reply:
        """``GET .../prompts/{key}``: 200 when stored, else 404."""
        if self._stored(session_id, key):
            return json_reply(200, {"id": key})
        return not_found(f"No prompt {key} in session {session_id}")

    def on_abort_turn(self, request: Request, session_id: str) -> Reply:
        """``POST .../abort``: end the session's running turn; 202 either way."""
        self._aborts.setdefault(session_id, asyncio.Event()).set()
        return json_reply(202, {"aborted": True})


if __name__ == "__main__":
    sys.exit(asyncio.run(main(agent_class=HttpAgent)))
