"""Clients that stop reading cost the server a bounded amount, through real servers
(docs/explanation/security.md#slow-readers).

uvicorn and daphne subprocesses serve ``tests.support.asgi.live`` (tests/support/live_server.py).
The slow readers are raw sockets that do the WebSocket handshake and never read a byte more
(tests/support/slow_reader.py), or ``websockets`` clients that stop reading for a while. The
session holds 25 prompts of 100 KB: a 2.5 MB snapshot in four pages. Every wait has a
deadline.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from django_outbox.outbox import Outbox
from tests.support.live_server import serve
from tests.support.slow_reader import SlowReader

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

FULL = 100 * 1024  # MAX_TEXT_BYTES' default
PROMPTS = 25  # a 2.5 MB snapshot
SOCKETS = 20  # WS_MAX_SOCKETS_PER_USER's default: all of one user's sockets
RESYNC_EVERY = 2.1  # seconds: inside the resync budget (30 a minute)
#: How long the readers ask for snapshots they never read (seconds).
FLOOD = 12.0
#: RSS growth allowed (MB): twenty 2.5 MB snapshots, their copies while they are built,
#: and the interpreter's slack. Before the bound, daphne grew by 370 MB and
#: uvicorn by 130 MB in 12 s; with it, 60 and 15 MB.
RSS_BOUND_MB = 100


@pytest.fixture
def core(valkey, r):
    outbox = Outbox(url=valkey, user_max_queued=0, user_accepts_per_minute=0, cap=100)
    for i in range(PROMPTS):
        outbox.accept("alice", "s1", user_id="u", client_message_id=f"k{i}", text="x" * FULL)
    yield outbox
    outbox.close()


@pytest.mark.parametrize("kind", ["uvicorn", "daphne"])
def test_twenty_sockets_that_never_read_grow_the_server_a_bounded_amount(
    kind, valkey, core, tmp_path
):
    """The case: one user's twenty sockets ask for the 2.5 MB snapshot every 2.1 s and
    never read. Each gets the snapshot on connect and no other until it acknowledges
    that one, so the server holds at most one snapshot a socket. With the default
    check interval (30 s) none is closed during the flood: the bound comes from not
    sending, not from closing."""
    with serve(kind, valkey, tmp_path, OUTBOX_TEST_WS="30,1,30") as server:
        before = server.rss_kib()
        readers = [SlowReader(server.queue_url(), server.headers) for _ in range(SOCKETS)]
        peak, rounds = before, 0
        started = time.monotonic()
        try:
            while time.monotonic() - started < FLOOD:
                for reader in readers:
                    reader.send_text('{"type": "resync"}')
                rounds += 1
                until = time.monotonic() + RESYNC_EVERY
                while time.monotonic() < until:
                    peak = max(peak, server.rss_kib())
                    time.sleep(0.1)
        finally:
            for reader in readers:
                reader.abort()
        growth = (peak - before) / 1024
        print(
            f"{kind}: RSS {before / 1024:.0f} MB before, peak {peak / 1024:.0f} MB with "
            f"{SOCKETS} unread sockets after {rounds} rounds of resyncs"
        )
        assert growth < RSS_BOUND_MB, f"{kind} grew {growth:.0f} MB"


async def _read_until_closed(ws, timeout: float) -> tuple[int | None, list[dict]]:
    frames = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
            frames.append(json.loads(raw))
    except ConnectionClosed as closed:
        return (closed.rcvd.code if closed.rcvd else None), frames
    raise AssertionError(f"still open after {timeout}s; {len(frames)} frames")


@pytest.mark.parametrize("kind", ["uvicorn", "daphne"])
async def test_a_reader_that_stops_is_closed_with_4408(kind, valkey, core, tmp_path):
    """A client that asks for a snapshot while the last one is unread (and unacknowledged)
    is closed with 4408 at the next periodic check; reading afterwards, it finds the
    first snapshot and the close code, never a second snapshot."""
    with serve(kind, valkey, tmp_path, OUTBOX_TEST_WS="0.4,0.5,30") as server:
        ws = await connect(
            server.queue_url(), additional_headers=server.headers, max_queue=1, max_size=None
        )
        try:
            await asyncio.sleep(0.5)  # the snapshot is on its way; we do not read it
            await ws.send('{"type": "resync"}')
            await asyncio.sleep(2.5)  # several check intervals without reading
            code, frames = await _read_until_closed(ws, 30)
        finally:
            ws.transport.abort()
        snapshots = [f for f in frames if f["type"] == "queue.snapshot"]
        assert code == 4408
        assert {f["version"] for f in snapshots} == {snapshots[0]["version"]}
        assert [f["page"] for f in snapshots] == list(range(1, len(snapshots) + 1))
