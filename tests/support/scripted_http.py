"""A real HTTP/1.1 server on loopback, in a thread, that answers each request as a test
scripts it, down to the socket: a status with headers and a body, a connection closed or
reset before a word, a body cut by a reset half way, an answer that never comes, a body
dripped a byte at a time, a body of megabytes made lazily (tests/agents/test_backend_outcomes.py).

::

    server = ScriptedServer().start()
    server.on("POST", r"/prompts$", Answer(503, {"Retry-After": "7"}))
    ... server.url, server.requests ...
    server.stop()

A route is a method and a regular expression searched in the path (query included); the
first route that matches answers, every time it matches; a request no route matches gets
404. Every request is recorded in :attr:`ScriptedServer.requests` as :class:`Seen`.
:func:`black_hole` gives a loopback address where a connection is never accepted (the
request is never sent: a connect timeout), :func:`nothing_listens` one that refuses.
"""

from __future__ import annotations

import re
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: The longest an answer that "never comes" waits (the test stops the server sooner).
LONGEST = 30.0


@dataclass(frozen=True)
class Answer:
    """How one request is answered.

    ``status``, ``headers`` and ``body``: the answer (``Content-Length`` is the body's
    length unless ``headers`` set it, or ``chunked``; a header value, and the body, may be a
    callable, called as the answer is sent: a date relative to then). ``how``: ``"whole"``
    (the default), ``"close"`` (read the request, close without a word), ``"reset"`` (the
    same with a TCP reset), ``"cut"`` (send the head and half the body, declaring all of
    it, then reset), ``"hang"`` (read the request, answer nothing until the server stops),
    ``"drip"`` (the head at once, then the body a byte every ``interval`` seconds).
    ``huge``: instead of ``body``, this many bytes of ``x`` made as they are sent.
    """

    status: int = 200
    headers: dict[str, Any] = field(default_factory=dict)
    body: bytes | Callable[[], bytes] = b""
    how: str = "whole"
    interval: float = 0.1
    huge: int = 0
    chunked: bool = False


@dataclass(frozen=True)
class Seen:
    """One request as the server read it: header names lower-cased."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        while not self.server.stopping.is_set():
            line = self.rfile.readline(65537)
            if not line.strip():
                return
            method, target, _ = line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while (raw := self.rfile.readline(65537)) not in (b"\r\n", b"\n", b""):
                name, _, value = raw.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            owner = self.server.owner
            with owner.lock:
                owner.requests.append(Seen(method, target, headers, body))
            if not self._answer(owner.answer_for(method, target)):
                return

    def _reset(self) -> None:
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()

    def _answer(self, answer: Answer) -> bool:
        """Send ``answer``; False when the connection is done with."""
        if answer.how == "close":
            self.connection.shutdown(socket.SHUT_RDWR)
            return False
        if answer.how == "reset":
            self._reset()
            return False
        if answer.how == "hang":
            self.server.stopping.wait(LONGEST)
            return False
        body = answer.body() if callable(answer.body) else answer.body
        size = answer.huge or len(body)
        head = [f"HTTP/1.1 {answer.status} Scripted"]
        names = {name.lower() for name in answer.headers}
        head += [
            f"{name}: {value() if callable(value) else value}"
            for name, value in answer.headers.items()
        ]
        if answer.chunked:
            head.append("Transfer-Encoding: chunked")
        elif "content-length" not in names:
            head.append(f"Content-Length: {size}")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        try:
            if answer.how == "cut":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                time.sleep(0.05)  # let the half arrive before the reset overtakes it
                self._reset()
                return False
            if answer.how == "drip":
                for byte in body:
                    if self.server.stopping.wait(answer.interval):
                        return False
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                return True
            if answer.huge:
                chunk = b"x" * 65536
                left = answer.huge
                while left > 0 and not self.server.stopping.is_set():
                    piece = chunk[: min(left, len(chunk))]
                    self.wfile.write(
                        b"%x\r\n%s\r\n" % (len(piece), piece) if answer.chunked else piece
                    )
                    with self.server.owner.lock:
                        self.server.owner.written += len(piece)
                    left -= len(piece)
                if answer.chunked:
                    self.wfile.write(b"0\r\n\r\n")
                return True
            if answer.chunked:
                self.wfile.write(
                    b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
                )
            else:
                self.wfile.write(body)
            return True
        except OSError:
            return False


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    owner: ScriptedServer
    stopping: threading.Event

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up (a timeout, a test ending) is part of the script


class ScriptedServer:
    """See the module docstring. :meth:`start` returns the server; :meth:`stop` ends
    every answer still hanging or dripping."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: list[Seen] = []
        self.routes: list[tuple[str, re.Pattern[str], Answer]] = []
        self.written = 0  # bytes a ``huge`` answer managed to write
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.owner = self
        self._server.stopping = threading.Event()
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def on(self, method: str, pattern: str, answer: Answer) -> ScriptedServer:
        """Answer ``method`` requests whose path matches ``pattern`` with ``answer``."""
        with self.lock:
            self.routes.append((method, re.compile(pattern), answer))
        return self

    def answer_for(self, method: str, path: str) -> Answer:
        with self.lock:
            for want, pattern, answer in self.routes:
                if want == method and pattern.search(path):
                    return answer
        return Answer(404, {"Content-Type": "application/json"}, b'{"detail": "no route"}')

    def seen(self, method: str, pattern: str) -> list[Seen]:
        """The requests recorded so far with ``method`` and a path matching ``pattern``."""
        with self.lock:
            return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]

    def start(self) -> ScriptedServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def nothing_listens() -> str:
    """``http://127.0.0.1:<port>`` where nothing listens: a connection is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class BlackHole:
    """A loopback listener whose backlog is full and which never accepts: a new
    connection's handshake is never answered, so a client times out connecting and never
    sends its request. ``url``; :meth:`close` ends it."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(0)
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.fillers: list[socket.socket] = []
        for _ in range(16):  # until one handshake goes unanswered: the queue is full
            filler = socket.socket()
            filler.settimeout(0.2)
            self.fillers.append(filler)
            try:
                filler.connect(("127.0.0.1", self.port))
            except TimeoutError:
                break

    def close(self) -> None:
        for filler in self.fillers:
            filler.close()
        self.listener.close()
