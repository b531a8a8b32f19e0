"""A small real HTTP agent for the HTTP agent's tests, on a loopback port in a thread.

``POST /w/<ws>/s/<ses>/prompts`` takes a prompt: by default it stores it under its
``Idempotency-Key`` (a second request with the same key is answered 200 and stored once,
as an agent that honours the key would) and answers 201. ``GET /prompts/<key>`` answers
200 when that key is stored, else 404. ``POST /w/<ws>/s/<ses>/abort`` records the abort
and answers 202. Each POST to ``prompts`` first takes the next behaviour from ``plan``
(``verify_plan`` for the GETs); see :meth:`AgentServer._behave` for their names.
Every request is recorded in ``requests`` as ``(method, path, headers, body bytes)``.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

#: How long a "slow" or "drip" behaviour goes on at most (the test ends it sooner).
LONGEST = 30.0


class AgentServer:
    """Start with :meth:`start`, stop with :meth:`stop` (ends every sleeping handler)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        #: ``time.monotonic()`` of each POST to a prompts URL, as it arrived.
        self.sent_at: list[float] = []
        #: True: an agent that caches its first answer per ``Idempotency-Key`` (as Stripe
        #: does, a 4xx included) and replays it for every later POST with that key.
        self.cache_answers = False
        self.answers: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.stored: dict[str, Any] = {}  # Idempotency-Key -> the JSON body
        self.runs: list[str] = []  # keys in the order their prompt "ran" (once each)
        self.plan: list[Any] = []
        self.verify_plan: list[Any] = []
        self.written = 0  # bytes a "huge" answer managed to write
        #: Every time a prompt was processed (run by the agent), as ``(key, JSON body)``:
        #: a key twice is a prompt the agent ran twice (``"ok"`` of a stored key answers
        #: 200 as an agent honouring the key would, but counts here).
        self.processed: list[tuple[str, Any]] = []
        #: Sends being handled per session now, and the most at once.
        self.in_flight: dict[str, int] = {}
        self.max_in_flight = 0
        #: With a ``random.Random``: each POST without a planned behaviour draws one
        #: (:meth:`_chaos`), each GET an answer 500 one time in ten.
        self.chaos: Any = None
        self.released = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                server._handle(self, "POST")

            def do_GET(self) -> None:
                server._handle(self, "GET")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def start(self) -> AgentServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    def prompts(self) -> list[tuple[str, dict[str, str], Any]]:
        """``(path, headers, JSON body)`` of every POST to a prompts URL, in order."""
        with self.lock:
            return [
                (path, headers, json.loads(body))
                for method, path, headers, body in self.requests
                if method == "POST" and path.endswith("/prompts")
            ]

    # -- the handler -------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else b""
        if len(body) < length:
            # the client went away mid-request (a worker SIGKILLed while sending): a real
            # server drops what never arrived whole, and so does this one
            h.close_connection = True
            return
        headers = {k.lower(): v for k, v in h.headers.items()}
        with self.lock:
            self.requests.append((method, h.path, headers, body))
            if method == "POST" and h.path.endswith("/prompts"):
                self.sent_at.append(time.monotonic())
            if method == "GET":
                behaviour = self.verify_plan.pop(0) if self.verify_plan else "lookup"
            elif h.path.endswith("/prompts"):
                behaviour = self.plan.pop(0) if self.plan else self._chaos()
            else:
                behaviour = ("status", 202, {}, b"")
            if method == "GET" and not self.verify_plan and self.chaos is not None:
                if self.chaos.random() < 0.1:
                    behaviour = ("status", 500, {}, b"")
            session = h.path if method == "POST" else ""
            if session:
                self.in_flight[session] = self.in_flight.get(session, 0) + 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight[session])
        key = headers.get("idempotency-key", "")
        cached = self.answers.get(key) if self.cache_answers and method == "POST" else None
        if cached is not None:
            behaviour = ("status", *cached)
        elif self.cache_answers and method == "POST" and isinstance(behaviour, tuple):
            if behaviour[0] == "status":
                self.answers[key] = behaviour[1:]
        try:
            self._behave(h, behaviour, key, body)
        finally:
            if session:
                with self.lock:
                    self.in_flight[session] -= 1

    def _chaos(self) -> Any:
        """``"ok"``, or with :attr:`chaos` set, one of: ``"ok"`` (70 %), ``"drop_after"``,
        ``"drop_before"`` (closed before storing), 502, 429 with ``Retry-After: 0``, 400."""
        if self.chaos is None:
            return "ok"
        return self.chaos.choices(
            [
                "ok",
                "drop_after",
                "drop_before",
                ("status", 502, {}, b"bad gateway"),
                ("status", 429, {"Retry-After": "0"}, b"busy"),
                ("status", 400, {}, b"refused"),
            ],
            [70, 8, 6, 6, 6, 4],
        )[0]

    def _store(self, key: str, body: bytes) -> bool:
        with self.lock:
            self.processed.append((key, json.loads(body)))
            if key in self.stored:
                return False
            self.stored[key] = json.loads(body)
            self.runs.append(key)
            return True

    def _behave(self, h: BaseHTTPRequestHandler, behaviour: Any, key: str, body: bytes) -> None:
        """``"ok"``: store and answer 201 (200 for a key stored before); ``"lookup"``
        (GETs): 200 if the key in the path is stored, else 404; ``"drop_after"``: store,
        then close the connection without a word; ``"slow"``: store, then answer nothing
        until the test ends; ``"drip"``: answer 500 and drip its body a byte every 0.2 s;
        ``"huge"``: answer 400 with an endless body; ``("status", code, headers, body)``:
        that answer, nothing stored; ``("redirect", code, location)``."""
        if behaviour == "ok":
            fresh = self._store(key, body)
            self._answer(h, 201 if fresh else 200, {}, b'{"ok": true}')
        elif behaviour == "lookup":
            wanted = h.path.rsplit("/", 1)[1]
            with self.lock:
                known = wanted in self.stored
            self._answer(h, 200 if known else 404, {}, b"{}")
        elif behaviour == "drop_after":
            self._store(key, body)
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
        elif behaviour == "drop_before":
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
        elif behaviour == "slow":
            self._store(key, body)
            self.released.wait(LONGEST)
            h.close_connection = True
        elif behaviour == "drip":
            h.send_response(500)
            h.send_header("Content-Length", "100000")
            h.end_headers()
            deadline = time.monotonic() + LONGEST
            try:
                while time.monotonic() < deadline and not self.released.wait(0.2):
                    h.wfile.write(b"x")
                    h.wfile.flush()
            except OSError:
                pass
        elif behaviour == "huge":
            h.send_response(400)
            h.end_headers()
            chunk = b"y" * 65536
            try:
                for _ in range(1000):  # 64 MiB, if anyone read it
                    h.wfile.write(chunk)
                    with self.lock:
                        self.written += len(chunk)
            except OSError:
                pass
            h.close_connection = True
        elif behaviour[0] == "status":
            _, code, extra, payload = behaviour
            self._answer(h, code, extra, payload)
        elif behaviour[0] == "redirect":
            _, code, location = behaviour
            self._answer(h, code, {"Location": location}, b"")
        else:  # pragma: no cover - a test's typo
            raise ValueError(f"unknown behaviour {behaviour!r}")

    @staticmethod
    def _answer(
        h: BaseHTTPRequestHandler, code: int, extra: dict[str, str], payload: bytes
    ) -> None:
        h.send_response(code)
        for name, value in extra.items():
            h.send_header(name, value)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(payload)))
        h.end_headers()
        h.wfile.write(payload)


def route(workspace_id: str, session_id: str) -> str:
    """The router of ``tests.support.settings.http_agents``: ``n...`` north, ``s...``
    south, ``g...`` the LangGraph agent ``graph`` (configured only with
    ``OUTBOX_TEST_LANGGRAPH_URL``), anything else the default agent (the recording agent of
    ``tests/support/agents.py``)."""
    if session_id.startswith("g"):
        return "graph"
    if session_id.startswith("n"):
        return "north"
    return "south" if session_id.startswith("s") else "default"
