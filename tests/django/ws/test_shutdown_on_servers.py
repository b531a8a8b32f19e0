"""An ASGI server with open queue sockets stops promptly on SIGTERM, even when the outbox's
Valkey hangs (docs/howto/deploy.md#stopping-the-server).

uvicorn waits for every application task before it exits, with no deadline unless
``--timeout-graceful-shutdown`` is given; daphne cancels its application instances. A
socket's clean-up on disconnect (leaving the group, uncounting the watcher and the socket)
talks to Valkey: with Valkey hung (stopped with SIGSTOP: a partition, a stuck server), it
must not hold the server's exit. The access policy here reads nothing from Valkey
(``tests.support.policies.own_workspace``): a project's own policy that blocks is the
project's to bound.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from websockets.asyncio.client import connect

from django_outbox.testing import ValkeyServer
from tests.support.live_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

#: Seconds a server may take to exit after SIGTERM.
EXIT_BOUND = 3.0


def exited(pid: int) -> bool:
    """Whether process ``pid`` (a child of this one) has exited (a zombie or gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("kind", ["uvicorn", "daphne"])
async def test_sigterm_with_open_sockets_and_a_hung_valkey_exits_promptly(kind, tmp_path):
    store = ValkeyServer(tmp_path / "valkey").start()
    try:
        with serve(
            kind,
            store.url,
            tmp_path / kind,
            OUTBOX_TEST_WS="0.4,0.5,30",
            OUTBOX_TEST_POLICY="tests.support.policies.own_workspace",
        ) as server:
            sockets = [
                await connect(server.queue_url(), additional_headers=server.headers)
                for _ in range(5)
            ]
            for ws in sockets:
                assert '"queue.snapshot"' in await asyncio.wait_for(ws.recv(), 10)
            assert store.proc is not None
            os.kill(store.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(0.5)  # a periodic check or two now waits on Valkey
            os.kill(server.pid, signal.SIGTERM)
            started = time.monotonic()
            while not exited(server.pid) and time.monotonic() - started < EXIT_BOUND + 7:
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            for ws in sockets:
                ws.transport.abort()
            print(f"{kind} exited {took:.1f}s after SIGTERM")
            assert took < EXIT_BOUND, f"{kind} took {took:.1f}s to exit"
    finally:
        if store.proc is not None:
            os.kill(store.proc.pid, signal.SIGCONT)
        store.stop()
