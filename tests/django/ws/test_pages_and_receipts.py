"""The bounds of a snapshot's pages and a socket's resync budget, at their edges
(docs/reference/websocket.md#staying-true, #how-prompts-ended): what the last page carries
(the acknowledgement token and the record of endings) counts towards every page's bound,
and a client may spend exactly ``WS_RESYNC_BUDGET`` resyncs in a minute. Pure pieces of
:mod:`django_outbox.ws.truth` (no I/O)."""

from __future__ import annotations

import json

from django_outbox.ws.truth import BUDGET_WINDOW, ResyncBudget, snapshot_frames


def test_a_long_record_of_endings_still_keeps_every_page_within_the_bound():
    """The last page carries ``ended``; a record of many endings must not push it past
    ``max_bytes`` (it is counted in every page's size)."""
    entries = [{"id": f"e{i}", "text": "x" * 900} for i in range(40)]
    ended = [
        {"id": f"gone-{i:04d}", "how": "delivered", "at": 1_700_000_000_000 + i} for i in range(60)
    ]
    limit = 8_000
    frames = snapshot_frames("w1", "s1", 3, entries, limit, ack="T" * 16, ended=ended)
    assert all(len(f.encode()) <= limit for f in frames), [len(f.encode()) for f in frames]
    pages = [json.loads(f) for f in frames]
    assert pages[-1]["ended"] == ended and pages[-1]["ack"] == "T" * 16
    assert [e for p in pages for e in p["entries"]] == entries


def test_a_resync_budget_admits_exactly_its_number_per_window():
    now = [0.0]
    budget = ResyncBudget(3, clock=lambda: now[0])
    assert [budget.spend() for _ in range(3)] == [True, True, True]
    assert not budget.spend()  # the fourth within the minute
    now[0] += BUDGET_WINDOW
    assert budget.spend()  # the window slid past the first ones
