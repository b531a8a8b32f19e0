"""An ASGI server with open queue sockets stops promptly on SIGTERM, even when the outbox's
Valkey hangs, and whatever sockets it refused or served before, quietly
(docs/howto/deploy.md#stopping-the-server).

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
from websockets.exceptions import ConnectionClosed

from django_outbox.testing import ValkeyServer
from tests.support.live_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

#: Seconds a server may take to exit after SIGTERM.
EXIT_BOUND = 3.0
#: Seconds a server may take to exit after SIGTERM once its sockets are gone (it once waited 26 s
#: for a lost cancellation).
QUIET_EXIT_BOUND = 5.0
#: Sockets refused per run (alternately 4400 and 4403). Before the fix, about one refused
#: socket in ten left its channel-layer receive running (measured: 5 runs in 6 held
#: uvicorn with 20); one is enough to hold the exit.
REFUSED = 40
#: Sockets served per run (a snapshot each, then closed by the client).
SERVED = 10
#: What a server's log must not say about a shutdown.
NOISE = ("Traceback", "Exception in ASGI application", "channel layer's receive failed")


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


async def refuse_or_serve(server, sockets: str) -> set[int]:
    """Open and end ``REFUSED`` refused or ``SERVED`` served queue sockets, one after the
    other; return their close codes."""
    codes = set()
    if sockets == "refused":
        for n in range(REFUSED):
            url = server.queue_url("bad$ws" if n % 2 else "bob")  # invalid ID; not alice's
            async with connect(url, additional_headers=server.headers) as ws:
                with pytest.raises(ConnectionClosed):
                    await asyncio.wait_for(ws.recv(), 10)
            codes.add(ws.close_code)
    else:
        for _ in range(SERVED):
            async with connect(server.queue_url(), additional_headers=server.headers) as ws:
                assert '"queue.snapshot"' in await asyncio.wait_for(ws.recv(), 10)
            codes.add(ws.close_code)
    return codes


@pytest.mark.parametrize("sockets", ["refused", "served"])
@pytest.mark.parametrize("kind", ["uvicorn", "daphne"])
async def test_sigterm_after_refused_or_served_sockets_exits_promptly_and_quietly(
    kind, sockets, tmp_path
):
    """A server slow to exit after refused sockets: with the channel layer configured as the README
    says (``socket_timeout``
    30), a refused socket's channel-layer receive, cancelled as it sent its first command,
    lost that cancellation inside the layer (Python 3.11's ``wait_for`` in redis-py) and
    ran on; uvicorn's exit waited for it ("Waiting for background tasks to complete")
    without end, or, retried through the shutdown, until it failed with "Exception in ASGI
    application". Now every socket's receive ends with it: the server exits within
    ``QUIET_EXIT_BOUND`` seconds and logs no traceback."""
    store = ValkeyServer(tmp_path / "valkey").start()
    try:
        with serve(
            kind,
            store.url,
            tmp_path / kind,
            OUTBOX_TEST_POLICY="tests.support.policies.own_workspace",
            OUTBOX_TEST_LAYER_SOCKET_TIMEOUT="30",
        ) as server:
            codes = await refuse_or_serve(server, sockets)
            assert codes == ({4400, 4403} if sockets == "refused" else {1000})
            os.kill(server.pid, signal.SIGTERM)
            started = time.monotonic()
            while not exited(server.pid) and time.monotonic() - started < QUIET_EXIT_BOUND + 5:
                await asyncio.sleep(0.05)
            took = time.monotonic() - started
            print(f"{kind} exited {took:.1f}s after SIGTERM, after {sockets} sockets")
            assert took < QUIET_EXIT_BOUND, f"{kind} took {took:.1f}s to exit"
            log = server.log.read_text(errors="replace")
            assert not [noise for noise in NOISE if noise in log], log
    finally:
        store.stop()
