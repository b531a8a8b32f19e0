"""The pieces that keep a queue socket true, in process (README "Live updates
(WebSocket)"): the settings, snapshot pages and the worst-case entry, the resync budget,
the position verdict, and the consumer's check on a real channels-redis layer."""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox.conf import outbox_settings
from django_outbox.core.entry import Entry
from django_outbox.core.rules import (
    MAX_ERROR_CHARS,
    MAX_MODEL_BYTES,
    MAX_REASON_CHARS,
    MAX_USER_ID_CHARS,
    ErrorKind,
    entry_for_viewer,
    max_entry_json_bytes,
    min_snapshot_frame_bytes,
)
from django_outbox.outbox import get_outbox
from django_outbox.ws.publish import group_name
from django_outbox.ws.routing import websocket_urlpatterns
from django_outbox.ws.truth import ResyncBudget, SocketState, is_behind, snapshot_frames
from tests.support.helpers import aaccept, redis_channel_layers

POLICY = "tests.support.policies.own_workspace"
FULL = 102_400


# -- settings ------------------------------------------------------------------------------


def test_the_live_settings_have_documented_defaults():
    config = outbox_settings().config
    assert config.ws_check_interval == 30.0
    assert config.ws_resync_interval == 1.0
    assert config.ws_resync_budget == 30
    assert config.ws_max_frame_bytes == 768 * 1024


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("WS_CHECK_INTERVAL", 0, "must be positive"),
        ("WS_CHECK_INTERVAL", -1, "non-negative"),
        ("WS_CHECK_INTERVAL", "30", "number of seconds"),
        ("WS_RESYNC_INTERVAL", float("inf"), "finite"),
        ("WS_RESYNC_BUDGET", 0, "integer >= 1"),
        ("WS_RESYNC_BUDGET", True, "integer >= 1"),
        ("WS_MAX_FRAME_BYTES", 256 * 1024, "so that one entry of MAX_TEXT_BYTES"),
    ],
)
def test_wrong_live_settings_are_refused_by_name(key, value, message):
    with override_settings(OUTBOX={key: value}):
        with pytest.raises(ImproperlyConfigured, match=key) as raised:
            outbox_settings()
    assert message in str(raised.value)


def test_durations_take_timedeltas_and_the_frame_bound_follows_the_text_bound():
    with override_settings(OUTBOX={"WS_CHECK_INTERVAL": timedelta(minutes=1)}):
        assert outbox_settings().config.ws_check_interval == 60.0
    small = {"MAX_TEXT_BYTES": 1000, "WS_MAX_FRAME_BYTES": min_snapshot_frame_bytes(1000)}
    with override_settings(OUTBOX=small):
        assert outbox_settings().config.ws_max_frame_bytes < 64 * 1024


# -- the worst entry and the pages ---------------------------------------------------------


def worst_entry() -> Entry:
    """Every bounded field at its bound, in the characters JSON escapes most."""
    model = {"m": "x" * (MAX_MODEL_BYTES - 8)}
    assert len(json.dumps(model, ensure_ascii=False, separators=(",", ":"))) <= MAX_MODEL_BYTES
    return Entry(
        id="e" * 128,
        client_message_id='"' * 128,
        user_id="\x01" * MAX_USER_ID_CHARS,
        text="\x01" * FULL,
        accepted_at="2026-01-01T00:00:00.000000Z",
        status="parked",
        model=model,
        attempts=2**62,
        last_attempt_at="2026-01-01T00:00:00.000000Z",
        verify_attempts=2**62,
        transient_fails=2**62,
        next_attempt_at="2026-01-01T00:00:00.000000Z",
        last_error="\x01" * MAX_ERROR_CHARS,
        reason="\x01" * MAX_REASON_CHARS,
        parked_from="delivering",
        delivered_at="2026-01-01T00:00:00.000000Z",
        seq=2**62,
        blocked_by_in_flight=True,
        in_flight_for=1e300,
    )


def test_one_worst_case_entry_always_fits_a_default_frame():
    entry = worst_entry().to_dict()
    # as staff read it: the stored error, its kind (the longest) and a status besides
    shown = {
        **entry_for_viewer(entry, excerpt=True),
        "errorKind": max((k.value for k in ErrorKind), key=len),
        "errorStatus": 599,
    }
    for each in (entry, shown):
        assert len(json.dumps(each, ensure_ascii=False).encode()) <= max_entry_json_bytes(FULL)
    frames = snapshot_frames("w" * 128, "s" * 128, 2**63, [entry, entry], 768 * 1024)
    assert len(frames) == 2  # one entry a page
    assert all(len(f.encode()) <= min_snapshot_frame_bytes(FULL) for f in frames)
    assert min_snapshot_frame_bytes(FULL) <= 768 * 1024 < 1024 * 1024  # daphne's limit


def test_pages_keep_order_and_version_and_stay_under_the_bound():
    entries = [{"id": f"e{i}", "text": "x" * (1000 + i)} for i in range(50)]
    frames = snapshot_frames("w1", "s1", 7, entries, 10_000)
    pages = [json.loads(f) for f in frames]
    assert len(pages) > 5
    assert all(len(f.encode()) <= 10_000 for f in frames)
    assert [p["page"] for p in pages] == list(range(1, len(pages) + 1))
    assert {p["pages"] for p in pages} == {len(pages)}
    assert {p["version"] for p in pages} == {7}
    assert [e for p in pages for e in p["entries"]] == entries
    (one,) = (json.loads(f) for f in snapshot_frames("w1", "s1", 3, entries[:2], 10_000))
    assert one == {
        "type": "queue.snapshot",
        "workspaceID": "w1",
        "sessionID": "s1",
        "version": 3,
        "page": 1,
        "pages": 1,
        "entries": entries[:2],
    }
    (empty,) = snapshot_frames("w1", "s1", 3, [], 10_000)
    assert json.loads(empty)["entries"] == []


# -- the budget and the verdict ------------------------------------------------------------


def test_the_resync_budget_is_a_sliding_minute():
    now = [0.0]
    budget = ResyncBudget(3, clock=lambda: now[0])
    assert [budget.spend() for _ in range(3)] == [True, True, True]
    assert budget.spend() is False  # a fourth inside the minute
    now[0] = 59.0
    assert budget.spend() is False
    now[0] = 61.0  # the first ones have left the window
    assert budget.spend() is True


@pytest.mark.parametrize(
    ("version", "empty", "held", "before", "behind"),
    [
        (5, False, 5, 5, False),  # in step
        (5, False, 7, 5, True),  # Valkey ahead: something was lost
        (5, False, 3, 5, True),  # Valkey went down: it lost data
        (6, False, 5, 5, False),  # an update arrived during the read
        (5, False, None, 5, True),  # the session was cleaned and the socket not told
        (9, True, None, 9, False),  # the socket shows the empty session already
        (None, False, 1, None, True),  # no snapshot yet
    ],
)
def test_the_position_verdict(version, empty, held, before, behind):
    state = SocketState(version=version, empty_view=empty)
    assert is_behind(state, held, before) is behind


# -- the consumer on a real channel layer --------------------------------------------------


@pytest.fixture
def fast_layers(valkey):
    config = redis_channel_layers(valkey, capacity=100, expiry=10)
    outbox = {"ACCESS_POLICY": POLICY, "WS_CHECK_INTERVAL": 0.2, "WS_RESYNC_INTERVAL": 0.2}
    with override_settings(CHANNEL_LAYERS=config, OUTBOX=outbox):
        yield config


def communicator(user):
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), "/ws/outbox/workspaces/alice/sessions/s1/"
    )
    comm.scope["user"] = user
    return comm


def alice():
    return SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")


async def receive(comm, timeout=5):
    return json.loads(await comm.receive_from(timeout))


async def finish(comm):
    await comm.disconnect()
    await get_outbox().aclose()
    layer = get_channel_layer()
    await layer.flush()
    await layer.close_pools()


async def test_a_version_that_went_down_gets_a_fresh_snapshot(fast_layers, r):
    await aaccept(get_outbox(), "k1", ws="alice")
    comm = communicator(alice())
    await comm.connect()
    first = await receive(comm)
    # Valkey lost data (a restart from an old file): the version is below the socket's.
    r.set(get_outbox().keys.session("alice", "s1").version, first["version"] - 5)
    again = await receive(comm)
    assert again["type"] == "queue.snapshot" and again["version"] == first["version"] - 5
    await finish(comm)


async def test_no_frame_follows_a_decided_close(fast_layers):
    user = alice()
    comm = communicator(user)
    await comm.connect()
    await receive(comm)
    user.is_active = False  # access gone (the check re-asks the policy)
    closed = await comm.receive_output(5)
    assert closed == {"type": "websocket.close", "code": 4403}
    # An update published after the close was decided is not relayed.
    layer = get_channel_layer()
    await layer.group_send(
        group_name("alice", "s1"), {"type": "queue.update", "version": 10**9, "state": "queued"}
    )
    assert await comm.receive_nothing(0.5)
    await finish(comm)


async def test_snapshot_pages_of_non_ascii_prompts_stay_within_the_frame_bound_in_bytes(
    fast_layers,
):
    """The bound is in UTF-8 bytes, not characters: prompts of three-byte characters
    (``€``) are paged so that no frame the socket sends is larger."""
    bound = min_snapshot_frame_bytes(1000)
    settings = {
        **fast_layers_outbox(),
        "MAX_TEXT_BYTES": 1000,
        "WS_MAX_FRAME_BYTES": bound,
        "CAP": 60,
    }
    with override_settings(OUTBOX=settings):
        texts = [f"{i:03d}" + "€" * 332 for i in range(60)]  # 999 bytes, 335 characters
        for i, text in enumerate(texts):
            await aaccept(get_outbox(), f"k{i}", text, ws="alice", user=f"u{i}")
        comm = communicator(alice())
        await comm.connect()
        frames = [await comm.receive_from(5)]
        while json.loads(frames[-1])["page"] < json.loads(frames[-1])["pages"]:
            frames.append(await comm.receive_from(5))
        assert len(frames) > 1
        assert all(len(f.encode()) <= bound for f in frames), [len(f.encode()) for f in frames]
        assert [e["text"] for f in frames for e in json.loads(f)["entries"]] == texts
        await finish(comm)


def fast_layers_outbox() -> dict:
    """The ``OUTBOX`` the ``fast_layers`` fixture sets."""
    from django.conf import settings

    return dict(settings.OUTBOX)
