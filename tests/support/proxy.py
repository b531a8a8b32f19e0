"""A small loopback TCP proxy for fault tests: forwards bytes, and can lose one reply.

``drop_reply_to(marker)`` arms a one-shot fault: the next client request that
contains ``marker`` is forwarded to the server, the server's reply is read and
thrown away, and the client's connection is closed — the command ran, its
reply was lost.

``hold_request_to(marker)`` arms another one-shot fault: the next client request that
contains ``marker`` is held in the proxy (``held`` is set) until :meth:`release_held`
either forwards it (a request still on its way when its sender gave up: the server gets
it late, and its reply is thrown away) or drops it (it never arrives).
"""

from __future__ import annotations

import socket
import threading
import time

from tests.support.valkey import free_port


class TcpProxy:
    def __init__(self, upstream_port: int, host: str = "127.0.0.1") -> None:
        self.upstream = (host, upstream_port)
        self.port = free_port()
        self.marker: bytes | None = None
        #: Seconds each client request waits before it is forwarded (a slow network).
        self.delay = 0.0
        self.dropped = 0
        self.hold_marker: bytes | None = None
        #: Set once a request is held; :meth:`release_held` decides what becomes of it.
        self.held = threading.Event()
        self._release = threading.Event()
        self._forward_held = False
        #: Set once the server has answered a held request that was forwarded.
        self.held_answered = threading.Event()
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.1)
        self._closing = False
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def drop_reply_to(self, marker: bytes) -> None:
        with self._lock:
            self.marker = marker

    def hold_request_to(self, marker: bytes) -> None:
        """Hold the next request containing ``marker`` until :meth:`release_held`."""
        with self._lock:
            self.hold_marker = marker

    def release_held(self, *, forward: bool) -> None:
        """Forward the held request to the server (``forward=True``; its reply is thrown
        away, the client's connection is closed), or drop it and close both sides."""
        self._forward_held = forward
        self._release.set()

    def cut_all(self) -> int:
        """Cut every open connection at once (both sides see a reset or EOF)."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        return len(pairs)

    def close(self) -> None:
        self._closing = True
        self._server.close()
        self._thread.join(5)

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            client.settimeout(None)
            upstream = socket.create_connection(self.upstream)
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _take_marker(self, data: bytes) -> bool:
        with self._lock:
            if self.marker is not None and self.marker in data:
                self.marker = None
                return True
        return False

    def _take_hold(self, data: bytes) -> bool:
        with self._lock:
            if self.hold_marker is not None and self.hold_marker in data:
                self.hold_marker = None
                return True
        return False

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        """Forward both ways in two threads; after a marked request, lose its reply."""
        dropping = threading.Event()

        def close_both() -> None:
            for sock in (client, upstream):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

        def to_server() -> None:
            forwarded_held = False
            while True:
                try:
                    data = client.recv(65536)
                except OSError:
                    return
                if not data:
                    if forwarded_held:  # the server still answers what it got late
                        self.held_answered.wait(30)
                    close_both()
                    return
                if self._take_marker(data):
                    dropping.set()
                if self._take_hold(data):
                    self.held.set()
                    self._release.wait()
                    if not self._forward_held:
                        close_both()  # it never reaches the server
                        return
                    dropping.set()  # the sender is gone: nobody reads the reply
                    forwarded_held = True
                if self.delay:
                    time.sleep(self.delay)
                try:
                    upstream.sendall(data)
                except OSError:
                    return

        def to_client() -> None:
            while True:
                try:
                    data = upstream.recv(65536)
                except OSError:
                    return
                if not data:
                    close_both()
                    return
                if dropping.is_set():
                    self.held_answered.set()
                    self.dropped += 1
                    close_both()  # the command ran; its reply is lost
                    return
                try:
                    client.sendall(data)
                except OSError:
                    return

        threading.Thread(target=to_client, daemon=True).start()
        to_server()
