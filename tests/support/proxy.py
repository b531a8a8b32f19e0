"""A small loopback TCP proxy for fault tests: forwards bytes, and can lose one reply.

``drop_reply_to(marker)`` arms a one-shot fault: the next client request that
contains ``marker`` is forwarded to the server, the server's reply is read and
thrown away, and the client's connection is closed — the command ran, its
reply was lost.
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
            while True:
                try:
                    data = client.recv(65536)
                except OSError:
                    return
                if not data:
                    close_both()
                    return
                if self._take_marker(data):
                    dropping.set()
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
                    self.dropped += 1
                    close_both()  # the command ran; its reply is lost
                    return
                try:
                    client.sendall(data)
                except OSError:
                    return

        threading.Thread(target=to_client, daemon=True).start()
        to_server()
