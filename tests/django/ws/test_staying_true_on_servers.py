"""Open queue sockets stay true, through real servers (README "Live updates (WebSocket)").

uvicorn and daphne subprocesses serve ``tests.support.asgi.live`` (tests/support/live_server.py)
with the channel layer (channels-redis, ``group_expiry`` 2 s standing in for a day) in its own
database of the test Valkey, ``WS_CHECK_INTERVAL`` 0.4 s, ``WS_RESYNC_INTERVAL`` 0.5 s and
``WS_RESYNC_BUDGET`` 30. Clients are raw ``websockets`` clients with alice's login session
cookie. Every wait has a deadline: ``BOUND`` is the convergence bound (check interval, a grace
for updates on their way, the resync interval, a snapshot) with room for a loaded two-core
machine.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import pytest
import redis
from channels.layers import get_channel_layer
from django.test import override_settings
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from django_outbox.outbox import Outbox
from django_outbox.ws.publish import group_name
from tests.support.helpers import redis_channel_layers
from tests.support.live_server import layer_url, serve

pytestmark = [pytest.mark.slow, pytest.mark.standalone]

CHECK, RESYNC_INTERVAL, BUDGET = 0.4, 0.5, 30
BOUND = 5.0  # seconds: CHECK + grace + RESYNC_INTERVAL + a snapshot, with ample room
FRAME_BOUND = 768 * 1024  # WS_MAX_FRAME_BYTES' default
FULL = 100 * 1024  # MAX_TEXT_BYTES' default


@pytest.fixture(scope="module", params=["uvicorn", "daphne"])
def server(request, valkey, tmp_path_factory):
    with serve(
        request.param,
        valkey,
        tmp_path_factory.mktemp(request.param),
        OUTBOX_TEST_GROUP_EXPIRY="2",
        OUTBOX_TEST_WS=f"{CHECK},{RESYNC_INTERVAL},{BUDGET}",
    ) as running:
        yield running


@pytest.fixture
async def core(valkey):
    """The test's outbox, publishing through the servers' channel layer."""
    config = redis_channel_layers(layer_url(valkey), group_expiry=2)
    with override_settings(CHANNEL_LAYERS=config):
        outbox = Outbox(url=valkey, user_max_queued=0, user_accepts_per_minute=0, cap=100)
        yield outbox
        await outbox.aclose()
        outbox.close()
        await get_channel_layer().close_pools()


@pytest.fixture
def layer(valkey):
    client = redis.Redis.from_url(layer_url(valkey), decode_responses=True)
    yield client
    client.close()


class View:
    """A client's view of the queue: assembled snapshots, then updates."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.entries: dict[str, str] = {}
        self.version: int | None = None
        self.snapshots = 0
        self.currents = 0  # queue.current: answers to a resync when nothing changed
        self.pages: list[dict] = []
        self.largest = 0

    async def frame(self, timeout: float) -> dict:
        raw = await asyncio.wait_for(self.ws.recv(), timeout)
        self.largest = max(self.largest, len(raw.encode()))
        message = json.loads(raw)
        if message["type"] == "queue.snapshot":
            self.pages.append(message)
            if message["page"] == message["pages"]:
                assert [p["page"] for p in self.pages] == list(range(1, message["pages"] + 1))
                assert {p["version"] for p in self.pages} == {message["version"]}
                self.entries = {e["id"]: e["status"] for p in self.pages for e in p["entries"]}
                self.version = message["version"]
                self.snapshots += 1
                self.pages = []
        elif message["type"] == "queue.update":
            if message["state"] in ("sent", "dismissed"):
                self.entries.pop(message["entry"]["id"], None)
            else:
                self.entries[message["entry"]["id"]] = message["entry"]["status"]
            self.version = max(self.version or 0, message["version"])
        elif message["type"] == "queue.current":
            self.currents += 1
        if isinstance(message.get("ack"), str):  # read: acknowledge it, as outbox.js does
            await self.ws.send(json.dumps({"type": "ack", "ack": message["ack"]}))
        return message

    async def until(self, predicate, timeout: float = BOUND) -> list[dict]:
        """Read frames until ``predicate(self)`` holds; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        seen = []
        while not predicate(self):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"not within {timeout}s; frames: {seen[-5:]}")
            try:
                seen.append(await self.frame(left))
            except TimeoutError:
                continue
        return seen


async def opened(server, ses: str = "s1") -> View:
    ws = await connect(server.queue_url("alice", ses), additional_headers=server.headers)
    view = View(ws)
    await view.until(lambda v: v.snapshots == 1)
    return view


async def accept(core: Outbox, key: str, text: str | None = None, ses: str = "s1"):
    return await core.aaccept("alice", ses, user_id="u", client_message_id=key, text=text or key)


async def close_code(view: View, timeout: float = BOUND) -> tuple[int, str, list[dict]]:
    """Read until the server closes; (code, reason, frames read meanwhile)."""
    frames = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            frames.append(await view.frame(deadline - time.monotonic()))
    except ConnectionClosed as closed:
        rcvd = closed.rcvd
        return (rcvd.code if rcvd else None), (rcvd.reason if rcvd else ""), frames
    raise AssertionError(f"the socket stayed open {timeout}s; frames: {frames[-3:]}")


# -- convergence whatever the channel layer loses -------------------------------------------


async def test_a_flushed_channel_layer_converges_and_rejoins(server, core, layer):
    view = await opened(server)
    group = f"asgi:group:{group_name('alice', 's1')}"
    assert layer.zcard(group) == 1
    layer.flushdb()  # a layer restart without persistence: every membership is gone
    entry = await accept(core, "k1")
    await view.until(lambda v: entry.id in v.entries)  # by a snapshot: the update was lost
    assert view.snapshots == 2
    await view.until(lambda v: layer.zcard(group) == 1, timeout=BOUND)  # re-joined
    second = await accept(core, "k2")
    frames = await view.until(lambda v: second.id in v.entries)
    assert frames[-1]["type"] == "queue.update"  # live again, not by the next check
    await view.ws.close()


async def test_a_day_old_watcher_is_not_forgotten_by_group_expiry(server, core, layer):
    view = await opened(server)
    await asyncio.sleep(3)  # the scenario: idle longer than group_expiry (2 s here)
    entry = await accept(core, "k1")
    frames = await view.until(lambda v: entry.id in v.entries)
    # The check re-joined the group all along: the update itself arrived.
    assert frames[-1]["type"] == "queue.update"
    group = f"asgi:group:{group_name('alice', 's1')}"
    assert time.time() - layer.zscore(group, layer.zrange(group, 0, 0)[0]) < 2
    await view.ws.close()


async def test_events_never_published_still_reach_the_watcher(server, core, r):
    view = await opened(server)
    watch = core.keys.session("alice", "s1").watch
    r.delete(watch)  # the watcher count expired (WATCH_TTL) or was flushed: no publishes
    entry = await accept(core, "k1")
    await view.until(lambda v: entry.id in v.entries)  # the check saw Valkey ahead
    assert view.snapshots == 2
    await view.until(lambda v: r.get(watch) == "1")  # counted again: published again
    second = await accept(core, "k2")
    frames = await view.until(lambda v: second.id in v.entries)
    assert frames[-1]["type"] == "queue.update"
    await view.ws.close()


async def test_a_cleaned_session_is_shown_empty(server, core):
    view = await opened(server)
    await accept(core, "k1")
    await view.until(lambda v: len(v.entries) == 1)
    before = view.version
    await core.acleanup_workspace("alice")
    await view.until(lambda v: v.entries == {})
    entry = await accept(core, "k2")
    await view.until(lambda v: list(v.entries) == [entry.id])
    assert view.version > before  # never backwards across the cleanup
    await view.ws.close()


# -- re-authorisation without the client asking ---------------------------------------------


async def test_a_revoked_watcher_is_closed_within_the_interval(server, core, r):
    view = await opened(server)
    r.set("test:revoked:alice", 1)
    started = time.monotonic()
    code, _, frames = await close_code(view)
    assert code == 4403 and time.monotonic() - started < BOUND
    assert frames == []
    await accept(core, "k1")  # nothing more reaches the closed socket (and no error)


@pytest.mark.parametrize("how", ["logout", "password"])
async def test_a_logged_out_watcher_is_closed(server, how):
    view = await opened(server, ses=f"s-{how}")
    db = sqlite3.connect(server.db)
    key = server.session_key
    session = db.execute(
        "SELECT session_data, expire_date FROM django_session WHERE session_key = ?", (key,)
    ).fetchone()
    password = db.execute("SELECT password FROM auth_user WHERE username = 'alice'").fetchone()
    try:
        if how == "logout":  # what logout() does: the session row is deleted
            db.execute("DELETE FROM django_session WHERE session_key = ?", (key,))
        else:  # another password: the session's auth hash no longer matches
            db.execute("UPDATE auth_user SET password = 'changed' WHERE username = 'alice'")
        db.commit()
        code, _, _ = await close_code(view)
        assert code == 4403
    finally:  # alice's login back, for the module's other tests
        db.execute("UPDATE auth_user SET password = ? WHERE username = 'alice'", password)
        db.execute("DELETE FROM django_session WHERE session_key = ?", (key,))
        db.execute(
            "INSERT INTO django_session (session_key, session_data, expire_date) VALUES (?, ?, ?)",
            (key, *session),
        )
        db.commit()
        db.close()


async def test_a_watcher_whose_session_now_logs_in_someone_else_is_closed(server):
    """A socket stays the user's it connected as: when its session comes to log in another
    account (here a staff one, which may watch any workspace), the socket is closed 4403 at
    the next check, not carried on under the new account (README "Live updates")."""
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.contrib.auth.models import User
    from django.contrib.sessions.backends.db import SessionStore

    view = await opened(server, ses="s-someone-else")
    db = sqlite3.connect(server.db)
    key = server.session_key
    session = db.execute(
        "SELECT session_data, expire_date FROM django_session WHERE session_key = ?", (key,)
    ).fetchone()
    (password,) = db.execute("SELECT password FROM auth_user WHERE username = 'alice'").fetchone()
    staff_pk = db.execute(
        "INSERT INTO auth_user (password, is_superuser, username, first_name, last_name, email,"
        " is_staff, is_active, date_joined) VALUES (?, 1, 'root', '', '', '', 1, 1, '2026-01-01')",
        (password,),
    ).lastrowid
    staff = User(pk=staff_pk, username="root", password=password)
    data = SessionStore().encode(
        {
            SESSION_KEY: str(staff_pk),
            BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend",
            HASH_SESSION_KEY: staff.get_session_auth_hash(),
        }
    )
    try:
        db.execute("UPDATE django_session SET session_data = ? WHERE session_key = ?", (data, key))
        db.commit()
        code, _, _ = await close_code(view)
        assert code == 4403
    finally:  # alice's login back, for the module's other tests
        db.execute(
            "UPDATE django_session SET session_data = ? WHERE session_key = ?", (session[0], key)
        )
        db.execute("DELETE FROM auth_user WHERE id = ?", (staff_pk,))
        db.commit()
        db.close()


# -- resyncs: throttled, coalesced, bounded --------------------------------------------------


async def test_resyncs_coalesce_and_a_flood_closes_with_4429(server, core):
    await accept(core, "k1")
    view = await opened(server)
    for _ in range(5):
        await view.ws.send('{"type": "resync"}')
    # One answer for all five: a queue.current, since nothing changed since the snapshot.
    await view.until(lambda v: v.currents == 1)
    with pytest.raises(TimeoutError):  # and no other within two intervals
        await view.frame(2 * RESYNC_INTERVAL + 0.3)
    for _ in range(BUDGET):  # 5 + 30 > 30 in a minute
        await view.ws.send('{"type": "resync"}')
    code, reason, frames = await close_code(view)
    assert code == 4429
    assert reason == ("too many resyncs" if server.kind == "uvicorn" else "")  # daphne drops it
    assert sum(f["type"] == "queue.snapshot" for f in frames) <= 2


# -- snapshot pages and memory under unread floods -------------------------------------------


async def test_a_big_queue_comes_in_pages_under_the_frame_bound(server, core):
    text = '\x01"\\' * (FULL // 3)  # escapes to about 4 bytes a byte on the wire
    ids = [(await accept(core, f"k{i}", text)).id for i in range(20)]
    view = await opened(server)
    assert list(view.entries) == ids
    assert view.largest <= FRAME_BOUND
    ids.append((await accept(core, "k20", text)).id)
    await view.until(lambda v: list(v.entries) == ids)
    await view.ws.send('{"type": "resync"}')  # a new version since: a snapshot answers
    await view.until(lambda v: v.snapshots == 2)
    assert list(view.entries) == ids
    await view.ws.close()


@pytest.mark.parametrize("prompts", [9, 20])
async def test_memory_stays_flat_under_an_unread_resync_flood(server, core, prompts):
    """Nine full-size prompts make the largest snapshot the consumer used to send in one
    frame through daphne (under its 1 MiB); before the throttle, 600 unread resyncs grew
    daphne from 80 MB to 305 MB within 20 s. Twenty make a paged snapshot."""
    for i in range(prompts):
        await accept(core, f"k{i}", "x" * FULL)
    before = server.rss_kib()
    ws = await connect(server.queue_url(), additional_headers=server.headers, max_queue=1)
    sent = 0
    started = time.monotonic()
    try:
        for _ in range(600):  # without ever reading
            await asyncio.wait_for(ws.send('{"type": "resync"}'), 5)
            sent += 1
    except (ConnectionClosed, TimeoutError):
        pass
    peak = server.rss_kib()
    for _ in range(20):  # what the server does with it over the next 5 s
        await asyncio.sleep(0.25)
        peak = max(peak, server.rss_kib())
    ws.transport.abort()
    growth = (peak - before) / 1024
    print(
        f"{server.kind}, {prompts} prompts: RSS {before / 1024:.0f} MB before, peak "
        f"{peak / 1024:.0f} MB after {sent} unread resyncs sent in "
        f"{time.monotonic() - started:.1f}s"
    )
    assert growth < 64, f"server RSS grew {growth:.0f} MB"
