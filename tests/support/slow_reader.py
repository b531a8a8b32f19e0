"""A WebSocket client that does the handshake and then never reads: the slow reader.

Used by tests/django/ws/test_slow_readers_on_servers.py against real uvicorn and daphne
processes (tests/support/live_server.py). It is a raw TCP socket with a small receive
buffer, so the kernel takes only a few KiB of what the server sends and the rest stays
queued on the server's side (docs/explanation/security.md, "Slow readers"). It can still
send text frames (masked, as RFC 6455 requires of clients): a hostile client asks for
snapshots it never reads.
"""

from __future__ import annotations

import base64
import os
import socket
import struct
from urllib.parse import urlsplit

#: Bytes the client's kernel may buffer for it (Linux doubles the value asked for).
RECEIVE_BUFFER = 4096


class SlowReader:
    """One handshaken WebSocket to ``url`` (``ws://host:port/path``) sending ``headers``
    (e.g. a session cookie). :meth:`send_text` sends a frame; nothing is ever read after
    the handshake's response headers. :meth:`abort` drops the TCP connection (RST)."""

    def __init__(self, url: str, headers: dict[str, str], timeout: float = 10.0) -> None:
        parts = urlsplit(url)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.settimeout(timeout)
        sock.connect((parts.hostname or "127.0.0.1", parts.port or 80))
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            f"GET {parts.path or '/'} HTTP/1.1",
            f"Host: {parts.hostname}:{parts.port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            chunk = sock.recv(1)  # byte by byte: not one byte of a frame is read
            if not chunk:
                raise ConnectionError(f"closed during the handshake: {response!r}")
            response += chunk
        status = response.split(b"\r\n", 1)[0]
        if b" 101 " not in status + b" ":
            raise ConnectionError(f"handshake refused: {status!r}")
        self.sock = sock

    def send_text(self, text: str) -> None:
        """Send one masked text frame (raises OSError once the server dropped us)."""
        payload = text.encode()
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x81, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x81, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x81, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def abort(self) -> None:
        """Drop the connection without a close frame (RST: unread data is discarded)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.sock.close()
