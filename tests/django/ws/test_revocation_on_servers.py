"""Revoked credentials close live queue sockets, through real servers
(docs/explanation/security.md#live-connections).

Two server processes of one project — uvicorn and daphne — serve
``tests.support.asgi.revoke`` (settings ``tests.support.settings.revoke``) on one sqlite
file and one channel layer (channels-redis in its own database of the test Valkey), with
``WS_CHECK_INTERVAL`` 30 s, its default: a socket closed within :data:`WINDOW` was closed
by a pushed revocation or a resync, not by the periodic check. The access policy needs
the permission ``django_outbox.view_outboxentry`` (held directly or through a group).
Users change in a third process (``tests.support.children.revoker``), the way a view, the
admin or a shell changes them. Clients are ``websockets`` clients with alice's session
cookie or a DRF token (the documented token middleware, ``tests.support.ws_auth``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from channels.layers import get_channel_layer
from django.test import override_settings
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from django_outbox.outbox import Outbox
from tests.support.helpers import redis_channel_layers
from tests.support.live_server import Server, layer_url, serve
from tests.support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

APP = "tests.support.asgi.revoke:application"
SETTINGS = "tests.support.settings.revoke"
#: Seconds from a revocation to the close of every socket it concerns (DESIGN 19.5: about 2 s).
WINDOW = 2.0
#: Seconds any other wait may take on a loaded two-core machine.
BOUND = 10.0


def _env(check: float) -> dict[str, str]:
    return {"DJANGO_SETTINGS_MODULE": SETTINGS, "OUTBOX_TEST_WS": f"{check},0.5,30"}


@pytest.fixture(scope="module")
def pair(valkey, tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """uvicorn and daphne, one project: one database, one channel layer."""
    tmp = tmp_path_factory.mktemp("revoke")
    with serve("uvicorn", valkey, tmp / "uvicorn", app=APP, **_env(30)) as first:
        with serve("daphne", valkey, tmp / "daphne", app=APP, db=first.db, **_env(30)) as second:
            yield first, second


class Revoker:
    """The revoker child (tests/support/children/revoker.py), one command at a time."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def call(self, op: str, **args: str) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        answer = json.loads(self.proc.stdout.readline())
        assert answer["ok"], answer.get("error")
        return answer

    async def __call__(self, op: str, **args: str) -> dict:
        """Run ``op`` in the child (off the event loop): ``{"at": <time.time() just before
        the change>, "value": ...}``."""
        return await asyncio.to_thread(self.call, op, **args)


@contextmanager
def revoker_process(valkey: str, db) -> Iterator[Revoker]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": SETTINGS,
        "TEST_DB": str(db),
        "OUTBOX_VALKEY_URL": valkey,
        "OUTBOX_TEST_LAYER_URL": layer_url(valkey),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.children.revoker"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert json.loads(proc.stdout.readline())["ready"]
        yield Revoker(proc)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.fixture(scope="module")
def revoker_child(pair, valkey) -> Iterator[Revoker]:
    with revoker_process(valkey, pair[0].db) as child:
        yield child


@pytest.fixture
async def revoker(revoker_child) -> Revoker:
    """The revoker, with alice as every test starts: active, her password, the permission."""
    await revoker_child("reset")
    return revoker_child


@pytest.fixture
async def core(valkey):
    """The test's outbox, publishing through the servers' channel layer."""
    config = redis_channel_layers(layer_url(valkey))
    with override_settings(CHANNEL_LAYERS=config):
        outbox = Outbox(url=valkey, user_max_queued=0, user_accepts_per_minute=0, cap=100)
        yield outbox
        await outbox.aclose()
        outbox.close()
        await get_channel_layer().close_pools()


class Watcher:
    """One open queue socket: its frames, and when (``time.time()``) and how it closed."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[dict] = []
        self.closed_at: float | None = None
        self.code: int | None = None
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for raw in self.ws:
                self.frames.append(json.loads(raw))
        except ConnectionClosed:
            pass
        self.closed_at = time.time()
        self.code = self.ws.close_code

    async def until(self, predicate, timeout: float = BOUND) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self):
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {timeout}s; frames {self.frames[-3:]}")
            await asyncio.sleep(0.01)

    async def closed(self, timeout: float = BOUND) -> int | None:
        """Wait for the close; its code."""
        await asyncio.wait_for(asyncio.shield(self._reader), timeout)
        return self.code

    async def still_open(self) -> None:
        """A resync is still answered (a snapshot, or ``queue.current`` when nothing
        changed): the socket was not closed."""
        before = len(self.frames)
        await self.ws.send('{"type": "resync"}')
        answers = ("queue.snapshot", "queue.current")
        await self.until(lambda w: any(f["type"] in answers for f in w.frames[before:]))
        assert self.closed_at is None

    async def close(self) -> None:
        await self.ws.close()
        await self.closed()


#: Every socket a test opened, closed at its end whatever happened (see :func:`_closed`).
OPENED: list[Watcher] = []


@pytest.fixture(autouse=True)
async def _closed():
    yield
    while OPENED:
        watcher = OPENED.pop()
        watcher.ws.transport.abort()
        await asyncio.wait([watcher._reader], timeout=5)


async def watch(server: Server, headers: dict[str, str], ses: str = "s1") -> Watcher:
    """Open alice's queue socket on ``server`` and wait for its snapshot."""
    ws = await connect(server.queue_url("alice", ses), additional_headers=headers)
    watcher = Watcher(ws)
    OPENED.append(watcher)
    await watcher.until(lambda w: any(f["type"] == "queue.snapshot" for f in w.frames))
    return watcher


def cookie(key: str) -> dict[str, str]:
    return {"Cookie": f"sessionid={key}"}


def token(key: str) -> dict[str, str]:
    return {"Authorization": f"Token {key}"}


# -- the credential is re-validated: scope["outbox_revalidate"] ---------------------------


@pytest.mark.parametrize("side", [0, 1], ids=["uvicorn", "daphne"])
async def test_a_deleted_token_closes_at_the_next_resync_without_a_snapshot(
    pair, revoker, core, side
):
    await core.aaccept("alice", "s1", user_id="u", client_message_id="k1", text="secret plan")
    key = (await revoker("token"))["value"]
    watcher = await watch(pair[side], token(key))
    await revoker("delete_token", key=key)
    before = len(watcher.frames)
    await watcher.ws.send('{"type": "resync"}')
    assert await watcher.closed() == 4403
    assert watcher.frames[before:] == []  # no snapshot: the prompt's text never went out


@pytest.fixture(scope="module", params=["uvicorn", "daphne"])
def checking(request, pair, valkey, tmp_path_factory) -> Iterator[Server]:
    """A server of the same project whose periodic check runs every 0.4 s."""
    tmp = tmp_path_factory.mktemp(f"checking-{request.param}")
    with serve(request.param, valkey, tmp, app=APP, db=pair[0].db, **_env(0.4)) as server:
        yield server


async def test_a_deleted_token_closes_at_the_next_periodic_check(checking, revoker, core):
    key = (await revoker("token"))["value"]
    watcher = await watch(checking, token(key))
    await revoker("delete_token", key=key)
    assert await watcher.closed() == 4403
    await core.aaccept("alice", "s1", user_id="u", client_message_id="k1", text="secret plan")
    assert [f for f in watcher.frames if f["type"] == "queue.update"] == []


async def test_a_valid_token_stays_open_through_checks_and_resyncs(checking, revoker, core):
    key = (await revoker("token"))["value"]
    watcher = await watch(checking, token(key))
    entry = await core.aaccept("alice", "s1", user_id="u", client_message_id="k1", text="x")
    await watcher.until(lambda w: any(f.get("entry", {}).get("id") == entry.id for f in w.frames))
    await asyncio.sleep(1.0)  # the scenario: two periodic checks pass
    await watcher.still_open()
    await watcher.close()


# -- revocations Django knows reach every server process ---------------------------------

#: What the revoker changes, and what it must do first (alice holds the permission through
#: the group ``watchers`` for the group cases).
REVOCATIONS = {
    "password": None,
    "deactivate": None,
    "revoke_direct": None,
    "leave_group": "via_group",
    "clear_groups": "via_group",
    "group_loses_permission": "via_group",
}


async def both_sides(pair, headers, ses="s1") -> list[Watcher]:
    return [await watch(server, headers, ses) for server in pair]


def window(watchers: list[Watcher], at: float) -> float:
    """Seconds from the revocation to the last of ``watchers`` closing."""
    assert all(w.closed_at is not None for w in watchers)
    return max(w.closed_at for w in watchers) - at  # type: ignore[type-var]


@pytest.mark.parametrize("change", list(REVOCATIONS))
async def test_a_revocation_closes_the_users_sockets_in_every_server(pair, revoker, change):
    if REVOCATIONS[change]:
        await revoker(REVOCATIONS[change])
    key = (await revoker("login"))["value"]
    watchers = await both_sides(pair, cookie(key))
    at = (await revoker(change))["at"]
    assert [await w.closed() for w in watchers] == [4403, 4403]
    assert window(watchers, at) < WINDOW


async def test_a_logout_closes_that_sessions_sockets_and_no_other(pair, revoker):
    ended = (await revoker("login"))["value"]
    other = (await revoker("login"))["value"]  # alice, logged in elsewhere too
    ending = await both_sides(pair, cookie(ended))
    staying = await both_sides(pair, cookie(other), ses="s2")
    at = (await revoker("logout", session=ended))["at"]
    assert [await w.closed() for w in ending] == [4403, 4403]
    assert window(ending, at) < WINDOW
    for watcher in staying:
        await watcher.still_open()
        await watcher.close()


async def test_a_token_socket_closes_when_its_user_is_deactivated(pair, revoker):
    key = (await revoker("token"))["value"]
    watchers = await both_sides(pair, token(key))
    at = (await revoker("deactivate"))["at"]
    assert [await w.closed() for w in watchers] == [4403, 4403]
    assert window(watchers, at) < WINDOW


async def test_a_change_that_takes_no_right_away_closes_nothing(pair, revoker):
    key = (await revoker("login"))["value"]
    watchers = await both_sides(pair, cookie(key))
    await revoker("touch_login")  # what every login does to the user row
    await revoker("via_group")  # the permission moves to a group: still held
    for watcher in watchers:
        await watcher.still_open()
        await watcher.close()


async def test_the_revocation_window(pair, revoker):
    """The figure docs/explanation/security.md states: logouts with a socket on each server,
    revocation to the last close."""
    windows = []
    for _ in range(20):
        key = (await revoker("login"))["value"]
        watchers = await both_sides(pair, cookie(key))
        at = (await revoker("logout", session=key))["at"]
        for w in watchers:
            assert await w.closed() == 4403
        windows.append(window(watchers, at))
    p50, worst = statistics.median(windows), max(windows)
    print(
        f"revocation to close, 20 logouts x 2 servers: p50 {p50 * 1000:.0f} ms, "
        f"max {worst * 1000:.0f} ms"
    )
    assert worst < WINDOW


# -- a close decided as the client leaves ------------------------------------------------


@pytest.fixture(scope="module", params=["websockets", "websockets-sansio", "wsproto", "daphne"])
def any_server(request, pair, valkey, tmp_path_factory) -> Iterator[Server]:
    """uvicorn with each of its WebSocket implementations, and daphne."""
    kind = "daphne" if request.param == "daphne" else "uvicorn"
    tmp = tmp_path_factory.mktemp(f"leaving-{request.param}")
    env = {**_env(30), "UVICORN_WS": request.param}
    with serve(kind, valkey, tmp, app=APP, db=pair[0].db, **env) as server:
        yield server


@pytest.mark.parametrize("how", ["resync", "revocation"])
async def test_a_refusal_decided_as_the_client_leaves_logs_no_error(
    any_server, revoker, core, r, how
):
    key = (await revoker("login"))["value"]
    watcher = await watch(any_server, cookie(key))
    logged = any_server.log.stat().st_size
    r.set("test:slow:alice", 0.5)  # the re-check takes a while, and refuses
    if how == "resync":
        r.set("test:revoked:alice", 1)
        await watcher.ws.send('{"type": "resync"}')
    else:  # a logout elsewhere, a permission removed: pushed
        await revoker("revoke_direct")
    await watcher.ws.close()  # the client leaves meanwhile (its page unloads)
    watching = core.keys.session("alice", "s1").watch
    deadline = time.monotonic() + BOUND
    while r.get(watching) not in (None, "0"):  # the server handled the disconnect
        assert time.monotonic() < deadline, "the socket was never released"
        await asyncio.sleep(0.05)
    text = any_server.log.read_bytes()[logged:].decode(errors="replace")
    assert "Unexpected ASGI message" not in text
    assert "Traceback" not in text and "ERROR" not in text and "failed" not in text, text
