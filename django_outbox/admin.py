"""The outbox in the Django admin: find and fix stuck queues (DESIGN section 11).

The data lives in Valkey, so the admin follows the django-rq pattern: the
unmanaged :class:`~django_outbox.models.OutboxEntry` gives a content type and
permissions, and :class:`OutboxEntryAdmin` replaces the ORM changelist with
views that read Valkey through the global indices (``KeySpace.index_keys``: one
key on a standalone server, kept exact by the Lua scripts; one copy per shard
on Valkey Cluster, kept by the client's index hints, so eventually consistent
there while each workspace's own keys stay exact). One code path serves both:

* a page is a page of *sessions* of one index: the attention ZSET (sessions
  holding error, parked or verifying entries, pending ones blocked behind a
  lease, or staging without a lease; oldest first) for the default view and the
  attention-like filters, the all-sessions ZSET (newest first) otherwise. One
  pipelined round trip reads the index page from every copy, the sizes and the
  global counts (the copies' pages are merged by score, see
  :func:`merge_index_pages`); a second reads the page's sessions (one
  ``snapshot`` script each, the same reading ``Outbox.list`` does) and the
  workers' heartbeats. Two round trips and ``O(page)`` commands on a standalone
  server, however many sessions are stored; on a cluster ``O(shards)`` more
  commands, and page ``p`` reads ``p`` pages from each shard;
* a search names a workspace, a session or an entry and is answered from the
  workspace SETs and the per-workspace session SETs, never by SCAN (see
  :meth:`OutboxEntryAdmin.search` for the forms and their cost);
* every action is a CSRF-protected POST back to the changelist (admin
  actions), checked against the user's permissions, answered through the
  messages framework and logged as a ``LogEntry`` of the ``OutboxEntry``
  content type.
"""

from __future__ import annotations

import json
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from .core.entry import DismissResult, Entry, RetryResult, Status, parse_time
from .core.errors import InvalidIdentifier, OutboxUnavailable
from .core.rules import check_identifier
from .models import OutboxEntry
from .outbox import Outbox, get_outbox

#: Sessions per page (each holds at most ``CAP`` entries).
SESSIONS_PER_PAGE = 50
#: An entry-ID search inside a workspace reads at most this many of its sessions.
ENTRY_SEARCH_MAX_SESSIONS = 1000
#: The cleanup confirmation lists at most this many sessions per workspace (counts stay exact).
CLEANUP_LIST_LIMIT = 200
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
STATUS_VAR, SEARCH_VAR, PAGE_VAR = "status", "q", "p"


# =====================================================================================
# reading Valkey
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


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Lease:
    """A session's delivery lease: ``"<token> <acquired-ms> [<entry-id>]"`` and its PTTL."""

    token: str
    acquired_ms: int
    entry_id: str | None
    ttl_ms: int

    @classmethod
    def from_snapshot(cls, lease: Any) -> Lease:
        acquired_ms = int(parse_time(lease.acquired_at) // 1000)
        return cls(lease.owner, acquired_ms, lease.entry_id, 0)

    @classmethod
    def parse(cls, raw: Any, pttl: Any) -> Lease | None:
        if not raw:
            return None
        parts = _text(raw).split()
        try:
            acquired = int(parts[1])
        except (IndexError, ValueError):
            acquired = 0
        return cls(parts[0], acquired, parts[2] if len(parts) > 2 else None, int(pttl or 0))

    def held_for(self, now_ms: int) -> float:
        return max(0.0, (now_ms - self.acquired_ms) / 1000)


@dataclass
class SessionView:
    """One session as read for a page: its entries (as ``Outbox.list`` gives them),
    their stored JSON by ID, its lease, and the index score (ms) it was found by.
    """

    workspace_id: str
    session_id: str
    score_ms: float | None = None
    version: int = 0
    entries: list[Entry] = field(default_factory=list)
    raw: dict[str, str] = field(default_factory=dict)
    lease: Lease | None = None
    error: str | None = None


def run_pipeline(outbox: Outbox, calls: list[tuple[Any, ...]]) -> list[Any]:
    """Send plain commands in one round trip (``Outbox.execute_many``); a failed
    command raises its error rather than passing for an answer.

    Every command must name one key (or keys of one slot): on a cluster each is
    routed to the node holding its key, so a multi-key command such as MGET of
    keys in different slots would be refused.
    """
    answers = outbox.execute_many(calls)
    for answer in answers:
        if isinstance(answer, Exception):
            raise answer
    return answers


def read_sessions(outbox: Outbox, pairs: list[tuple[str, str, float | None]]) -> list[SessionView]:
    """Read many sessions in one pipelined round trip (``Outbox.snapshots``): entries as
    ``Outbox.list`` gives them (staged ones merged in accept order, delivered-but-owed
    ones skipped, ``blockedByInFlight``/``inFlightFor`` set) and the lease.
    ``pairs`` are ``(workspace, session, index score)``.
    """
    views, _ = read_sessions_and(outbox, pairs, [])
    return views


def read_sessions_and(
    outbox: Outbox, pairs: list[tuple[str, str, float | None]], extra: list[tuple[Any, ...]]
) -> tuple[list[SessionView], list[Any]]:
    """:func:`read_sessions`, then ``extra`` commands in a second round trip."""
    snapshots = outbox.snapshots([(ws, ses) for ws, ses, _ in pairs]) if pairs else []
    views = []
    for (ws, ses, score), snapshot in zip(pairs, snapshots, strict=True):
        view = SessionView(ws, ses, score)
        view.version = snapshot.version
        view.entries = snapshot.entries
        view.raw = {e.id: e.to_json() for e in snapshot.entries}
        if snapshot.lease is not None:
            view.lease = Lease.from_snapshot(snapshot.lease)
        views.append(view)
    return views, run_pipeline(outbox, extra)


@dataclass
class Worker:
    """A worker from the heartbeat ZSET; ``live`` while its heartbeat key exists."""

    id: str
    live: bool
    last_seen_ms: float
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def seen_ago(self) -> str:
        return duration(time.time() - self.last_seen_ms / 1000)


#: The global counts of the page header: (command, index) read from every copy.
COUNTED_INDEXES = (("SCARD", "workspaces"), ("ZCARD", "allsessions"), ("ZCARD", "attention"))


def _split(answers: list[Any], *sizes: int) -> list[list[Any]]:
    """``answers`` cut into consecutive runs of ``sizes``, then the rest."""
    runs, at = [], 0
    for size in sizes:
        runs.append(answers[at : at + size])
        at += size
    return [*runs, answers[at:]]


def in_index_order(
    found: list[tuple[str, str, float | None]], descending: bool
) -> list[tuple[str, str, float | None]]:
    """``(ws, ses, score)`` sorted as one index ZSET holding them all would list them:
    by score, then member ``"<ws> <ses>"`` (ZRANGE), or both reversed (ZREVRANGE)."""
    return sorted(found, key=lambda t: (t[2] or 0.0, f"{t[0]} {t[1]}"), reverse=descending)


def merge_index_pages(answers: list[Any], descending: bool) -> list[tuple[str, str, float | None]]:
    """Merge ZRANGE (or ZREVRANGE) ... WITHSCORES answers, one per copy of an index,
    into one list in index order. If each copy gave its first ``n`` members, the
    first ``n`` of the merge are exactly the first ``n`` of the whole index."""
    return in_index_order(
        [triple for answer in answers for triple in _members(_pairs(answer))], descending
    )


def _members(values: list[Any]) -> list[tuple[str, str, float | None]]:
    """``[member, score, ...]`` or ``[(member, score)]`` of "<ws> <ses>" members."""
    out = []
    for item in values:
        member, score = item if isinstance(item, tuple | list) else (item, None)
        ws, _, ses = _text(member).partition(" ")
        if ws and ses:
            out.append((ws, ses, None if score is None else float(score)))
    return out


# =====================================================================================
# the page model
# =====================================================================================


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


@dataclass
class Page:
    """What one changelist view read."""

    total: int = 0  # sessions the page's source holds (index size or search matches)
    sessions: list[SessionView] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    workspaces: int = 0
    sessions_total: int = 0
    attention_total: int = 0
    workspace_id: str | None = None  # a searched workspace (the workspace tools apply)
    entry_id: str | None = None  # an entry-ID search
    exact: bool = False  # the search's sessions are the entry's, not an index page
    notes: list[tuple[int, str]] = field(default_factory=list)


def _pairs(values: Any) -> list[Any]:
    """ZRANGE ... WITHSCORES answers as (member, score) pairs, whatever the client decoded."""
    values = list(values or [])
    if values and isinstance(values[0], tuple | list):
        return values
    return list(zip(values[::2], values[1::2], strict=True))


# =====================================================================================
# forms
# =====================================================================================


def _printable(value: str) -> None:
    if any(unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp") for ch in value):
        raise forms.ValidationError("The reason must not contain control or format characters.")


class ParkForm(forms.Form):
    reason = forms.CharField(
        max_length=200,
        strip=True,
        validators=[_printable],
        help_text=(
            "Stored on every parked entry and shown here; a short code such as "
            "maintenance or mode_transition."
        ),
    )


# =====================================================================================
# the admin
# =====================================================================================


@admin.register(OutboxEntry)
class OutboxEntryAdmin(admin.ModelAdmin):
    """A changelist-like admin over the outbox in Valkey (no ORM queries)."""

    sessions_per_page = SESSIONS_PER_PAGE
    actions = [
        "retry_entries",
        "dismiss_entries",
        "park_workspaces",
        "unpark_workspaces",
        "cleanup_workspaces",
    ]
    change_list_template = "django_outbox/admin/change_list.html"

    # -- permissions -------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_outbox.view_outboxentry")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.retry_outboxentry")

    def has_dismiss_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.dismiss_outboxentry")

    def has_park_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.park_workspace")

    def has_cleanup_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm("django_outbox.cleanup_workspace")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Only this admin's actions: the site-wide delete_selected needs the ORM.
        actions = self._filter_actions_by_permissions(
            request, [self.get_action(name) for name in self.actions]
        )
        return {name: (func, name, desc) for func, name, desc in actions}

    # -- URLs ----------------------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        site = self.admin_site
        return [
            path("", site.admin_view(self.changelist_view), name="{}_{}_changelist".format(*info)),
            # Django's own name and shape, so LogEntry.get_admin_url() links here.
            path(
                "<path:object_id>/change/",
                site.admin_view(self.entry_view),
                name="{}_{}_change".format(*info),
            ),
        ]

    def _changelist_url(self, **params: Any) -> str:
        url = reverse(f"{self.admin_site.name}:django_outbox_outboxentry_changelist")
        params = {k: v for k, v in params.items() if v not in (None, "")}
        return f"{url}?{urlencode(params)}" if params else url

    def _entry_url(self, ref: str) -> str:
        return reverse(
            f"{self.admin_site.name}:django_outbox_outboxentry_change", args=[quote(ref)]
        )

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "media": self.media,
            "changelist_url": self._changelist_url(),
            **extra,
        }

    # -- the changelist ------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self.run_action(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "POST"])
        status_filter = request.GET.get(STATUS_VAR, ATTENTION)
        if status_filter not in dict(STATUS_FILTERS):
            status_filter = ATTENTION
        query = request.GET.get(SEARCH_VAR, "").strip()
        try:
            page_number = max(1, int(request.GET.get(PAGE_VAR, 1)))
        except ValueError:
            page_number = 1
        outbox = get_outbox()
        try:
            page = self.read_page(outbox, status_filter, query, page_number)
        except OutboxUnavailable as exc:
            context = self._context(
                request, "Outbox entries", unavailable=str(exc), status_filter=status_filter
            )
            return TemplateResponse(request, self.change_list_template, context, status=503)
        now = datetime.now(UTC)
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
                rows.append(self._row(view, entry, state, now))
                shown += 1
            if not shown and not view.error:
                unmatched_sessions += 1
        if query and not rows and not page.notes:
            page.notes.append((messages.WARNING, f"Nothing matches {visible(query, 200)!r}."))
        paginator = Paginator(range(page.total), self.sessions_per_page)
        page_links = []
        if paginator.num_pages > 1:
            # A page past the end (the index shrank, or a typed URL) links back to the last.
            near = min(page_number, paginator.num_pages)
            for number in paginator.get_elided_page_range(near, on_each_side=2):
                url = None
                if isinstance(number, int) and number != page_number:
                    url = self._changelist_url(
                        **{STATUS_VAR: status_filter, SEARCH_VAR: query, PAGE_VAR: number}
                    )
                page_links.append((number, url))
        filters = [
            (value, label, value == status_filter, self._changelist_url(status=value, q=query))
            for value, label in STATUS_FILTERS
        ]
        action_choices = self.get_action_choices(request)
        context = self._context(
            request,
            "Outbox entries",
            rows=rows,
            status_filter=status_filter,
            status_label=dict(STATUS_FILTERS)[status_filter],
            filters=filters,
            query=query,
            search_var=SEARCH_VAR,
            page=page,
            page_number=page_number,
            page_links=page_links,
            first_session=(page_number - 1) * self.sessions_per_page + 1,
            last_session=(page_number - 1) * self.sessions_per_page + len(page.sessions),
            unmatched_sessions=unmatched_sessions,
            unreadable=[v for v in page.sessions if v.error],
            page_counts=sorted(counts.items()),
            action_choices=action_choices if len(action_choices) > 1 else [],
            workspace_tools=self._workspace_tools(request, page.workspace_id),
            next_url=request.get_full_path(),
        )
        return TemplateResponse(request, self.change_list_template, context)

    def _workspace_tools(self, request: HttpRequest, workspace_id: str | None) -> dict | None:
        if workspace_id is None:
            return None
        return {
            "workspace_id": workspace_id,
            "park": self.has_park_permission(request),
            "cleanup": self.has_cleanup_permission(request),
        }

    def _row(self, view: SessionView, entry: Entry, state: str, now: datetime) -> Row:
        ref = f"{view.workspace_id}/{view.session_id}/{entry.id}"
        lease = ""
        in_flight = entry.in_flight_for
        if view.lease is not None:
            # The lease names a claim token, not a worker (see the heartbeats panel).
            held = view.lease.held_for(int(now.timestamp() * 1000))
            lease = f"{view.lease.token[:8]}…"
            if view.lease.entry_id == entry.id or entry.status is Status.DELIVERING:
                lease += " (this entry)"
                if in_flight is None:
                    in_flight = held
            elif view.lease.entry_id:
                lease += f" (on {view.lease.entry_id[:12]}…)"
        return Row(
            ref=ref,
            url=self._entry_url(ref),
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

    # -- reading a page ------------------------------------------------------------------

    def read_page(self, outbox: Outbox, status_filter: str, query: str, page_number: int) -> Page:
        """Read one page: the index page (or the search's sessions), the global counts,
        the page's sessions and the workers. See the module docstring for the cost.

        Each index has ``n`` copies (one standalone, one per shard on a cluster). Page
        ``p`` is read as the first ``p * per_page`` members of every copy, merged by
        score and cut to the page; with one copy the skip happens in Valkey.
        """
        keys = outbox.keys
        name = "attention" if status_filter in ATTENTION_FILTERS else "allsessions"
        descending = name == "allsessions"
        copies = keys.index_keys(name)
        page = Page()
        per_page = self.sessions_per_page
        start = (page_number - 1) * per_page
        stats = [
            *(
                (command, key)
                for command, index in COUNTED_INDEXES
                for key in keys.index_keys(index)
            ),
            ("ZRANGE", keys.workers, 0, -1, "WITHSCORES"),
        ]
        scope = self.search(outbox, query, page) if query else None
        if scope is None:
            # Round trip 1: the index page of every copy and the sizes, with the global counts.
            skip = start if len(copies) == 1 else 0
            order = "ZREVRANGE" if descending else "ZRANGE"
            sizes, ranges, stat_answers = _split(
                run_pipeline(
                    outbox,
                    [
                        *(("ZCARD", key) for key in copies),
                        *((order, key, skip, start + per_page - 1, "WITHSCORES") for key in copies),
                        *stats,
                    ],
                ),
                len(copies),
                len(copies),
            )
            page.total = sum(int(n) for n in sizes)
            chosen = merge_index_pages(ranges, descending)[start - skip : start - skip + per_page]
        elif page.exact:
            # An entry search resolved to sessions: show them whatever the index says.
            stat_answers = run_pipeline(outbox, stats)
            page.total = len(scope)
            chosen = [(ws, ses, None) for ws, ses in scope[start : start + per_page]]
        else:
            # A search: keep the candidates the filter's index holds, in its order; one
            # ZMSCORE per copy, asking it about the sessions of its own workspaces.
            groups: dict[str, list[tuple[str, str]]] = {}
            for ws, ses in scope:
                groups.setdefault(keys.index(name, keys.shard_of(ws)), []).append((ws, ses))
            probes = [
                ("ZMSCORE", key, *(f"{ws} {ses}" for ws, ses in members))
                for key, members in groups.items()
            ]
            scores, stat_answers = _split(run_pipeline(outbox, [*probes, *stats]), len(probes))
            found = [
                (ws, ses, float(score))
                for members, answer in zip(groups.values(), scores, strict=True)
                for (ws, ses), score in zip(members, answer, strict=True)
                if score is not None
            ]
            page.total = len(found)
            chosen = in_index_order(found, descending)[start : start + per_page]
        shards = len(keys.index_keys("workspaces"))
        *counts, (workers,) = _split(stat_answers, *(shards for _ in COUNTED_INDEXES))
        page.workspaces, page.sessions_total, page.attention_total = (
            sum(int(n) for n in run) for run in counts
        )
        worker_members = [(_text(m), float(s)) for m, s in _pairs(workers)]
        # Round trip 2: the page's sessions and the workers' heartbeats (one GET each:
        # the heartbeat keys are in different slots on a cluster).
        extra = [("GET", keys.heartbeat(wid)) for wid, _ in worker_members]
        page.sessions, rest = read_sessions_and(outbox, chosen, extra)
        heartbeats = [None if v is None else _text(v) for v in rest]
        page.workers = []
        for (wid, seen), raw in zip(worker_members, heartbeats, strict=True):
            record: dict[str, Any] = {}
            if raw:
                try:
                    record = json.loads(raw)
                except ValueError:
                    record = {}
            page.workers.append(Worker(wid, raw is not None, seen, record))
        page.workers.sort(key=lambda w: (not w.live, -w.last_seen_ms))
        if page.entry_id is not None and not page.exact:
            found_any = any(e.id == page.entry_id for v in page.sessions for e in v.entries)
            if not found_any:
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

    def search(self, outbox: Outbox, query: str, page: Page) -> list[tuple[str, str]] | None:
        """Turn the search box into candidate sessions, or None to page the index.

        Forms (``/`` or spaces between the parts; every part must be a valid ID):

        * ``ws/ses/entry`` — that entry: one session read;
        * ``ws/ses`` — that session; if ``ses`` is not a session of ``ws``, ``ses`` is
          taken as an entry ID and looked up in the workspace's sessions (at most
          ``ENTRY_SEARCH_MAX_SESSIONS``, one pipelined read; cost follows the
          workspace, never the keyspace);
        * ``word`` — the workspace ``word`` (its session SET) and every session
          named ``word`` (one SISMEMBER per workspace, pipelined). If neither
          exists, ``word`` is taken as an entry ID and looked up in the current
          index page's sessions only: finding an entry ID anywhere would mean
          reading every session, which a page view must never do.
        """
        keys = outbox.keys
        parts = query.replace("/", " ").split()
        try:
            for kind, part in zip(("workspace ID", "session ID", "entry ID"), parts, strict=False):
                check_identifier(kind if len(parts) > 1 else "ID", part)
        except InvalidIdentifier as exc:
            page.notes.append((messages.ERROR, f"Nothing found: {visible(str(exc))}."))
            return []
        if len(parts) > 3:
            page.notes.append(
                (
                    messages.ERROR,
                    "Search for workspace, workspace/session or workspace/session/entry-ID.",
                )
            )
            return []
        if len(parts) == 3:
            ws, ses, entry_id = parts
            page.workspace_id, page.entry_id, page.exact = ws, entry_id, True
            return [(ws, ses)]
        if len(parts) == 2:
            ws, second = parts
            page.workspace_id = ws
            is_session, sessions = run_pipeline(
                outbox,
                [
                    ("SISMEMBER", keys.sessions(ws), second),
                    ("SMEMBERS", keys.sessions(ws)),
                ],
            )
            if int(is_session):
                return [(ws, second)]
            names = sorted(_text(s) for s in sessions)
            if len(names) > ENTRY_SEARCH_MAX_SESSIONS:
                page.notes.append(
                    (
                        messages.WARNING,
                        f"Workspace {ws} has {len(names)} sessions; the entry was looked for "
                        f"in the first {ENTRY_SEARCH_MAX_SESSIONS} (by session ID) only. "
                        "Search workspace/session/entry-ID to be sure.",
                    )
                )
                names = names[:ENTRY_SEARCH_MAX_SESSIONS]
            page.entry_id, page.exact = second, True
            views = read_sessions(outbox, [(ws, s, None) for s in names])
            return [(v.workspace_id, v.session_id) for v in views if second in v.raw]
        (word,) = parts
        # The word's own session SET says exactly whether it is a workspace (a shard's
        # workspace SET may lag behind on a cluster); the workspace SETs of every
        # shard name the workspaces that may hold a session called ``word``.
        own, *workspace_sets = run_pipeline(
            outbox,
            [
                ("SMEMBERS", keys.sessions(word)),
                *(("SMEMBERS", key) for key in keys.index_keys("workspaces")),
            ],
        )
        names = sorted({_text(w) for members in workspace_sets for w in members})
        hits = run_pipeline(outbox, [("SISMEMBER", keys.sessions(w), word) for w in names])
        scope = [(w, word) for w, hit in zip(names, hits, strict=True) if int(hit)]
        if own:
            page.workspace_id = word
            scope += sorted((word, _text(s)) for s in own)
        if not scope:
            page.entry_id = word  # looked up in the index page's sessions
            return None
        return list(dict.fromkeys(scope))  # a session named after its own workspace once

    # -- the entry page ------------------------------------------------------------------

    def entry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        ref = unquote(object_id)
        parts = ref.split("/")
        try:
            if len(parts) == 1:  # a workspace (LogEntry links for workspace actions)
                check_identifier("workspace ID", ref)
                return HttpResponseRedirect(self._changelist_url(status="all", q=ref))
            if len(parts) != 3:
                raise InvalidIdentifier("entry reference", ref)
            ws, ses, entry_id = parts
            check_identifier("workspace ID", ws)
            check_identifier("session ID", ses)
            check_identifier("entry ID", entry_id)
        except InvalidIdentifier as exc:
            context = self._context(request, "Outbox entry", invalid=str(exc), ref=ref)
            return TemplateResponse(
                request, "django_outbox/admin/entry_detail.html", context, status=404
            )
        try:
            (view,) = read_sessions(get_outbox(), [(ws, ses, None)])
        except OutboxUnavailable as exc:
            context = self._context(request, "Outbox entry", unavailable=str(exc), ref=ref)
            return TemplateResponse(
                request, "django_outbox/admin/entry_detail.html", context, status=503
            )
        entry = next((e for e in view.entries if e.id == entry_id), None)
        now = datetime.now(UTC)
        row = None
        pretty = ""
        if entry is not None:
            row = self._row(view, entry, derived_state(entry, view.lease), now)
            raw = view.raw.get(entry_id)
            stored = json.loads(raw) if raw else entry.to_dict()
            pretty = visible(json.dumps(stored, indent=2, ensure_ascii=False))
        ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
        history = (
            LogEntry.objects.filter(content_type=ct, object_id__in=[ref, ws])
            .select_related("user")
            .order_by("-action_time")
        )
        context = self._context(
            request,
            f"Outbox entry {entry_id}",
            ref=ref,
            workspace_id=ws,
            session_id=ses,
            entry_id=entry_id,
            entry=entry,
            row=row,
            view=view,
            pretty_json=pretty,
            blocked_by_in_flight=entry.blocked_by_in_flight if entry else False,
            history=history,
            can_retry=self.has_retry_permission(request),
            can_dismiss=self.has_dismiss_permission(request),
            detail_url=self._entry_url(ref),
            session_url=self._changelist_url(status="all", q=f"{ws}/{ses}"),
        )
        return TemplateResponse(
            request,
            "django_outbox/admin/entry_detail.html",
            context,
            status=200 if entry is not None else 404,
        )

    # -- actions ---------------------------------------------------------------------------

    def run_action(self, request: HttpRequest) -> HttpResponse:
        """Dispatch a POSTed action (CSRF is checked by ``admin_view``)."""
        name = request.POST.get("action", "")
        actions = self.get_actions(request)
        if name not in actions:
            if name in self.actions:
                raise PermissionDenied  # a known action this user may not run
            self.message_user(request, "No action selected.", messages.WARNING)
            return self._back(request)
        refs = request.POST.getlist(ACTION_CHECKBOX_NAME)
        workspaces = request.POST.getlist("workspace")
        if not refs and not workspaces:
            self.message_user(
                request,
                "Items must be selected in order to perform actions on them. "
                "No items have been changed.",
                messages.WARNING,
            )
            return self._back(request)
        func = actions[name][0]
        try:
            response = func(self, request, refs, workspaces)
        except OutboxUnavailable as exc:
            self.message_user(request, f"Nothing was done: {exc}", messages.ERROR)
            return self._back(request)
        return response or self._back(request)

    def _back(self, request: HttpRequest) -> HttpResponse:
        target = request.POST.get("next") or request.get_full_path()
        if not url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            target = self._changelist_url()
        return HttpResponseRedirect(target)

    def _entry_refs(self, request: HttpRequest, refs: list[str]) -> list[tuple[str, str, str]]:
        out = []
        for ref in refs:
            parts = ref.split("/")
            try:
                if len(parts) != 3:
                    raise InvalidIdentifier("entry reference", ref)
                check_identifier("workspace ID", parts[0])
                check_identifier("session ID", parts[1])
                check_identifier("entry ID", parts[2])
            except InvalidIdentifier:
                self.message_user(
                    request,
                    f"Ignored {visible(ref, 100)!r}: not an entry reference.",
                    messages.ERROR,
                )
                continue
            out.append((parts[0], parts[1], parts[2]))
        return out

    def _workspace_ids(self, request: HttpRequest, refs: list[str], extra: list[str]) -> list[str]:
        found: list[str] = []
        for value in [r.split("/")[0] for r in refs] + extra:
            try:
                check_identifier("workspace ID", value)
            except InvalidIdentifier:
                self.message_user(
                    request, f"Ignored {visible(value, 100)!r}: not a workspace ID.", messages.ERROR
                )
                continue
            if value not in found:
                found.append(value)
        return found

    def _log(self, request: HttpRequest, objs: list[OutboxEntry], flag: int, message: str) -> None:
        if objs:
            LogEntry.objects.log_actions(request.user.pk, objs, flag, message)

    def _report(self, request: HttpRequest, level: int, template: str, refs: list[str]) -> None:
        if not refs:
            return
        shown = ", ".join(refs[:10]) + (f" and {len(refs) - 10} more" if len(refs) > 10 else "")
        self.message_user(request, template.format(n=len(refs), refs=shown), level)

    def _per_entry(
        self,
        request: HttpRequest,
        refs: list[str],
        call: Any,
        done_result: Any,
        busy_result: Any,
        log_flag: int,
        log_message: str,
        done_message: str,
        busy_message: str,
    ) -> None:
        """Apply ``call(ws, ses, entry_id)`` to each selected entry, then log what changed
        and report done, busy and missing entries apart (busy is not missing)."""
        done: list[str] = []
        busy: list[str] = []
        missing: list[str] = []
        for ws, ses, entry_id in self._entry_refs(request, refs):
            result = call(ws, ses, entry_id)
            ref = f"{ws}/{ses}/{entry_id}"
            {done_result: done, busy_result: busy}.get(result, missing).append(ref)
        self._log(request, [OutboxEntry(ref=r) for r in done], log_flag, log_message)
        self._report(request, messages.SUCCESS, done_message, done)
        self._report(request, messages.WARNING, busy_message, busy)
        self._report(
            request,
            messages.ERROR,
            "Not found ({n}): {refs} — delivered, dismissed or cleaned up meanwhile.",
            missing,
        )

    @admin.action(description="Retry selected entries", permissions=["retry"])
    def retry_entries(self, request: HttpRequest, refs: list[str], workspaces: list[str]) -> None:
        self._per_entry(
            request,
            refs,
            get_outbox().retry,
            RetryResult.UPDATED,
            RetryResult.BUSY,
            CHANGE,
            "Retried from the admin: re-armed (due now).",
            "Re-armed {n} entr(ies): {refs}.",
            "Busy, not retried ({n}): {refs} — being delivered or verified under a live "
            "lease, or parked (unpark the workspace instead).",
        )

    @admin.action(description="Dismiss selected entries", permissions=["dismiss"])
    def dismiss_entries(self, request: HttpRequest, refs: list[str], workspaces: list[str]) -> None:
        self._per_entry(
            request,
            refs,
            get_outbox().dismiss,
            DismissResult.REMOVED,
            DismissResult.BUSY,
            DELETION,
            "Dismissed from the admin: removed, never to be delivered.",
            "Dismissed {n} entr(ies): {refs}.",
            "Busy, not dismissed ({n}): {refs} — being delivered or verified under a live lease.",
        )

    @admin.action(description="Park the workspaces of selected entries…", permissions=["park"])
    def park_workspaces(
        self, request: HttpRequest, refs: list[str], workspaces: list[str]
    ) -> HttpResponse | None:
        ids = self._workspace_ids(request, refs, workspaces)
        if not ids:
            return None
        form = ParkForm(request.POST if request.POST.get("post") == "yes" else None)
        if form.is_bound and form.is_valid():
            outbox = get_outbox()
            reason = form.cleaned_data["reason"]
            for ws in ids:
                count = outbox.park_workspace(ws, reason)
                if count:
                    self._log(
                        request,
                        [OutboxEntry.for_workspace(ws)],
                        CHANGE,
                        f"Parked workspace {ws} from the admin: {count} entries, "
                        f"reason {reason!r}.",
                    )
                    self.message_user(
                        request, f"Parked {count} entr(ies) of workspace {ws}.", messages.SUCCESS
                    )
                else:
                    self.message_user(
                        request,
                        f"Nothing to park in workspace {ws}: no pending, verifying or "
                        "delivering entries.",
                        messages.WARNING,
                    )
            return None
        outbox = get_outbox()
        sizes = run_pipeline(outbox, [("SCARD", outbox.keys.sessions(ws)) for ws in ids])
        context = self._context(
            request,
            "Park workspaces",
            form=form,
            workspaces=[(ws, int(n)) for ws, n in zip(ids, sizes, strict=True)],
            refs=refs,
            extra_workspaces=workspaces,
            next_url=request.POST.get("next", ""),
        )
        return TemplateResponse(request, "django_outbox/admin/park_workspace.html", context)

    @admin.action(description="Unpark the workspaces of selected entries", permissions=["park"])
    def unpark_workspaces(
        self, request: HttpRequest, refs: list[str], workspaces: list[str]
    ) -> None:
        outbox = get_outbox()
        for ws in self._workspace_ids(request, refs, workspaces):
            count = outbox.unpark_workspace(ws)
            if count:
                self._log(
                    request,
                    [OutboxEntry.for_workspace(ws)],
                    CHANGE,
                    f"Unparked workspace {ws} from the admin: {count} entries.",
                )
                self.message_user(
                    request, f"Unparked {count} entr(ies) of workspace {ws}.", messages.SUCCESS
                )
            else:
                self.message_user(
                    request, f"Nothing to unpark in workspace {ws}.", messages.WARNING
                )

    @admin.action(
        description="Delete all outbox data of the selected entries' workspaces…",
        permissions=["cleanup"],
    )
    def cleanup_workspaces(
        self, request: HttpRequest, refs: list[str], workspaces: list[str]
    ) -> HttpResponse | None:
        ids = self._workspace_ids(request, refs, workspaces)
        if not ids:
            return None
        outbox = get_outbox()
        if request.POST.get("post") == "yes":
            for ws in ids:
                removed = outbox.cleanup_workspace(ws)
                if removed:
                    self._log(
                        request,
                        [OutboxEntry.for_workspace(ws)],
                        DELETION,
                        f"Cleaned up workspace {ws} from the admin: {removed} keys removed.",
                    )
                    self.message_user(
                        request,
                        f"Deleted the outbox data of workspace {ws} ({removed} keys).",
                        messages.SUCCESS,
                    )
                else:
                    self.message_user(
                        request, f"Workspace {ws} had nothing to delete.", messages.WARNING
                    )
            return None
        summary = self.cleanup_summary(outbox, ids)
        context = self._context(
            request,
            "Are you sure?",
            summary=summary,
            total_sessions=sum(w["session_count"] for w in summary),
            total_entries=sum(w["entry_count"] for w in summary),
            refs=refs,
            extra_workspaces=workspaces,
            next_url=request.POST.get("next", ""),
        )
        return TemplateResponse(request, "django_outbox/admin/cleanup_workspace.html", context)

    def cleanup_summary(self, outbox: Outbox, ids: list[str]) -> list[dict[str, Any]]:
        """What a cleanup deletes, per workspace: its sessions with their entry counts.

        Reads each workspace's session SET, then LLEN of every queue and staging
        list and EXISTS of every lease in one pipeline (exact counts; only the
        first ``CLEANUP_LIST_LIMIT`` sessions are listed).
        """
        members = run_pipeline(outbox, [("SMEMBERS", outbox.keys.sessions(ws)) for ws in ids])
        calls = []
        layout = []
        for ws, sessions in zip(ids, members, strict=True):
            names = sorted(_text(s) for s in sessions)
            layout.append((ws, names))
            for ses in names:
                k = outbox.keys.session(ws, ses)
                calls += [
                    ("LLEN", k.queue),
                    ("LLEN", k.staging),
                    ("EXISTS", k.lock),
                ]
        answers = iter(run_pipeline(outbox, calls))
        summary = []
        for ws, names in layout:
            sessions = []
            for ses in names:
                queued, staged, locked = int(next(answers)), int(next(answers)), int(next(answers))
                sessions.append({"session_id": ses, "entries": queued + staged, "leased": locked})
            summary.append(
                {
                    "workspace_id": ws,
                    "session_count": len(sessions),
                    "entry_count": sum(s["entries"] for s in sessions),
                    "leased": sum(s["leased"] for s in sessions),
                    "sessions": sessions[:CLEANUP_LIST_LIMIT],
                    "more": max(0, len(sessions) - CLEANUP_LIST_LIMIT),
                }
            )
        return summary
