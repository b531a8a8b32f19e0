"""Every state an entry can be in, against every operation on an entry or its session.

Each row puts one entry, ``x``, in one state (with two pending prompts ``b`` and ``c``
accepted after it), runs one operation through the public API, and asserts the answer the
operation gives (the enum the REST API maps to its status and code). A refusal must leave
the keyspace exactly as it was: every key, every value (tests/support/keyspace.py). An
allowed operation must leave the entry in the state, place and indices its new state
calls for, and bump the session's version.

The rows follow the scripts' guards (docs/explanation/storage.md, "The Lua scripts";
docs/howto/steering.md; docs/howto/cutting.md; docs/explanation/lifecycle.md, "Parking a
workspace"): lib/operator.lua's ``locate`` (busy under a live lease, not found once
delivered), lib/steering.lua's ``pinned`` (being verified, held by the lease, parked from
either), lib/cut.lua's ``in_flight``, ``send_now``'s pending-only rule, ``move``'s floor,
park's and unpark's state lists and accept's ``ifBusy``. Every guard is decided both ways
by at least one row.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import pytest

from django_outbox import (
    CancelResult,
    DismissResult,
    EditResult,
    InterruptResult,
    MoveResult,
    RetryResult,
    SendNowResult,
    Status,
)
from django_outbox.core.entry import format_time
from django_outbox.core.scripts import claim_argv
from django_outbox.errors import CutNotSupported, SessionBusy
from tests.support.helpers import accept, make_entry
from tests.support.keyspace import assert_indices_agree, keyspace, keyspace_diff

pytestmark = pytest.mark.standalone  # the dump walks one server's keys

WS, SES = "w1", "s1"
HOLDER = "matrix-holder"  # the lease token of the claims below
REASON = "maintenance"


async def _abort(entry, **kwargs):
    """An aborter that accepts every cut (the holder's side is tested in tests/delivery)."""


@pytest.fixture
def ob(make_outbox):
    return make_outbox(aborter=_abort, history_window=3600)


# --- the states ---------------------------------------------------------------------


def _now_us() -> int:
    return int(time.time() * 1_000_000)


def _seed(outbox, **fields) -> str:
    """Seed entry ``x`` as it is (status and all) at the queue's tail (staging when
    delivering); returns its ID."""
    entry = make_entry("x", client_message_id="kx", **fields)
    outbox.seed_entry_for_test(WS, SES, entry.to_json())
    return entry.id


def _claim(outbox, r) -> None:
    """Take the session's lease as a worker does (claim.lua), and keep it: the holder is
    alive for the rest of the row (its lease outlasts the test)."""
    outbox.run_script("claim", WS, SES, claim_argv(HOLDER, 600_000))
    assert r.get(outbox.keys.session(WS, SES).lock).startswith(HOLDER)


def _then_b_c(outbox) -> dict[str, str]:
    return {"b": accept(outbox, "kb", "b").id, "c": accept(outbox, "kc", "c").id}


def build(state: str, outbox, r) -> dict[str, str]:
    """Put entry ``x`` in ``state`` with pending ``b`` and ``c`` behind it; return the
    IDs by name."""
    if state in ("pending", "parked", "in_flight", "orphaned", "parked_in_flight", "ended"):
        ids = {"x": accept(outbox, "kx", "x").id, **_then_b_c(outbox)}
        if state in ("in_flight", "orphaned", "parked_in_flight"):
            _claim(outbox, r)
        if state == "orphaned":  # the holder died: its lease expired, its staging stayed
            r.delete(outbox.keys.session(WS, SES).lock)
        if state in ("parked", "parked_in_flight"):
            outbox.park_workspace(WS, REASON)
        if state == "ended":
            assert outbox.cancel(WS, SES, ids["x"]) is CancelResult.REMOVED
        return ids
    now = _now_us()
    seeds: dict[str, dict[str, Any]] = {
        # Verified again after a backoff: due a minute from now.
        "verifying": {"status": Status.VERIFYING, "next_attempt_at": format_time(now + 60_000_000)},
        "being_verified": {"status": Status.VERIFYING},
        "parked_verifying": {"status": Status.VERIFYING},
        "error": {"status": Status.ERROR, "reason": "max_attempts"},
        "expired": {"status": Status.EXPIRED},
        # Past its expiresAt, not yet claimed: the next claim would mark it expired.
        "expired_unswept": {"status": Status.PENDING, "expires_at": format_time(now - 60_000_000)},
        # Delivered; its entry_delivered signal is still owed (its holder died).
        "owed": {"status": Status.DELIVERING, "delivered_at": format_time(now)},
    }
    ids = {"x": _seed(outbox, **seeds[state]), **_then_b_c(outbox)}
    if state == "being_verified":
        _claim(outbox, r)
        assert r.get(outbox.keys.session(WS, SES).lock).endswith(" " + ids["x"])
    if state == "parked_verifying":
        outbox.park_workspace(WS, REASON)
    return ids


STATES = (
    "pending",
    "parked",  # parked from pending (the workspace is paused)
    "parked_verifying",
    "parked_in_flight",  # parked while staged under the lease
    "in_flight",  # claimed: staged under a live lease
    "orphaned",  # staged, its holder gone
    "verifying",
    "being_verified",  # verifying, the lease held for it
    "error",
    "expired",
    "expired_unswept",
    "owed",
    "ended",  # cancelled: gone from the session
)


# --- reading the session ------------------------------------------------------------


def _entries(outbox) -> dict[str, Any]:
    return {e.id: e for e in outbox.list(WS, SES)}


def _order(outbox, ids) -> list[str]:
    names = {v: k for k, v in ids.items()}
    return [names.get(e.id, e.id) for e in outbox.list(WS, SES)]


def _version(outbox, r) -> int:
    return int(r.get(outbox.keys.session(WS, SES).version) or 0)


def _endings(outbox, r) -> list[str]:
    return [" ".join(i.split()[:2]) for i in r.lrange(outbox.keys.session(WS, SES).ended, 0, -1)]


def _staged_ids(outbox, r) -> list[str]:
    return [
        i.split('"id":"')[1].split('"')[0]
        for i in r.lrange(outbox.keys.session(WS, SES).staging, 0, -1)
    ]


# --- the operations on entry x --------------------------------------------------------

OPS = {
    "cancel": lambda ob, ids: ob.cancel(WS, SES, ids["x"]),
    "dismiss": lambda ob, ids: ob.dismiss(WS, SES, ids["x"]),
    "edit": lambda ob, ids: ob.edit(WS, SES, ids["x"], text="edited"),
    "move_last": lambda ob, ids: ob.move(WS, SES, ids["x"], to="last"),
    "send_now": lambda ob, ids: ob.send_now(WS, SES, ids["x"]),
    "cut": lambda ob, ids: ob.cut(WS, SES, ids["x"]),
    # Stop naming x (docs/howto/cutting.md): x's turn is cut only while x is in flight.
    "stop": lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["x"]),
    "retry": lambda ob, ids: ob.retry(WS, SES, ids["x"]),
}

R, NF = CancelResult.REMOVED, CancelResult.NOT_FOUND
IF = CancelResult.IN_FLIGHT
#: state -> the answer of each operation on x in that state.
EXPECTED: dict[str, dict[str, Any]] = {
    "cancel": {
        **dict.fromkeys(("pending", "parked", "error", "expired", "expired_unswept"), R),
        **dict.fromkeys(
            (
                "parked_verifying",
                "parked_in_flight",
                "in_flight",
                "orphaned",
                "verifying",
                "being_verified",
            ),
            IF,
        ),
        **dict.fromkeys(("owed", "ended"), NF),
    },
    "dismiss": {
        **dict.fromkeys(
            (
                "pending",
                "parked",
                "parked_verifying",
                "orphaned",
                "verifying",
                "error",
                "expired",
                "expired_unswept",
            ),
            DismissResult.REMOVED,
        ),
        **dict.fromkeys(("parked_in_flight", "in_flight", "being_verified"), DismissResult.BUSY),
        **dict.fromkeys(("owed", "ended"), DismissResult.NOT_FOUND),
    },
    "edit": {
        **dict.fromkeys(
            ("pending", "parked", "error", "expired", "expired_unswept"), EditResult.UPDATED
        ),
        **dict.fromkeys(
            (
                "parked_verifying",
                "parked_in_flight",
                "in_flight",
                "orphaned",
                "verifying",
                "being_verified",
            ),
            EditResult.BUSY,
        ),
        **dict.fromkeys(("owed", "ended"), EditResult.NOT_FOUND),
    },
    "move_last": {
        **dict.fromkeys(
            ("pending", "parked", "error", "expired", "expired_unswept"), MoveResult.MOVED
        ),
        **dict.fromkeys(
            (
                "parked_verifying",
                "parked_in_flight",
                "in_flight",
                "orphaned",
                "verifying",
                "being_verified",
            ),
            MoveResult.BUSY,
        ),
        **dict.fromkeys(("owed", "ended"), MoveResult.NOT_FOUND),
    },
    "send_now": {
        **dict.fromkeys(("pending", "expired_unswept"), SendNowResult.MOVED),
        **dict.fromkeys(
            (
                "parked",
                "parked_verifying",
                "parked_in_flight",
                "in_flight",
                "orphaned",
                "verifying",
                "being_verified",
                "error",
                "expired",
            ),
            SendNowResult.BUSY,
        ),
        **dict.fromkeys(("owed", "ended"), SendNowResult.NOT_FOUND),
    },
    "cut": {
        **dict.fromkeys(
            ("pending", "parked", "error", "expired", "expired_unswept"), InterruptResult.QUEUED
        ),
        **dict.fromkeys(
            (
                "parked_verifying",
                "parked_in_flight",
                "in_flight",
                "orphaned",
                "verifying",
                "being_verified",
            ),
            InterruptResult.CUT,
        ),
        **dict.fromkeys(("owed", "ended"), InterruptResult.NOT_FOUND),
    },
    "stop": {
        **dict.fromkeys(
            (
                "pending",
                "parked",
                "error",
                "expired",
                "expired_unswept",
                "owed",
                "ended",
            ),
            InterruptResult.NOT_IN_FLIGHT,
        ),
        **dict.fromkeys(
            (
                "parked_verifying",
                "parked_in_flight",
                "in_flight",
                "orphaned",
                "verifying",
                "being_verified",
            ),
            InterruptResult.CUT,
        ),
    },
    "retry": {
        **dict.fromkeys(
            ("pending", "orphaned", "verifying", "error", "expired", "expired_unswept"),
            RetryResult.UPDATED,
        ),
        **dict.fromkeys(
            ("parked", "parked_verifying", "parked_in_flight", "in_flight", "being_verified"),
            RetryResult.BUSY,
        ),
        **dict.fromkeys(("owed", "ended"), RetryResult.NOT_FOUND),
    },
}

#: The answers that change something; every other answer must write nothing.
CHANGES = {
    CancelResult.REMOVED,
    DismissResult.REMOVED,
    EditResult.UPDATED,
    MoveResult.MOVED,
    SendNowResult.MOVED,
    SendNowResult.CUT,
    InterruptResult.CUT,
    RetryResult.UPDATED,
}


def _status_of(state: str) -> str:
    """x's stored status in each state."""
    return {
        "parked": "parked",
        "parked_verifying": "parked",
        "parked_in_flight": "parked",
        "in_flight": "delivering",
        "orphaned": "delivering",
        "verifying": "verifying",
        "being_verified": "verifying",
        "error": "error",
        "expired": "expired",
    }.get(state, "pending")


def _check_allowed(op: str, state: str, outbox, r, ids) -> None:
    """What an allowed operation left: x's state and place, the others in order."""
    x = ids["x"]
    entries = _entries(outbox)
    if op in ("cancel", "dismiss"):
        how = "cancelled" if op == "cancel" else "dismissed"
        assert x not in entries and x not in _staged_ids(outbox, r)
        assert _endings(outbox, r)[0] == f"{x} {how}"
        assert _order(outbox, ids) == ["b", "c"]
    elif op == "edit":
        assert entries[x].text == "edited"
        assert str(entries[x].status) == _status_of(state)
        assert _order(outbox, ids) == ["x", "b", "c"]
    elif op == "move_last":
        assert _order(outbox, ids) == ["b", "c", "x"]
        assert str(entries[x].status) == _status_of(state)
    elif op == "send_now":
        assert _order(outbox, ids) == ["x", "b", "c"]  # in front of every pending entry
        assert str(entries[x].status) == "pending"
    elif op in ("cut", "stop"):
        assert entries[x].interrupted is True
        assert r.get(outbox.keys.cut(WS, SES)) == x
        in_staging = state in ("in_flight", "orphaned", "parked_in_flight")
        assert (x in _staged_ids(outbox, r)) == in_staging
        if state == "verifying":  # due now, so its turn is aborted without waiting
            assert entries[x].next_attempt_at is None
    elif op == "retry":
        after = {"orphaned": "verifying", "verifying": "verifying"}.get(state, "pending")
        assert str(entries[x].status) == after
        assert entries[x].next_attempt_at is None  # due now
        # An expired prompt is retried without its expiry; a pending one keeps it.
        assert (entries[x].expires_at is None) == (state != "expired_unswept")
        assert x not in _staged_ids(outbox, r)


ROWS = [(op, state) for op in OPS for state in STATES]


@pytest.mark.parametrize(("op", "state"), ROWS, ids=[f"{op}-{state}" for op, state in ROWS])
def test_an_operation_on_an_entry_in_a_state(ob, r, signals_log, op, state):
    ids = build(state, ob, r)
    before, version = keyspace(r), _version(ob, r)
    signals_log.calls["updated"].clear()

    answer = OPS[op](ob, ids)

    assert answer is EXPECTED[op][state]
    if answer in CHANGES:
        assert _version(ob, r) > version
        _check_allowed(op, state, ob, r, ids)
        assert_indices_agree(r, ob, WS, SES)
        assert ids["x"] in signals_log.ids("updated")  # watchers are told
    else:
        assert keyspace_diff(before, keyspace(r)) == []
        assert signals_log.ids("updated") == []


def test_every_state_has_an_answer_for_every_operation():
    for op in OPS:
        assert set(EXPECTED[op]) == set(STATES), op


# --- operations that depend on the rest of the session --------------------------------
#
# Each row: a session built by ``setup`` (entries named as it says), one operation, its
# answer (an enum, or an exception type it raises), and, when it changes something, what
# ``check`` asserts about the session afterwards (None: the answer changes nothing, so the
# keyspace must not change at all).


def _pending(outbox, *names) -> dict[str, str]:
    return {n: accept(outbox, f"k{n}", n).id for n in names}


def _seeded(outbox, name, **fields) -> dict[str, str]:
    entry = make_entry(name, client_message_id=f"k{name}", **fields)
    outbox.seed_entry_for_test(WS, SES, entry.to_json())
    return {name: entry.id}


def verifying_head(outbox, r):
    """v is being verified (no lease), then b and x pending."""
    return {**_seeded(outbox, "v", status=Status.VERIFYING), **_pending(outbox, "b", "x")}


def verifying_head_leased(outbox, r):
    """v is being verified under the lease, then b and x pending."""
    ids = verifying_head(outbox, r)
    _claim(outbox, r)
    return ids


def parked_verifying_head(outbox, r):
    """v parked from verifying, b and x parked from pending (the workspace is paused)."""
    ids = verifying_head(outbox, r)
    outbox.park_workspace(WS, REASON)
    return ids


def turn_in_flight(outbox, r):
    """y staged under the lease (its turn runs), then b and x pending."""
    ids = _pending(outbox, "y", "b", "x")
    _claim(outbox, r)
    return ids


def turn_cut(outbox, r):
    """As turn_in_flight, y's turn cut already."""
    ids = turn_in_flight(outbox, r)
    assert outbox.interrupt(WS, SES) is InterruptResult.CUT
    return ids


def three_pending(outbox, r):
    return _pending(outbox, "b", "x", "c")


def ended_and_owed(outbox, r):
    """o delivered with its signal owed, e cancelled (gone), then b and x pending."""
    ids = {**_seeded(outbox, "o", status=Status.DELIVERING, delivered_at=format_time(_now_us()))}
    ids.update(_pending(outbox, "e", "b", "x"))
    assert outbox.cancel(WS, SES, ids["e"]) is CancelResult.REMOVED
    return ids


def only_pending(outbox, r):
    return _pending(outbox, "b")


def only_verifying(outbox, r):
    return _seeded(outbox, "v", status=Status.VERIFYING)


def past_expiry(outbox, r):
    """x pending past its expiresAt, never claimed; b pending."""
    ago = format_time(_now_us() - 60_000_000)
    return {**_seeded(outbox, "x", status=Status.PENDING, expires_at=ago), **_pending(outbox, "b")}


def only_error(outbox, r):
    return _seeded(outbox, "e", status=Status.ERROR, reason="max_attempts")


def only_expired(outbox, r):
    return _seeded(outbox, "e", status=Status.EXPIRED)


def only_owed(outbox, r):
    return _seeded(outbox, "o", status=Status.DELIVERING, delivered_at=format_time(_now_us()))


def only_orphaned(outbox, r):
    ids = _pending(outbox, "y")
    _claim(outbox, r)
    r.delete(outbox.keys.session(WS, SES).lock)
    return ids


def only_parked(outbox, r):
    ids = _pending(outbox, "p")
    outbox.park_workspace(WS, REASON)
    return ids


def empty(outbox, r):
    ids = _pending(outbox, "e")
    assert outbox.cancel(WS, SES, ids["e"]) is CancelResult.REMOVED
    return ids


def every_waiting_state(outbox, r):
    """v verifying (after a backoff), e error, ex expired, o delivered and owed, p pending."""
    later = format_time(_now_us() + 60_000_000)
    ids = _seeded(outbox, "v", status=Status.VERIFYING, next_attempt_at=later)
    ids.update(_seeded(outbox, "e", status=Status.ERROR, reason="max_attempts"))
    ids.update(_seeded(outbox, "ex", status=Status.EXPIRED))
    ids.update(only_owed(outbox, r))
    ids.update(_pending(outbox, "p"))
    return ids


def every_waiting_state_parked(outbox, r):
    ids = every_waiting_state(outbox, r)
    outbox.park_workspace(WS, REASON)
    return ids


def in_flight_parked(outbox, r):
    """y parked while staged under the lease, b parked from pending."""
    ids = _pending(outbox, "y", "b")
    _claim(outbox, r)
    outbox.park_workspace(WS, REASON)
    return ids


def _accept(if_busy):
    return lambda ob, ids: accept(ob, "knew", "new", if_busy=if_busy)


def _statuses(outbox, r, ids) -> dict[str, str]:
    """name -> stored status (staged entries too), parkedFrom after a slash."""
    names = {v: k for k, v in ids.items()}
    keys = outbox.keys.session(WS, SES)
    out = {}
    for raw in r.lrange(keys.queue, 0, -1) + r.lrange(keys.staging, 0, -1):
        st = json.loads(raw)
        name = names.get(st["id"], st["text"])
        out[name] = st["status"] + (f"/{st['parkedFrom']}" if st.get("parkedFrom") else "")
    return out


def _order_with(outbox, ids, new=None) -> list[str]:
    names = {v: k for k, v in ids.items()}
    return [names.get(e.id, e.text) for e in outbox.list(WS, SES)]


def _entry(outbox, ids, name):
    return {e.id: e for e in outbox.list(WS, SES)}[ids[name]]


def _interrupted(outbox, ids, name) -> bool:
    return {e.id: e for e in outbox.list(WS, SES)}[ids[name]].interrupted


@dataclass(frozen=True)
class Row:
    id: str
    setup: Any
    op: Any
    expect: Any
    check: Any = None  # (outbox, r, ids) -> None, for an answer that changes something
    aborter: bool = True
    told: tuple[str, ...] = ()  # the entries whose change watchers are told of


def _is(expected):
    return lambda got: got is expected


ROWS_SESSION = [
    # move: nothing goes ahead of an entry being verified or held by the lease ...
    Row(
        "move_next-behind_a_verifying_head",
        verifying_head,
        lambda ob, ids: ob.move(WS, SES, ids["x"], to="next"),
        MoveResult.MOVED,
        lambda ob, r, ids: _order_with(ob, ids) == ["v", "x", "b"],
    ),
    Row(
        "move_next-behind_the_entry_being_verified_under_the_lease",
        verifying_head_leased,
        lambda ob, ids: ob.move(WS, SES, ids["x"], to="next"),
        MoveResult.MOVED,
        lambda ob, r, ids: _order_with(ob, ids) == ["v", "x", "b"],
    ),
    Row(
        "move_next-behind_an_entry_parked_from_verifying",
        parked_verifying_head,
        lambda ob, ids: ob.move(WS, SES, ids["x"], to="next"),
        MoveResult.MOVED,
        lambda ob, r, ids: _order_with(ob, ids) == ["v", "x", "b"],
    ),
    Row(
        "move_next-while_a_turn_runs",
        turn_in_flight,
        lambda ob, ids: ob.move(WS, SES, ids["x"], to="next"),
        MoveResult.MOVED,
        lambda ob, r, ids: (
            _order_with(ob, ids) == ["y", "x", "b"] and _staged_ids(ob, r) == [ids["y"]]
        ),
    ),
    Row(
        "move_before-a_verifying_head",
        verifying_head,
        lambda ob, ids: ob.move(WS, SES, ids["x"], before=ids["v"]),
        MoveResult.BUSY,
    ),
    Row(
        "move_before-an_entry_parked_from_verifying",
        parked_verifying_head,
        lambda ob, ids: ob.move(WS, SES, ids["x"], before=ids["v"]),
        MoveResult.BUSY,
    ),
    Row(
        "move_before-the_entry_in_flight",
        turn_in_flight,
        lambda ob, ids: ob.move(WS, SES, ids["x"], before=ids["y"]),
        MoveResult.BUSY,
    ),
    Row(
        "move_before-an_ended_entry",
        ended_and_owed,
        lambda ob, ids: ob.move(WS, SES, ids["x"], before=ids["e"]),
        MoveResult.NOT_FOUND,
    ),
    Row(
        "move_before-a_delivered_entry_whose_signal_is_owed",
        ended_and_owed,
        lambda ob, ids: ob.move(WS, SES, ids["x"], before=ids["o"]),
        MoveResult.NOT_FOUND,
    ),
    Row(
        "move_before-a_pending_entry",
        three_pending,
        lambda ob, ids: ob.move(WS, SES, ids["c"], before=ids["x"]),
        MoveResult.MOVED,
        lambda ob, r, ids: _order_with(ob, ids) == ["b", "c", "x"],
    ),
    Row(
        "move_before-the_entry_it_already_stands_before",
        three_pending,
        lambda ob, ids: ob.move(WS, SES, ids["x"], before=ids["c"]),
        MoveResult.MOVED,  # nothing to do: nothing written
    ),
    Row(
        "move_last-the_last_entry",
        three_pending,
        lambda ob, ids: ob.move(WS, SES, ids["c"], to="last"),
        MoveResult.MOVED,  # nothing to do: nothing written
    ),
    # send now: in front of every pending entry, behind those being verified; cuts the turn
    Row(
        "send_now-while_a_turn_runs",
        turn_in_flight,
        lambda ob, ids: ob.send_now(WS, SES, ids["x"]),
        SendNowResult.CUT,
        lambda ob, r, ids: (
            _order_with(ob, ids) == ["y", "x", "b"]
            and _interrupted(ob, ids, "y")
            and r.get(ob.keys.cut(WS, SES)) == ids["y"]
        ),
        told=("x", "y"),
    ),
    Row(
        "send_now-behind_a_verifying_head",
        verifying_head,
        lambda ob, ids: ob.send_now(WS, SES, ids["x"]),
        SendNowResult.CUT,
        lambda ob, r, ids: _order_with(ob, ids) == ["v", "x", "b"] and _interrupted(ob, ids, "v"),
        told=("x", "v"),
    ),
    Row(
        "send_now-when_the_turn_was_cut_before",
        turn_cut,
        lambda ob, ids: ob.send_now(WS, SES, ids["x"]),
        SendNowResult.ALREADY,
        lambda ob, r, ids: _order_with(ob, ids) == ["y", "x", "b"],
    ),
    Row(
        "send_now-without_an_aborter",
        turn_in_flight,
        lambda ob, ids: ob.send_now(WS, SES, ids["x"]),
        SendNowResult.NOT_SUPPORTED,
        aborter=False,
    ),
    # stop: the turn in flight, else the first entry being verified, else idle
    Row(
        "interrupt-a_turn_in_flight",
        turn_in_flight,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.CUT,
        lambda ob, r, ids: _interrupted(ob, ids, "y") and _order_with(ob, ids) == ["y", "b", "x"],
    ),
    Row(
        "interrupt-a_verifying_head",
        verifying_head,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.CUT,
        lambda ob, r, ids: _interrupted(ob, ids, "v") and not _interrupted(ob, ids, "b"),
    ),
    Row(
        "interrupt-an_orphaned_staged_entry",
        only_orphaned,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.CUT,
        lambda ob, r, ids: _interrupted(ob, ids, "y"),
    ),
    Row(
        "interrupt-only_a_verification",
        only_verifying,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.CUT,
        lambda ob, r, ids: _interrupted(ob, ids, "v"),
        told=("v",),
    ),
    Row(
        "interrupt-a_turn_cut_before",
        turn_cut,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.ALREADY,
    ),
    Row(
        "interrupt-only_pending",
        only_pending,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.IDLE,
    ),
    Row(
        "interrupt-only_an_error",
        only_error,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.IDLE,
    ),
    Row(
        "interrupt-only_parked",
        only_parked,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.IDLE,
    ),
    Row(
        "interrupt-only_a_delivered_entry_whose_signal_is_owed",
        only_owed,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.IDLE,
    ),
    Row(
        "interrupt-without_an_aborter",
        turn_in_flight,
        lambda ob, ids: ob.interrupt(WS, SES),
        InterruptResult.NOT_SUPPORTED,
        aborter=False,
    ),
    # A Stop naming an entry cuts its turn only while it is the one in flight
    Row(
        "stop_naming-the_turn_in_flight",
        turn_in_flight,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["y"]),
        InterruptResult.CUT,
        lambda ob, r, ids: _interrupted(ob, ids, "y") and r.get(ob.keys.cut(WS, SES)) == ids["y"],
    ),
    Row(
        "stop_naming-a_queued_prompt_while_another_turn_runs",
        turn_in_flight,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["x"]),
        InterruptResult.NOT_IN_FLIGHT,
    ),
    Row(
        "stop_naming-a_prompt_queued_behind_a_verifying_head",
        verifying_head,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["b"]),
        InterruptResult.NOT_IN_FLIGHT,
    ),
    Row(
        "stop_naming-the_verifying_head",
        verifying_head,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["v"]),
        InterruptResult.CUT,
        lambda ob, r, ids: _interrupted(ob, ids, "v") and not _interrupted(ob, ids, "b"),
    ),
    Row(
        "stop_naming-an_ended_entry_while_another_turn_runs",
        ended_and_owed,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["e"]),
        InterruptResult.NOT_IN_FLIGHT,
    ),
    Row(
        "stop_naming-a_delivered_entry_whose_signal_is_owed",
        ended_and_owed,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["o"]),
        InterruptResult.NOT_IN_FLIGHT,
    ),
    Row(
        "stop_naming-a_turn_cut_before",
        turn_cut,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["y"]),
        InterruptResult.ALREADY,
    ),
    Row(
        "stop_naming-an_entry_never_seen",
        turn_in_flight,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id="never-seen"),
        InterruptResult.NOT_IN_FLIGHT,
    ),
    Row(
        "stop_naming-in_an_emptied_session",
        empty,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["e"]),
        InterruptResult.NOT_IN_FLIGHT,
    ),
    Row(
        "stop_naming-without_an_aborter",
        turn_in_flight,
        lambda ob, ids: ob.interrupt(WS, SES, entry_id=ids["y"]),
        InterruptResult.NOT_SUPPORTED,
        aborter=False,
    ),
    Row(
        "cut-an_entry_cut_before",
        turn_cut,
        lambda ob, ids: ob.cut(WS, SES, ids["y"]),
        InterruptResult.ALREADY,
    ),
    # expire: the claim that reaches a prompt past its expiry marks it, never sends it
    # (claim.lua as a worker runs it: run_script emits no events)
    Row(
        "claim-a_prompt_past_its_expiry",
        past_expiry,
        lambda ob, ids: ob.run_script("claim", WS, SES, claim_argv(HOLDER, 600_000))[0],
        b"deliver",
        lambda ob, r, ids: (
            _statuses(ob, r, ids) == {"x": "expired", "b": "delivering"}
            and _endings(ob, r)[0] == f"{ids['x']} expired"
        ),
    ),
    # edit: compare-and-set on the session's version
    Row(
        "edit-with_a_stale_version",
        three_pending,
        lambda ob, ids: ob.edit(WS, SES, ids["x"], text="edited", if_version=1),
        EditResult.VERSION_MISMATCH,
    ),
    # accept while busy: reject refuses while something is pending, in flight or verified
    *(
        Row(f"accept_reject-{name}", setup, _accept("reject"), SessionBusy)
        for name, setup in (
            ("while_a_prompt_is_pending", only_pending),
            ("while_a_turn_runs", turn_in_flight),
            ("while_a_staged_entry_is_orphaned", only_orphaned),
            ("while_the_head_is_verified", verifying_head),
            ("while_only_a_verification_waits", only_verifying),
            ("while_the_head_is_verified_under_the_lease", verifying_head_leased),
        )
    ),
    *(
        Row(
            f"accept_reject-{name}",
            setup,
            _accept("reject"),
            Status.PENDING,
            lambda ob, r, ids: _order_with(ob, ids)[-1] == "new",
        )
        for name, setup in (
            ("while_only_an_error_waits", only_error),
            ("while_only_an_expired_prompt_waits", only_expired),
            ("into_an_empty_session", empty),
            ("while_only_a_delivered_entry_whose_signal_is_owed_stays", only_owed),
        )
    ),
    Row(
        "accept_reject-while_only_parked_prompts_wait",
        only_parked,
        _accept("reject"),
        Status.PARKED,  # held by the paused workspace
        lambda ob, r, ids: _statuses(ob, r, ids)["new"] == "parked/pending",
    ),
    Row(
        "accept_merge-while_a_prompt_is_pending",
        only_pending,
        _accept("merge"),
        Status.PENDING,
        lambda ob, r, ids: [e.mode for e in ob.list(WS, SES)] == ["queue", "merge"],
    ),
    Row(
        "accept_queue-while_a_turn_runs",
        turn_in_flight,
        _accept("queue"),
        Status.PENDING,
        lambda ob, r, ids: _order_with(ob, ids) == ["y", "b", "x", "new"],
    ),
    Row(
        "accept_interrupt-while_a_turn_runs",
        turn_in_flight,
        _accept("interrupt"),
        Status.PENDING,
        lambda ob, r, ids: (
            _order_with(ob, ids) == ["y", "new", "b", "x"] and _interrupted(ob, ids, "y")
        ),
    ),
    Row(
        "accept_interrupt-into_a_paused_workspace",
        in_flight_parked,
        _accept("interrupt"),
        Status.PARKED,  # held like every accept: it is no queued prompt, so nothing is cut
        lambda ob, r, ids: (
            _order_with(ob, ids) == ["y", "b", "new"]
            and not _interrupted(ob, ids, "y")
            and not r.exists(ob.keys.cut(WS, SES))
        ),
    ),
    Row(
        "accept_interrupt-without_an_aborter",
        turn_in_flight,
        _accept("interrupt"),
        CutNotSupported,  # nothing stored, no marker
        aborter=False,
    ),
    # park / unpark: pending, verifying and delivering park; error, expired and delivered
    # entries stay; unpark returns each to where it was parked from
    Row(
        "park-every_waiting_state",
        every_waiting_state,
        lambda ob, ids: ob.park_workspace(WS, REASON),
        2,
        lambda ob, r, ids: (
            _statuses(ob, r, ids)
            == {
                "v": "parked/verifying",
                "e": "error",
                "ex": "expired",
                "o": "delivering",
                "p": "parked/pending",
            }
        ),
    ),
    Row(
        "park-a_turn_in_flight",
        turn_in_flight,
        lambda ob, ids: ob.park_workspace(WS, REASON),
        3,
        lambda ob, r, ids: (
            _statuses(ob, r, ids)
            == {"y": "parked/delivering", "b": "parked/pending", "x": "parked/pending"}
            and _staged_ids(ob, r) == [ids["y"]]
        ),
    ),
    Row(
        "park-a_session_of_pending_prompts",
        three_pending,
        lambda ob, ids: ob.park_workspace(WS, REASON),
        3,  # nothing left to deliver: the session leaves the due index
        lambda ob, r, ids: set(_statuses(ob, r, ids).values()) == {"parked/pending"},
        told=("b", "x", "c"),
    ),
    Row(
        "unpark-every_waiting_state",
        every_waiting_state_parked,
        lambda ob, ids: ob.unpark_workspace(WS, REASON),
        2,
        lambda ob, r, ids: (
            _statuses(ob, r, ids)
            == {"v": "verifying", "e": "error", "ex": "expired", "o": "delivering", "p": "pending"}
            and not r.exists(ob.keys.pause(WS))
            and _entry(ob, ids, "v").next_attempt_at is None  # unparked entries are due now
        ),
    ),
    Row(
        "unpark-a_turn_parked_in_flight",
        in_flight_parked,
        lambda ob, ids: ob.unpark_workspace(WS),
        2,
        lambda ob, r, ids: (
            _statuses(ob, r, ids) == {"y": "delivering", "b": "pending"}
            and _staged_ids(ob, r) == [ids["y"]]
            and not r.exists(ob.keys.pause(WS))
        ),
    ),
    Row(
        "unpark-with_another_reason",
        every_waiting_state_parked,
        lambda ob, ids: ob.unpark_workspace(WS, "another"),
        0,
    ),
]


def _answer(row: Row, outbox, ids):
    try:
        answer = row.op(outbox, ids)
    except Exception as exc:  # a refusal the API raises
        return exc
    if hasattr(answer, "status") and hasattr(answer, "id"):  # an accepted Entry
        return answer.status
    return answer


@pytest.mark.parametrize("row", ROWS_SESSION, ids=[row.id for row in ROWS_SESSION])
def test_an_operation_in_a_session(make_outbox, r, signals_log, row):
    outbox = make_outbox(history_window=3600, **({"aborter": _abort} if row.aborter else {}))
    ids = row.setup(outbox, r)
    before, version = keyspace(r), _version(outbox, r)
    signals_log.calls["updated"].clear()

    answer = _answer(row, outbox, ids)

    if isinstance(row.expect, type) and issubclass(row.expect, Exception):
        assert isinstance(answer, row.expect), answer
    else:
        assert answer == row.expect
    told = {v: k for k, v in ids.items()}
    assert {told.get(i, "new") for i in signals_log.ids("updated")} >= set(row.told)
    if row.check is None:
        assert keyspace_diff(before, keyspace(r)) == []
        assert signals_log.ids("updated") == []
    else:
        assert row.check(outbox, r, ids)
        assert _version(outbox, r) > version or row.id.startswith(("park", "unpark"))
        assert_indices_agree(r, outbox, WS, SES)
