"""What one changelist page of the outbox admin shows: the page model and its text.

:func:`read_page` turns the view's filter, search and page position into one
``Outbox.session_page`` read (and an ``Outbox.search`` first when there is a
query); :class:`Page` holds what it read, :class:`SessionView` one session of it
and :class:`Row` one entry as the table shows it. Every string a row carries is
plain text (:func:`visible` escapes control and format characters); the
templates still escape it.

Pages are not numbered: the "Next" link carries the position of the last session
shown (``after``) and "Previous" the position of the first (``before``), so
sessions resolved or added meanwhile never push a session off the next page
(:func:`page_positions` reads them back from the query string).
"""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib import messages

from ..core.entry import Entry, Lease, Snapshot, Status, parse_time
from ..core.errors import InvalidIdentifier
from ..core.heartbeats import WorkerHeartbeat
from ..core.paging import IndexPosition
from ..outbox import Outbox

#: Sessions per page (each holds at most ``CAP`` entries).
SESSIONS_PER_PAGE = 50
#: An entry-ID search inside a workspace reads at most this many of its sessions.
ENTRY_SEARCH_MAX_SESSIONS = 1000
TEXT_PREVIEW_CHARS = 120
ERROR_PREVIEW_CHARS = 160

# Status filters (value, label); the default view is "attention". See matches().
ATTENTION = "attention"
STATUS_FILTERS: list[tuple[str, str]] = [
    (ATTENTION, "Needs attention"),
    ("error", "Error"),
    ("parked", "Parked"),
    ("verifying", "Verifying"),
    ("blocked", "Blocked behind a lease"),
    ("pending", "Pending"),
    ("delivering", "Delivering"),
    ("all", "All"),
]
#: Filters answered from the attention index (their entries only live in those sessions).
ATTENTION_FILTERS = {ATTENTION, "error", "parked", "verifying", "blocked"}
STATUS_VAR, SEARCH_VAR, AFTER_VAR, BEFORE_VAR = "status", "q", "after", "before"
#: The note shown when a page link's position cannot be read.
BAD_POSITION = "This page link is not valid any more; showing the first page."


# =====================================================================================
# text
# =====================================================================================


def visible(text: str | None, limit: int | None = None) -> str:
    """``text`` with control and format characters (RTL overrides, zero-width marks...)
    shown as ``\\u`` escapes so they cannot reorder or hide what surrounds them; cut to
    ``limit`` characters. The result is plain text: templates still escape it.
    """
    if text is None:
        return ""
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    out = []
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") and ch not in "\n\t":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def duration(seconds: float) -> str:
    """A short human duration: ``42 s``, ``5 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _age(iso: str | None, now: datetime) -> str:
    if not iso:
        return ""
    try:
        return duration(now.timestamp() - parse_time(iso) / 1_000_000)
    except ValueError:
        return visible(iso)


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.1f} s"


# =====================================================================================
# the page model
# =====================================================================================


@dataclass(frozen=True)
class SessionView:
    """One session as read for a page: its entries (as ``Outbox.list`` gives them), its
    lease (``owner`` names the worker, or host-pid, that claimed it) and the index
    score (ms) it was found by.
    """

    workspace_id: str
    session_id: str
    score_ms: float | None = None
    version: int = 0
    entries: list[Entry] = field(default_factory=list)
    lease: Lease | None = None

    @classmethod
    def of(
        cls, workspace_id: str, session_id: str, snapshot: Snapshot, score_ms: float | None = None
    ) -> SessionView:
        """The view of ``snapshot`` (an ``Outbox.snapshot``) of that session."""
        return cls(
            workspace_id, session_id, score_ms, snapshot.version, snapshot.entries, snapshot.lease
        )


@dataclass
class Row:
    """One entry as the changelist shows it (every string is plain text; templates escape)."""

    ref: str
    url: str
    workspace_id: str
    session_id: str
    entry: Entry
    state: str
    text: str
    last_error: str
    reason: str
    age: str
    lease: str
    in_flight_for: str


@dataclass
class Page:
    """What one changelist view read."""

    total: int = 0  # sessions the page's source holds (index size or search matches)
    sessions: list[SessionView] = field(default_factory=list)
    offset: int = 0  # sessions of the source before this page when it was read
    next_position: IndexPosition | None = None  # the "Next" link continues after it
    previous_position: IndexPosition | None = None  # "Previous" ends before it
    workers: list[WorkerHeartbeat] = field(default_factory=list)
    workspaces: int = 0
    sessions_total: int = 0
    attention_total: int = 0
    workspace_id: str | None = None  # a searched workspace (the workspace tools apply)
    entry_id: str | None = None  # an entry-ID search
    exact: bool = False  # the search's sessions are the entry's, not an index page
    notes: list[tuple[int, str]] = field(default_factory=list)

    @property
    def is_first(self) -> bool:
        """No session of the source comes before this page."""
        return self.previous_position is None and not self.offset


def derived_state(entry: Entry, lease: Lease | None) -> str:
    """The status an operator needs: ``blocked`` for pending behind a held lease,
    ``orphaned`` for a staged entry whose lease is gone (recovered as verifying
    by the next claim or ``recover``), else the stored status."""
    if entry.status is Status.PENDING and entry.blocked_by_in_flight:
        return "blocked"
    if entry.status is Status.DELIVERING and lease is None:
        return "orphaned"
    return str(entry.status)


def matches(status_filter: str, state: str, session_blocked: bool) -> bool:
    """Whether an entry in ``state`` is shown under ``status_filter`` (``session_blocked``:
    its session has entries waiting behind a lease)."""
    if status_filter == "all":
        return True
    if status_filter == ATTENTION:
        # The blocker (the entry in flight) is shown beside the entries it blocks.
        return state in ("error", "parked", "verifying", "blocked", "orphaned") or (
            state == "delivering" and session_blocked
        )
    if status_filter == "pending":
        return state in ("pending", "blocked")
    if status_filter == "delivering":
        return state in ("delivering", "orphaned")
    return state == status_filter


def make_row(
    view: SessionView, entry: Entry, state: str, now: datetime, url: Callable[[str], str]
) -> Row:
    """``entry`` of ``view`` as a table row; ``url(ref)`` is its entry page."""
    ref = f"{view.workspace_id}/{view.session_id}/{entry.id}"
    lease = ""
    in_flight = entry.in_flight_for
    if view.lease is not None:
        # The lease names its owner: the worker (see the workers panel) or host-pid.
        lease = f"{view.lease.owner[:8]}…"
        if view.lease.entry_id == entry.id or entry.status is Status.DELIVERING:
            lease += " (this entry)"
            if in_flight is None:
                in_flight = view.lease.held_for
        elif view.lease.entry_id:
            lease += f" (on {view.lease.entry_id[:12]}…)"
    return Row(
        ref=ref,
        url=url(ref),
        workspace_id=view.workspace_id,
        session_id=view.session_id,
        entry=entry,
        state=state,
        text=visible(entry.text, TEXT_PREVIEW_CHARS),
        last_error=visible(entry.last_error, ERROR_PREVIEW_CHARS),
        reason=visible(entry.reason),
        age=_age(entry.accepted_at, now),
        lease=lease,
        in_flight_for=_seconds(in_flight),
    )


def page_rows(
    page: Page, status_filter: str, now: datetime, url: Callable[[str], str]
) -> tuple[list[Row], Counter[str], int]:
    """The rows ``status_filter`` shows of ``page`` (only the searched entry's for an
    entry-ID search), the entries of the page's sessions by derived state, and how many
    sessions show no row."""
    rows: list[Row] = []
    counts: Counter[str] = Counter()
    unmatched_sessions = 0
    for view in page.sessions:
        blocked = any(e.blocked_by_in_flight for e in view.entries)
        shown = 0
        for entry in view.entries:
            state = derived_state(entry, view.lease)
            counts[state] += 1
            if page.entry_id is not None:
                if entry.id != page.entry_id:
                    continue
            elif not matches(status_filter, state, blocked):
                continue
            rows.append(make_row(view, entry, state, now, url))
            shown += 1
        if not shown:
            unmatched_sessions += 1
    return rows, counts, unmatched_sessions


# =====================================================================================
# reading a page
# =====================================================================================


def page_positions(
    params: Mapping[str, str],
) -> tuple[IndexPosition | None, IndexPosition | None, bool]:
    """``(after, before, valid)``: the page position a query string names (at most one
    of the two). ``valid`` is False when it names one that cannot be read (both, or a
    malformed or forged value); then neither is given and the first page is shown."""
    after, before = params.get(AFTER_VAR), params.get(BEFORE_VAR)
    if after is None and before is None:
        return None, None, True
    if after is not None and before is not None:
        return None, None, False
    try:
        position = IndexPosition.from_text(after if after is not None else before or "")
    except ValueError:
        return None, None, False
    return (position, None, True) if after is not None else (None, position, True)


def read_page(
    outbox: Outbox,
    status_filter: str,
    query: str,
    per_page: int,
    *,
    after: IndexPosition | None = None,
    before: IndexPosition | None = None,
) -> Page:
    """Read one page: the search's sessions (if ``query``) or a page of the filter's
    index, the first one or the one strictly ``after`` (or ``before``) a position, with
    the global counts and the workers (``Outbox.session_page``: two round trips on a
    standalone server, however many sessions are stored). A position without a score
    outside an exact search gives the first page and a note. Raises
    :class:`OutboxUnavailable`.
    """
    page = Page()
    among = _search(outbox, query, page) if query else None
    index = "attention" if status_filter in ATTENTION_FILTERS else "allsessions"
    position = after or before
    if position is not None and position.score_ms is None and not page.exact:
        page.notes.append((messages.WARNING, BAD_POSITION))
        after = before = None
    read = outbox.session_page(
        index, per_page, after=after, before=before, among=among, indexed_only=not page.exact
    )
    if before is not None and not read.sessions:
        # Nothing is left before that position: going back lands on the first page.
        read = outbox.session_page(index, per_page, among=among, indexed_only=not page.exact)
    page.total = read.total
    page.offset = read.offset
    page.sessions = [
        SessionView.of(f.workspace_id, f.session_id, f.snapshot, f.score_ms) for f in read.sessions
    ]
    if read.sessions and read.has_next:
        page.next_position = read.sessions[-1].position
    if read.sessions and read.has_previous:
        page.previous_position = read.sessions[0].position
    page.workers = read.workers
    page.workspaces = read.totals.workspaces
    page.sessions_total = read.totals.sessions
    page.attention_total = read.totals.attention
    if among is not None and len(among) == 1:
        page.notes += _held_signals(outbox, *among[0])
    if page.entry_id is not None and not page.exact:
        if not any(e.id == page.entry_id for v in page.sessions for e in v.entries):
            page.notes.append(
                (
                    messages.WARNING,
                    f"No entry {visible(page.entry_id)} in the {len(page.sessions)} "
                    "session(s) of this page. An entry ID alone is looked up in the "
                    "page's sessions only; search workspace/entry-ID to look through a "
                    "whole workspace, or workspace/session/entry-ID.",
                )
            )
    return page


def _held_signals(outbox: Outbox, ws: str, ses: str) -> list[tuple[int, str]]:
    """Warnings for the session's owed ``entry_delivered`` signals that failed
    ``MAX_RECEIVER_ATTEMPTS`` times and wait for staff (one HGETALL, on a search that
    names one session; docs/reference/signals.md#a-receiver-that-keeps-failing)."""
    bound = outbox.config.max_receiver_attempts
    return [
        (
            messages.WARNING,
            f"The entry_delivered of {visible(entry_id)} failed {n} times and this session "
            f"waits for staff: run 'manage.py outbox owed {ws} {ses} {visible(entry_id)} "
            "--retry' after fixing the receiver, or '--skip' to record it as done.",
        )
        for entry_id, n in sorted(outbox.owed_failures(ws, ses).items())
        if n >= bound
    ]


def _search(outbox: Outbox, query: str, page: Page) -> list[tuple[str, str]] | None:
    """The search box as candidate sessions (``Outbox.search``), or None to page the
    index; what the query named goes on ``page``, mistakes into its notes."""
    try:
        found = outbox.search(query, max_sessions=ENTRY_SEARCH_MAX_SESSIONS)
    except InvalidIdentifier as exc:
        page.notes.append((messages.ERROR, f"Nothing found: {visible(str(exc))}."))
        return []
    except ValueError:
        page.notes.append(
            (
                messages.ERROR,
                "Search for workspace, workspace/session or workspace/session/entry-ID.",
            )
        )
        return []
    page.workspace_id, page.entry_id, page.exact = found.workspace_id, found.entry_id, found.exact
    if found.workspace_sessions > ENTRY_SEARCH_MAX_SESSIONS:
        page.notes.append(
            (
                messages.WARNING,
                f"Workspace {found.workspace_id} has {found.workspace_sessions} sessions; the "
                f"entry was looked for in the first {ENTRY_SEARCH_MAX_SESSIONS} (by session ID) "
                "only. Search workspace/session/entry-ID to be sure.",
            )
        )
    return found.sessions


def worker_panel(
    workers: list[WorkerHeartbeat], now: datetime
) -> list[tuple[WorkerHeartbeat, str]]:
    """``(worker, seen ago)`` for the workers panel."""
    return [(w, duration(now.timestamp() - w.last_seen)) for w in workers]
