"""The outbox dashboard in the admin (docs/howto/observe.md#the-dashboard): are prompts
flowing, how long do they wait, is anything stuck, and since when.

It charts the per-minute history the scripts and workers keep in Valkey
(:mod:`django_outbox.core.history`): throughput by outcome, accept → delivered latency
(p50, p95, p99 from the per-minute buckets), entries by status and the most overdue
wait (from the minute's sample), over the last hour (a point a minute) or day (a point
every ten minutes), with the live workers and the sessions needing attention, and, with
more than one agent, the steps of each agent by outcome (a table, and a chart of one agent
picked with ``?agent=``; docs/howto/agents.md#metrics-per-agent). Charts are
SVG drawn here, on the server (no charting library, no build step, no CDN); the page
swaps in a fresh copy of its body every :data:`REFRESH_SECONDS` (``dashboard.js``).
Reads: Valkey's TIME and one HGETALL per minute (two round trips), the workers' heartbeats,
and one page of the attention index.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from ..core.history import (
    LATENCY_BUCKETS,
    UNKNOWN_OUTCOMES,
    History,
    HistoryMinute,
    summary,
)

#: Window name -> (minutes read, minutes per point).
WINDOWS = {"hour": (60, 1), "day": (1440, 10)}
#: Seconds between two refreshes of the page's body.
REFRESH_SECONDS = 10
#: The response header that marks a refresh fragment (``dashboard.js`` swaps in nothing else).
FRAGMENT_HEADER = "X-Outbox-Dashboard-Fragment"
#: Statuses charted from the minute's sample, in this order.
STATUSES = ("pending", "delivering", "verifying", "error", "parked")
#: Sessions needing attention listed, at most.
ATTENTION_ROWS = 10
#: What a figure that cannot be known shows (an en dash).
NONE = "\u2013"
#: Latency shown for the open last bucket (more than an hour).
LATENCY_CEILING = 2 * LATENCY_BUCKETS[-2]

#: The per-agent table's columns (and the agent chart's lines): ``(name, the step outcomes
#: it sums)``; steps of any other outcome count in the table's total only.
AGENT_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("delivered", ("delivered",)),
    ("failed", ("failed", "absent", "transient", "prior_pending", "unverifiable")),
    ("held", ("held",)),
    ("unknown", UNKNOWN_OUTCOMES),
    ("lost", ("lost",)),
)

WIDTH, HEIGHT = 600, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 8, 10, 22


@dataclass(frozen=True, slots=True)
class Series:
    """One line: its ``name`` (legend and CSS class ``s-<name>``) and a value per point
    (None: no data there, the line breaks)."""

    name: str
    values: list[float | None]


def _label(minute: int) -> str:
    return datetime.fromtimestamp(minute * 60, UTC).strftime("%H:%M")


def _fmt(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2g}"


def _fmt_seconds(value: float) -> str:
    """A latency axis label: ``0.25 s``, ``30 s``, ``5 min``, ``1 h``."""
    if value >= 3600 and value % 3600 == 0:
        return f"{value / 3600:.0f} h"
    if value >= 60 and value % 60 == 0:
        return f"{value / 60:.0f} min"
    return f"{_fmt(value)} s"


def _linear_ticks(top: float, whole: bool) -> list[float]:
    """0 up to the smallest multiple of a 1/2/2.5/5 x 10^k step at or above ``top``, in
    at most four steps (``whole``: steps of at least 1, for counts)."""
    raw = top / 4
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    if whole:
        step = max(1.0, math.ceil(step))
    count = max(1, math.ceil(top / step - 1e-9))
    return [step * i for i in range(count + 1)]


def _log_ticks(bottom: float, top: float) -> list[float]:
    """Latency bucket bounds from ``bottom`` to ``top`` (both included), thinned to five."""
    bounds = [b for b in (*LATENCY_BUCKETS[:-1], LATENCY_CEILING) if bottom <= b <= top]
    ticks = sorted({bottom, *bounds, top})
    while len(ticks) > 5:
        ticks = ticks[:1] + ticks[1:-1][1::2] + ticks[-1:]
    return ticks


def _time_ticks(labels: Sequence[str]) -> list[tuple[int, str]]:
    """``(index, HH:MM)`` of the round times among ``labels`` (``HH:MM``, one a point,
    oldest first): the first point at or after every 5, 10, 15, 30 minutes or 1, 2, 3,
    4, 6 hours, the shortest that gives at most six; none when a label is not a time."""
    try:
        minutes = [int(t[:2]) * 60 + int(t[3:5]) for t in labels]
    except ValueError:
        return []
    for every in (5, 10, 15, 30, 60, 120, 180, 240, 360, 720):
        found = [
            (i, f"{m // every * every // 60:02d}:{m // every * every % 60:02d}")
            for i, m in enumerate(minutes)
            if m % every == 0 or (i and m // every != minutes[i - 1] // every)
        ]
        if len(found) <= 6:
            return found
    return []  # pragma: no cover (every 12 h gives at most three a day)


def line_chart(
    series: Sequence[Series], labels: Sequence[str], *, title: str, log: bool = False
) -> SafeString:
    """An SVG line chart of ``series`` over ``labels`` (one per point, ``HH:MM`` times are
    marked on the round ones), y from 0 (or, with ``log``, a log10 axis of seconds from
    the smallest positive value) to a round value at or above the largest one. Every
    value and label is a number or fixed text; all of it goes through ``format_html``."""
    n = max(len(labels), 2)
    values = [v for s in series for v in s.values if v is not None]
    positive = [v for v in values if v > 0]
    top = max(values, default=0.0) or 1.0
    bottom = min(positive, default=top / 10) if log else 0.0
    if log and bottom >= top:
        bottom = top / 10
    if log:
        yticks = _log_ticks(bottom, top)
    else:
        yticks = _linear_ticks(top, all(v == int(v) for v in values))
        top = yticks[-1]

    def y(v: float) -> float:
        if log:
            v = max(v, bottom)
            share = (math.log10(v) - math.log10(bottom)) / (math.log10(top) - math.log10(bottom))
        else:
            share = v / top
        return TOP + (HEIGHT - TOP - BOTTOM) * (1 - share)

    def x(i: int) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * i / (n - 1)

    lines = []
    for s in series:
        run: list[str] = []
        runs: list[list[str]] = []
        for i, v in enumerate(s.values):
            if v is None:
                if run:
                    runs.append(run)
                run = []
                continue
            run.append(f"{x(i):.1f},{y(v):.1f}")
        if run:
            runs.append(run)
        for points in runs:
            if len(points) == 1:  # a lone point: a dot, so it is seen
                cx, cy = points[0].split(",")
                lines.append(
                    format_html('<circle class="s-{}" cx="{}" cy="{}" r="2"/>', s.name, cx, cy)
                )
            else:
                lines.append(
                    format_html(
                        '<polyline class="s-{}" data-series="{}" points="{}"/>',
                        s.name,
                        s.name,
                        " ".join(points),
                    )
                )
    grid = format_html_join(
        "",
        '<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>'
        '<text class="ylabel" x="{}" y="{}">{}</text>',
        (
            (
                LEFT,
                WIDTH - RIGHT,
                f"{y(v):.1f}",
                f"{y(v):.1f}",
                LEFT - 4,
                f"{y(v) + 3.5:.1f}",
                _fmt_seconds(v) if log else _fmt(v),
            )
            for v in yticks
        ),
    )

    def anchor(i: int) -> str:
        if x(i) - LEFT < 16:
            return "start"
        return "end" if WIDTH - RIGHT - x(i) < 16 else "middle"

    xticks = [(i, text) for i, text in _time_ticks(labels) if i < n]
    xlabels = format_html_join(
        "",
        '<line class="grid tick" x1="{}" x2="{}" y1="{}" y2="{}"/>'
        '<text class="xlabel" x="{}" y="{}" text-anchor="{}">{}</text>',
        (
            (
                f"{x(i):.1f}",
                f"{x(i):.1f}",
                TOP,
                HEIGHT - BOTTOM,
                f"{x(i):.1f}",
                HEIGHT - 6,
                anchor(i),
                text,
            )
            for i, text in xticks
        ),
    )
    legend = format_html_join(
        "", '<li><span class="swatch s-{}"></span>{}</li>', ((s.name, s.name) for s in series)
    )
    return format_html(
        '<svg class="outbox-chart" viewBox="0 0 {} {}" role="img" aria-label="{}">{}{}{}</svg>'
        '<ul class="outbox-legend">{}</ul>',
        WIDTH,
        HEIGHT,
        title,
        grid,
        xlabels,
        mark_safe("".join(lines)),  # each part built by format_html above
        legend,
    )


def _groups(history: History, per_point: int) -> list[list[HistoryMinute]]:
    minutes = history.minutes
    start = len(minutes) % per_point
    return [minutes[i : i + per_point] for i in range(start, len(minutes), per_point)]


def _last_sample(group: list[HistoryMinute]) -> HistoryMinute | None:
    for m in reversed(group):
        if m.sampled:
            return m
    return None


def charts(history: History, per_point: int) -> dict[str, SafeString]:
    """The four charts of a window of history, by name (``throughput``, ``latency``,
    ``depth``, ``overdue``)."""
    groups = _groups(history, per_point)
    labels = [_label(g[0].minute) for g in groups]
    throughput = [
        Series("accepted", [float(sum(m.get("a") for m in g)) for g in groups]),
        Series("delivered", [float(sum(m.delivered for m in g)) for g in groups]),
        Series("failed", [float(sum(m.failed for m in g)) for g in groups]),
        Series("unknown", [float(sum(m.unknown for m in g)) for g in groups]),
        # A member's own Stop is neither a failure nor unknown (docs/howto/cutting.md).
        Series("cut", [float(sum(m.cut for m in g)) for g in groups]),
        Series("cancelled", [float(sum(m.cancelled for m in g)) for g in groups]),
        Series("parked", [float(sum(m.get("p") for m in g)) for g in groups]),
    ]

    def quantile(q: float, g: list[HistoryMinute]) -> float | None:
        v = history.latency_quantile(q, g)
        return None if v is None else min(v, LATENCY_CEILING)

    latency = [
        Series(f"p{int(q * 100)}", [quantile(q, g) for g in groups]) for q in (0.5, 0.95, 0.99)
    ]
    samples = [_last_sample(g) for g in groups]
    depth = [
        Series(status, [float(s.depth().get(status, 0)) if s else None for s in samples])
        for status in STATUSES
    ]
    overdue = [Series("overdue", [float(s.get("oldest")) if s else None for s in samples])]
    unit = "minute" if per_point == 1 else f"{per_point} minutes"
    return {
        "throughput": line_chart(throughput, labels, title=f"Entries per {unit}"),
        "latency": line_chart(latency, labels, title="Accept to delivered, seconds", log=True),
        "depth": line_chart(depth, labels, title="Entries by status"),
        "overdue": line_chart(overdue, labels, title="Most overdue wait, seconds"),
    }


def tiles(history: History, depth: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """The window's totals: ``(label, value)`` pairs, values already formatted. ``depth``
    (entries by status now) defaults to the last minute's sample."""
    totals = summary(history)  # the same sums as manage.py outbox status
    p95 = totals["latencySeconds"]["p95"]
    last = next((m for m in reversed(history.minutes) if m.sampled), None)
    if depth is None and last is not None:
        depth = last.depth()
    return [
        ("accepted", f"{totals['accepted']:,}"),
        ("delivered", f"{totals['delivered']:,}"),
        ("failed attempts", f"{totals['failedAttempts']:,}"),
        ("unknown outcomes", f"{totals['unknownOutcomes']:,}"),
        ("stopped turns", f"{totals['cutTurns']:,}"),
        ("cancelled", f"{totals['cancelled']:,}"),
        ("moved to error", f"{totals['movedToError']:,}"),
        (
            "p95 latency",
            NONE if p95 is None else ("> 1 h" if p95 == "+Inf" else f"≤ {_fmt(p95)} s"),
        ),
        (
            "queued now",
            f"{sum(depth.get(s, 0) for s in ('pending', 'delivering', 'verifying')):,}"
            if depth is not None
            else NONE,
        ),
        ("in error now", f"{depth.get('error', 0):,}" if depth is not None else NONE),
        # Prompts that expired unsent wait for a person as errors do (docs/howto/steering.md).
        ("expired now", f"{depth.get('expired', 0):,}" if depth is not None else NONE),
    ]


def agent_rows(history: History, configured: Sequence[str]) -> list[dict[str, Any]]:
    """The per-agent table over ``history`` (total history: the ``ag:`` fields): one row
    per agent ``configured`` or seen in the window, by name, each ``{"name",
    "configured", "cells": [steps per AGENT_COLUMNS column], "steps": all its steps}``."""
    steps = history.agent_steps()
    rows = []
    for name in sorted({*configured, *steps}):
        counts = steps.get(name, {})
        rows.append(
            {
                "name": name,
                "configured": name in configured,
                "cells": [sum(counts.get(o, 0) for o in outcomes) for _, outcomes in AGENT_COLUMNS],
                "steps": sum(counts.values()),
            }
        )
    return rows


def agent_chart(history: History, per_point: int, agent: str) -> SafeString:
    """A chart of ``agent``'s steps per point, one line per :data:`AGENT_COLUMNS` column."""
    groups = _groups(history, per_point)
    per_group = [history.agent_steps(g).get(agent, {}) for g in groups]
    series = [
        Series(name, [float(sum(c.get(o, 0) for o in outcomes)) for c in per_group])
        for name, outcomes in AGENT_COLUMNS
    ]
    unit = "minute" if per_point == 1 else f"{per_point} minutes"
    labels = [_label(g[0].minute) for g in groups]
    return line_chart(series, labels, title=f"Steps of agent {agent} per {unit}")


def _workspace_sessions(outbox: Any, workspace_id: str) -> list[tuple[str, str]]:
    found = outbox.search(workspace_id)
    return [pair for pair in found.sessions or [] if pair[0] == workspace_id]


def context(
    outbox: Any, window: str, workspace_id: str | None = None, agent: str | None = None
) -> dict[str, Any]:
    """Everything the dashboard template shows for ``window`` (a key of :data:`WINDOWS`),
    over every workspace or one (a valid ID: its own history, its entries by status
    now and its sessions needing attention, among its first
    ``SEARCH_MAX_SESSIONS``; depth is sampled over every workspace only, so its charts
    are left out). Over every workspace, with more than one agent configured or seen,
    ``agents`` is the per-agent table (:func:`agent_rows`); ``agent`` (an agent
    configured or seen; else a note in ``agent_notes`` and no chart) adds its chart
    (:func:`agent_chart`). Raises :class:`~django_outbox.core.errors.OutboxUnavailable`."""
    minutes, per_point = WINDOWS[window]
    history = outbox.history(minutes, workspace_id)
    depth: dict[str, int] | None = None
    if workspace_id is None:
        page = outbox.session_page("attention", ATTENTION_ROWS)
    else:
        pairs = _workspace_sessions(outbox, workspace_id)
        page = outbox.session_page("attention", ATTENTION_ROWS, among=pairs)
        depth = {}
        for counts in outbox.status_counts(pairs) if pairs else []:
            for status, n in counts.items():
                depth[status] = depth.get(status, 0) + n
    now = history.now
    workers = [
        {
            "id": w.id,
            "live": w.live,
            "seen": max(0, int(now - w.last_seen)),
            "in_flight": w.in_flight,
            "concurrency": w.concurrency,
            "steps": w.steps,
            "per_minute": (
                f"{w.steps / max(1 / 60, (now - w.started) / 60):,.1f}"
                if w.steps is not None and w.started
                else NONE
            ),
        }
        for w in page.workers
    ]
    attention = [
        {
            "workspace_id": s.workspace_id,
            "session_id": s.session_id,
            "since": max(0, int(now - s.score_ms / 1000)) if s.score_ms else None,
        }
        for s in page.sessions
    ]
    drawn = charts(history, per_point)
    if workspace_id is not None:
        del drawn["depth"], drawn["overdue"]
    rows = agent_rows(history, outbox.agent_names()) if workspace_id is None else []
    agents = rows if len(rows) > 1 else []
    agent_notes: list[str] = []
    if agent is not None:
        if workspace_id is not None:
            agent_notes.append("Steps by agent are kept over every workspace only.")
            agent = None
        elif agent not in {row["name"] for row in rows}:
            agent_notes.append(f"No agent named {agent[:64]!r} here. Showing every agent.")
            agent = None
        else:
            drawn["agent"] = agent_chart(history, per_point, agent)
    return {
        "window": window,
        "windows": list(WINDOWS),
        "workspace_id": workspace_id,
        "charts": drawn,
        "tiles": tiles(history, depth),
        "workers": workers,
        "attention": attention,
        "attention_total": page.total if workspace_id is not None else page.totals.attention,
        "agents": agents,
        "agent": agent,
        "agent_columns": [name for name, _ in AGENT_COLUMNS],
        "agent_notes": agent_notes,
        "refresh_seconds": REFRESH_SECONDS,
        "read_at": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }
