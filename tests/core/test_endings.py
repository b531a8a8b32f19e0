"""The record of how a session's entries ended (lua/lib/endings.lua), against a real Valkey.

The transitions that end an entry (the delivered settle, dismiss, cancel, a cut proven
absent, the ledger probe's confirmation, the claim that finds a prompt past its expiry)
record it in the script that ends it; the snapshot reads the newest 20 of the last hour,
so a page that was not connected learns how its prompts ended
(docs/reference/websocket.md#how-prompts-ended). The record is bounded in count and in
time and goes with an idle session's other keys (docs/explanation/storage.md).
"""

from __future__ import annotations

import asyncio

import pytest

from django_outbox.core.entry import format_time
from django_outbox.core.scripts import (
    claim_argv,
    cut_argv,
    ledger_argv,
    settle_argv,
    settle_next_argv,
)
from django_outbox.core.step import RECEIPT_TTL_MS
from tests.support.helpers import accept

WS, SES = "w1", "s1"
T0 = 1_764_466_959.0  # seconds


async def noop(entry, **kwargs):
    return None


noop.outbox_capabilities = frozenset({"merge"})  # type: ignore[attr-defined]


def step(outbox, ses: str = SES) -> bool:
    """One delivery step for the session, on a loop of its own (closed after)."""

    async def run() -> bool:
        try:
            return await outbox.adeliver_once(WS, ses)
        finally:
            await outbox.aclose()

    return asyncio.run(run())


def endings(outbox, ses: str = SES) -> list[tuple[str, str]]:
    return [(e.entry_id, e.how) for e in outbox.snapshot(WS, ses).endings]


def at_ms(seconds: float) -> str:
    """How the record writes a time: the transition's clock, to the millisecond."""
    return format_time(int(seconds * 1000) * 1000)


def test_each_transition_that_ends_a_prompt_records_how_and_when(make_outbox):
    clock = [T0]
    outbox = make_outbox(deliverer=noop, clock=lambda: clock[0])
    sent = accept(outbox, "sent")
    dismissed = accept(outbox, "dismissed")
    cancelled = accept(outbox, "cancelled")
    late = accept(outbox, "late", expires_after=5)
    kept = accept(outbox, "kept")
    assert step(outbox)
    clock[0] = T0 + 1
    outbox.dismiss(WS, SES, dismissed.id)
    outbox.cancel(WS, SES, cancelled.id)
    clock[0] = T0 + 10  # the claim finds "late" past its expiry, then delivers "kept"
    assert step(outbox)

    snap = outbox.snapshot(WS, SES)
    assert [(e.entry_id, e.how, e.at) for e in snap.endings] == [
        (kept.id, "delivered", at_ms(T0 + 10)),
        (late.id, "expired", at_ms(T0 + 10)),
        (cancelled.id, "cancelled", at_ms(T0 + 1)),
        (dismissed.id, "dismissed", at_ms(T0 + 1)),
        (sent.id, "delivered", at_ms(T0)),
    ]
    assert [(e.id, str(e.status)) for e in snap.entries] == [(late.id, "expired")]
    assert snap.endings[0].to_dict() == {"id": kept.id, "how": "delivered", "at": at_ms(T0 + 10)}


def test_a_merged_delivery_records_each_of_its_prompts(make_outbox):
    outbox = make_outbox(deliverer=noop)
    first = accept(outbox, "first", if_busy="merge")
    second = accept(outbox, "second", if_busy="merge")
    assert step(outbox)
    assert sorted(endings(outbox)) == sorted([(first.id, "delivered"), (second.id, "delivered")])


def test_a_cut_turn_proven_absent_is_recorded_cancelled(outbox):
    entry = accept(outbox, "cut")
    outbox.run_script("claim", WS, SES, claim_argv("tok", 30_000))
    cut = outbox.run_script(
        "cut", WS, SES, cut_argv("", 30_000), extra_keys=[outbox.keys.cut(WS, SES)]
    )
    assert cut[0] in (b"cut", "cut")
    argv = settle_argv("tok", entry.id, "failed", "no", outbox.config, RECEIPT_TTL_MS)
    settled = outbox.run_script("settle", WS, SES, argv)
    assert settled[0] in (b"cancelled", "cancelled")
    assert endings(outbox) == [(entry.id, "cancelled")]


def test_the_ledger_probes_confirmation_is_recorded_delivered(make_outbox):
    async def fails(entry, **kwargs):
        raise RuntimeError("refused")

    outbox = make_outbox(deliverer=fails, max_attempts=1)
    entry = accept(outbox, "probed")
    assert step(outbox)
    [stored] = outbox.list(WS, SES)
    assert str(stored.status) == "error" and endings(outbox) == []
    done = outbox.run_script("ledger_complete", WS, SES, ledger_argv(entry.id, 1, 0))
    assert done[0] in (b"removed", "removed")
    assert endings(outbox) == [(entry.id, "delivered")]


def test_a_replayed_settle_records_the_ending_once(outbox):
    entry = accept(outbox, "once")
    outbox.run_script("claim", WS, SES, claim_argv("tok", 30_000))
    argv = settle_next_argv("tok", entry.id, outbox.config, RECEIPT_TTL_MS, 30_000, [entry.id])
    first = outbox.run_script("settle_next", WS, SES, argv)
    again = outbox.run_script("settle_next", WS, SES, argv)  # its reply was lost
    assert first[0] in (b"next", "next") and again[0] in (b"next", "next")
    assert endings(outbox) == [(entry.id, "delivered")]


@pytest.mark.standalone
def test_the_record_is_bounded_in_count_and_in_time(make_outbox, r):
    clock = [T0]
    outbox = make_outbox(deliverer=noop, clock=lambda: clock[0], user_accepts_per_minute=0)
    ids = []
    for i in range(45):
        ids.append(accept(outbox, f"k{i}").id)
        outbox.dismiss(WS, SES, ids[-1])
    key = outbox.keys.session(WS, SES).ended
    # Trimmed back to 20 once it held 41; the snapshot reads the newest 20.
    assert r.llen(key) <= 40
    assert endings(outbox) == [(i, "dismissed") for i in reversed(ids[-20:])]
    assert 3_590_000 < r.pttl(key) <= 3_600_000  # an hour after the last ending
    clock[0] = T0 + 3600  # an hour old: still told
    assert len(endings(outbox)) == 20
    clock[0] = T0 + 3601  # older than an hour: no longer
    assert endings(outbox) == []


@pytest.mark.standalone
def test_the_record_goes_with_an_idle_session_and_with_cleanup(make_outbox, r):
    clock = [T0]
    outbox = make_outbox(
        deliverer=noop,
        dedupe_ttl=60,
        history_window=0,
        user_accepts_per_minute=0,
        user_max_queued=0,
        clock=lambda: clock[0],
    )
    accept(outbox, "k1", ses="s1")
    accept(outbox, "k1", ses="s2")
    assert step(outbox, "s1") and step(outbox, "s2")
    ended = [outbox.keys.session(WS, ses).ended for ses in ("s1", "s2")]
    assert r.exists(*ended) == 2
    clock[0] = T0 + 61  # the dedupe window has passed: the next claim reclaims s1
    assert not step(outbox, "s1")
    assert r.exists(ended[0]) == 0
    assert outbox.cleanup_workspace(WS) > 0
    assert r.exists(ended[1]) == 0


@pytest.mark.standalone
def test_the_record_is_trimmed_back_to_20_only_once_it_holds_more_than_40(make_outbox, r):
    """Exact lengths at the trim's edges: 40 endings are all kept, the 41st trims the list
    back to the newest 20 (then one LTRIM in 21 endings), and a reader is given 20 throughout."""
    outbox = make_outbox(deliverer=noop, user_accepts_per_minute=0)
    key = outbox.keys.session(WS, SES).ended
    lengths = {}
    ids = []
    for i in range(62):
        ids.append(accept(outbox, f"k{i}").id)
        outbox.dismiss(WS, SES, ids[-1])
        lengths[i + 1] = r.llen(key)
        assert len(endings(outbox)) == min(i + 1, 20)
    # after 41: 20; 20 more endings later it holds 40 again, and the next trims it
    assert [lengths[n] for n in (1, 20, 40, 41, 42, 61, 62)] == [1, 20, 40, 20, 21, 40, 20]
    assert endings(outbox) == [(i, "dismissed") for i in reversed(ids[-20:])]
