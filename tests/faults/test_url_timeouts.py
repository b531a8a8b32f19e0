"""A ``socket_timeout`` in the Valkey URL bounds connecting too, as a redis-py URL means it
(docs/howto/valkey.md, "Timeouts in the URL"): against a server whose listen queue is full
(connects hang, as behind a firewall that drops packets) an accept with
``?socket_timeout=0.3`` gives up in about four tries of 0.3 s, not of the 2 s default."""

from __future__ import annotations

import socket
import time
from contextlib import contextmanager

import pytest

from django_outbox.core.errors import OutboxUnavailable
from django_outbox.core.service import Outbox


@contextmanager
def hanging_port():
    """A loopback port whose listen queue is full: a new connect waits, never completes."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        server.close()


def accept_time(url: str) -> float:
    outbox = Outbox(url)
    started = time.monotonic()
    with pytest.raises(OutboxUnavailable, match="connecting"):
        outbox.accept("w", "s", user_id="u", client_message_id="k", text="t")
    outbox.close()
    return time.monotonic() - started


def test_a_url_socket_timeout_bounds_connecting():
    with hanging_port() as port:
        took = accept_time(f"redis://127.0.0.1:{port}/0?socket_timeout=0.3")
    assert took < 3.0, took  # 4 connects of 0.3 s and backoffs; with 2 s each it was 8 s


def test_a_url_socket_connect_timeout_still_wins():
    with hanging_port() as port:
        url = f"redis://127.0.0.1:{port}/0?socket_timeout=5&socket_connect_timeout=0.2"
        assert accept_time(url) < 3.0
