"""Per-minute history in Valkey: what the admin dashboard and ``manage.py outbox status``
chart (docs/howto/observe.md#the-dashboard).

Where it lives: one HASH per minute (``minute`` = epoch seconds // 60 on Valkey's
clock) for each workspace (:meth:`KeySpace.history` with the workspace, in its
slot) and one in total (without), each expiring ``HISTORY_WINDOW`` + 2 minutes after
its last new field. ``HISTORY_WINDOW`` = 0 writes nothing.

Fields (all counts, except the samples):

==============  ========================================================================
``a``           accepted (``accept.lua``, replays and refusals not counted)
``p``           entries parked (accepted into a parked workspace, or by a park)
``d``           delivered by the deliverer
``v``           confirmed delivered by the verifier
``vl``          confirmed delivered by the ledger probe (``ledger_complete.lua``)
``o:<outcome>`` settles of any other outcome: ``failed``, ``absent``, ``transient``,
                ``prior_pending``, ``held``, ``ambiguous``, ``inconclusive``, ``unverifiable``
``e``           entries a settle moved to error (attempts or verification exhausted)
``c``           turns cut by a Stop (docs/howto/cutting.md): the settle of the attempt or
                verification a cut stopped, counted here instead of ``o:<outcome>`` (the
                outcome of a cut call is the cut's doing, neither a failure nor unknown)
``k``           queued prompts cancelled (``cancel.lua``, in the same script)
``kc``          cut prompts that proved never delivered and left as cancelled (the
                settle of a cut entry that cancels it)
``x``           entries an operator changed (retry, dismiss, unpark, ...: the operator scripts)
                and workspace cleanups
``l<i>``        deliveries (``d`` and the verifier's ``v``) whose accept → delivered
                time fell in bucket ``i`` of :data:`LATENCY_BUCKETS`
``n:<status>``  (total only) entries by status when the minute was sampled
``oldest``      (total only) seconds the most overdue session had waited past its due
                time then (0: none overdue)
``workers``     (total only) live workers then
``ag:<a>:<o>``  (total only) deliver and verify steps that agent ``<a>`` served, by
                outcome ``<o>``, as ``outbox_agent_steps_total`` counts them
                (docs/howto/agents.md#metrics-per-agent): ``delivered``, ``failed``,
                ``held``, ``ambiguous``, ... or ``lost`` (the lease was lost); a merged
                delivery is one step; agent ``?``: it could not be resolved
==============  ========================================================================

Who writes what, and what it costs:

* ``accept.lua`` and the operator scripts count ``a``, ``p``, ``vl`` and ``x`` in the
  same script as the transition: exact, one HINCRBY per key (the TTL is set only when a
  field is new). On a cluster they reach the workspace's HASH only (the total lives in
  another slot); the worker sampling a minute adds the workspaces' ``a``, ``p``,
  ``vl`` and ``x`` of the minute before into the total
  (:meth:`HistoryReads.asample_history`).
* The worker counts its own settles in memory (:class:`HistoryCounter`) and writes
  them every :data:`FLUSH_EVERY` seconds in one pipeline, off the delivery path: no
  command per message. A worker killed with SIGKILL loses at most that much of its
  counts; a graceful stop writes them.
* The agent steps (``ag:``) are counted the same way, in memory, by the delivery step
  as it tells ``Outbox.agent_step_listeners`` (:meth:`HistoryCounter.agent_step`), into
  the total HASH only: the dashboard splits outcomes by agent over every workspace.
* Once a minute one worker (whichever claims ``histsample:<minute>`` first) samples
  depth by status, the most overdue session and the live workers into the total.
  Depth by status walks every session's statuses (up to 50,000 sessions), so it is
  walked again only when something changed since the last walk (a count above, or a
  delivery in flight) or the walk is :data:`DEPTH_REFRESH_MINUTES` old; otherwise the
  last walk's counts are written again. An idle worker over 100,000 parked sessions
  reads a few keys a minute (``histdepth`` marks the last walk).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .entry import Entry, parse_time
from .errors import OutboxUnavailable
from .keys import KeySpace
from .paging import as_text
from .plans import Cmd, Pipe, iter_once
from .transport import Transport

logger = logging.getLogger("django_outbox")

#: Upper bounds (seconds) of the accept → delivered latency buckets; the last is open.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    math.inf,
)
#: The settle outcomes counted as ``o:<outcome>`` (every one but delivered).
OUTCOMES = (
    "failed",
    "absent",
    "transient",
    "prior_pending",
    "held",
    "ambiguous",
    "inconclusive",
    "unverifiable",
)
#: Outcomes that say the attempt did not deliver (retried, or moved to error).
FAILED_OUTCOMES = ("failed", "absent", "transient", "prior_pending", "held", "unverifiable")
#: Outcomes that say nobody knows yet (the entry is verified).
UNKNOWN_OUTCOMES = ("ambiguous", "inconclusive")
#: Seconds between two writes of a worker's counts.
FLUSH_EVERY = 2.0
#: Minutes of unwritten counts a worker keeps while Valkey cannot be reached.
MAX_PENDING_MINUTES = 60
#: The fields only scripts count (so only a workspace's HASH has them on a cluster,
#: where the sampler adds them into the total).
ROLLED_UP = ("a", "p", "vl", "x", "k")
#: Fields that count a change of some entry's status (besides the ``o:<outcome>``
#: settles): accepts, parks, deliveries, verifications, ledger confirmations, moves to
#: error and operator changes (``x``: retries, dismissals, unparks, cleanups).
CHANGES = ("a", "p", "d", "v", "vl", "e", "x", "c", "kc")
#: The depth sample walks every session's statuses at least this often, minutes (and
#: whenever something changed since the last walk, see :meth:`asample_history`).
DEPTH_REFRESH_MINUTES = 60
#: The prefix of the per-agent step fields, ``ag:<agent>:<outcome>`` (an agent name has no
#: colon: docs/howto/agents.md).
AGENT_FIELD = "ag:"
#: The workspace under which :class:`HistoryCounter` keeps counts for the total HASH only
#: (no workspace ID is empty).
TOTAL_ONLY = ""
#: Workspaces whose accepts the cluster sampler adds into the total, at most.
ROLLUP_MAX_WORKSPACES = 10_000

_DELIVERED_AT = '"deliveredAt":"'
_ERROR_STATE = '"status":"error"'
_INTERRUPTED = '"interrupted":true'
_CONTENT = ',"clientMessageID":'
_CONTENT_B = _CONTENT.encode()
_DELIVERED_AT_B = _DELIVERED_AT.encode()


_LATENCY_FIELDS = tuple(f"l{i}" for i in range(len(LATENCY_BUCKETS)))


def latency_bucket(seconds: float) -> int:
    """The index in :data:`LATENCY_BUCKETS` of a latency of ``seconds``."""
    for i, bound in enumerate(LATENCY_BUCKETS):
        if seconds <= bound:
            return i
    return len(LATENCY_BUCKETS) - 1  # pragma: no cover (the last bound is infinite)


def _state_part(raw: Any) -> str:
    text = as_text(raw)
    cut = text.find(_CONTENT)
    return text if cut < 0 else text[:cut]


def delivered_at_us(raw: Any) -> int | None:
    """The ``deliveredAt`` of a stored entry's JSON (str or bytes), in microseconds
    (Valkey's clock), read from its state members only; None when it has none. (Bytes are
    searched as they are: this runs once per delivery.)"""
    data = raw if isinstance(raw, bytes) else as_text(raw).encode()
    cut = data.find(_CONTENT_B)
    at = data.find(_DELIVERED_AT_B, 0, len(data) if cut < 0 else cut)
    if at < 0:
        return None
    start = at + len(_DELIVERED_AT_B)
    try:
        return parse_time(data[start : data.find(b'"', start)].decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None


class HistoryCounter:
    """A worker's settles, counted in memory until :meth:`take` hands them to a flush.

    ``ttl_ms`` is the keys' TTL (0: history off, nothing is counted). Minutes are on
    Valkey's clock: a delivery's own ``deliveredAt``, otherwise the local clock plus
    :attr:`offset_us` (Valkey's ``TIME`` minus the local clock, measured by each flush).
    ``clock`` returns local epoch microseconds (injectable for tests).
    """

    def __init__(self, keys: KeySpace, ttl_ms: int, clock: Any = None) -> None:
        self.keys = keys
        self.ttl_ms = ttl_ms
        self.offset_us: int | None = None
        self._clock = clock or (lambda: time.time_ns() // 1000)
        self._counts: dict[tuple[int, str], Counter[str]] = {}
        self._newest = 0  # the minute (now) of the last prune

    @property
    def enabled(self) -> bool:
        return self.ttl_ms > 0

    @property
    def pending(self) -> bool:
        """Whether counts wait to be written."""
        return bool(self._counts)

    def _minute(self, at_us: int | None = None) -> int:
        if at_us is None:
            at_us = self._clock() + (self.offset_us or 0)
        return at_us // 60_000_000

    def add(self, workspace_id: str, name: str, n: int = 1, at_us: int | None = None) -> None:
        """Count ``n`` of field ``name`` for ``workspace_id`` in the minute of ``at_us``
        (Valkey-clock microseconds; None: now). Counts older than
        :data:`MAX_PENDING_MINUTES` are dropped when a new minute starts, so a process
        whose writes keep failing (Valkey away) holds at most that many minutes."""
        if not self.enabled or n <= 0:
            return
        key = (self._minute(at_us), workspace_id)
        counts = self._counts.get(key)
        if counts is None:
            now = self._minute()
            if now != self._newest:
                self._newest = now
                self._drop_older_than(now - MAX_PENDING_MINUTES)
            if key[0] < now - MAX_PENDING_MINUTES:
                return
            counts = self._counts[key] = Counter()
        counts[name] += n

    def _drop_older_than(self, oldest: int) -> None:
        for key in [k for k in self._counts if k[0] < oldest]:
            del self._counts[key]

    def settled(
        self,
        workspace_id: str,
        entry: Entry,
        outcome: str,
        kind: str,
        raw: Any,
        members: Iterable[Any] = (),
    ) -> None:
        """Count one settle: ``entry`` as claimed (a ``verifying`` one was a verification),
        the ``outcome`` recorded, the settle's answer ``kind`` (``removed``, ``updated``,
        ``replayed``, ``lost``, ``gone``) and the stored entry it answered with (``raw``,
        None for a replay). A lost or gone settle recorded nothing: not counted.
        ``members``: the other entries of a merged message, counted alike
        (:meth:`settled_members`).

        A settle that is not a delivery of an entry a Stop cut (its stored state says
        ``interrupted``) is no failure: it counts ``c`` when the cut came during this
        attempt (the entry was claimed uncut) and ``kc`` when it removed the entry as
        cancelled (``kind`` ``cancelled``: never delivered), instead of ``o:<outcome>``;
        a later verification of a cut entry whose outcome stays unknown counts as any
        other (docs/howto/cutting.md)."""
        if not self.enabled or kind not in ("removed", "updated", "replayed", "cancelled"):
            return
        self.settled_members(workspace_id, outcome, kind, members)
        if outcome != "delivered" and raw is not None and _INTERRUPTED in _state_part(raw):
            cut_now = not entry.interrupted
            if cut_now:
                self.add(workspace_id, "c")
            if kind == "cancelled":
                self.add(workspace_id, "kc")
            elif not cut_now:
                self.add(workspace_id, f"o:{outcome}")
            if _ERROR_STATE in _state_part(raw):
                self.add(workspace_id, "e")
            return
        if kind == "cancelled":  # (a cut entry's settle answers nothing else)
            return
        if outcome != "delivered":
            self.add(workspace_id, f"o:{outcome}")
            if raw is not None and _ERROR_STATE in _state_part(raw):
                self.add(workspace_id, "e")
            return
        at = delivered_at_us(raw) if raw is not None else None
        if at is None:
            at = self._clock() + (self.offset_us or 0)
        self.add(workspace_id, "v" if entry.status == "verifying" else "d", at_us=at)
        try:
            seconds = (at - parse_time(entry.accepted_at)) / 1_000_000
        except ValueError:
            return
        self.add(workspace_id, _LATENCY_FIELDS[latency_bucket(max(0.0, seconds))], at_us=at)

    def settled_members(
        self, workspace_id: str, outcome: str, kind: str, members: Iterable[Any]
    ) -> None:
        """Count the other entries of a merged message (a settle's ``members``, as stored
        now: staged, or verifying as the head was claimed) as :meth:`settled` counts the
        head (docs/howto/steering.md#merging)."""
        for raw in members:
            self.settled(workspace_id, Entry.from_json(raw), outcome, kind, raw)

    def agent_step(self, agent: str, step: str, outcome: str, result: str, seconds: float) -> None:
        """Count one deliver or verify step (told with ``Outbox.agent_step_listeners``)
        that ``agent`` served as ``ag:<agent>:<outcome>`` in the total of the minute now
        (``lost`` when the settle's ``result`` says the lease was lost), as the worker's
        ``outbox_agent_steps_total`` does (docs/howto/observe.md#the-dashboard)."""
        if step in ("deliver", "verify"):
            outcome = "lost" if result == "lost" else outcome
            self.add(TOTAL_ONLY, f"{AGENT_FIELD}{agent}:{outcome}")

    def take(self) -> dict[tuple[int, str], Counter[str]]:
        """Everything counted since the last take (the counter starts empty again)."""
        counts, self._counts = self._counts, {}
        return counts

    def give_back(self, counts: dict[tuple[int, str], Counter[str]]) -> None:
        """Return counts whose flush failed; minutes older than
        :data:`MAX_PENDING_MINUTES` are dropped (their keys have expired or soon will)."""
        oldest = self._minute() - MAX_PENDING_MINUTES
        for key, found in counts.items():
            if key[0] < oldest:
                continue
            mine = self._counts.setdefault(key, Counter())
            mine.update(found)

    def flush_calls(self, counts: dict[tuple[int, str], Counter[str]]) -> list[Cmd]:
        """The commands that write ``counts`` (as :meth:`take` returns them): HINCRBY into
        each workspace's (not for :data:`TOTAL_ONLY`) and the total HASH of each minute,
        then a PEXPIRE of each key."""
        calls: list[Cmd] = []
        totals: dict[int, Counter[str]] = {}
        for (minute, ws), found in sorted(counts.items()):
            totals.setdefault(minute, Counter()).update(found)
            if ws == TOTAL_ONLY:
                continue
            key = self.keys.history(minute, ws)
            calls += [Cmd(("HINCRBY", key, name, n)) for name, n in sorted(found.items())]
            calls.append(Cmd(("PEXPIRE", key, self.ttl_ms)))
        for minute, found in sorted(totals.items()):
            key = self.keys.history(minute)
            calls += [Cmd(("HINCRBY", key, name, n)) for name, n in sorted(found.items())]
            calls.append(Cmd(("PEXPIRE", key, self.ttl_ms)))
        return calls


# =====================================================================================
# what a window of history holds
# =====================================================================================


@dataclass(frozen=True, slots=True)
class HistoryMinute:
    """One minute of history: ``minute`` (epoch seconds // 60) and its ``fields`` as
    stored (absent fields are 0)."""

    minute: int
    fields: dict[str, int] = field(default_factory=dict)

    def get(self, name: str) -> int:
        return self.fields.get(name, 0)

    @property
    def delivered(self) -> int:
        """Delivered in the minute: by the deliverer and confirmed by the verifier or ledger."""
        return self.get("d") + self.get("v") + self.get("vl")

    @property
    def failed(self) -> int:
        """Attempts of the minute known not to have delivered (every outcome of
        :data:`FAILED_OUTCOMES`)."""
        return sum(self.get(f"o:{o}") for o in FAILED_OUTCOMES)

    @property
    def unknown(self) -> int:
        """Attempts and verifications of the minute whose outcome was not known
        (``ambiguous``, ``inconclusive``): left to verification, not failures."""
        return sum(self.get(f"o:{o}") for o in UNKNOWN_OUTCOMES)

    @property
    def cut(self) -> int:
        """Turns a Stop cut in the minute (``c``): neither failures nor unknown."""
        return self.get("c")

    @property
    def cancelled(self) -> int:
        """Prompts cancelled in the minute: queued ones (``k``) and cut ones that proved
        never delivered (``kc``)."""
        return self.get("k") + self.get("kc")

    @property
    def sampled(self) -> bool:
        """Whether a worker sampled depth in this minute."""
        return "workers" in self.fields

    def depth(self) -> dict[str, int]:
        """Entries by status when the minute was sampled (``{}`` if it was not)."""
        return {k[2:]: v for k, v in self.fields.items() if k.startswith("n:")}

    def latency_counts(self) -> list[int]:
        """Deliveries per bucket of :data:`LATENCY_BUCKETS`."""
        return [self.get(f"l{i}") for i in range(len(LATENCY_BUCKETS))]

    def agent_steps(self) -> dict[str, dict[str, int]]:
        """The minute's deliver and verify steps by agent and outcome (total only):
        ``{agent: {outcome: steps}}``, ``{}`` when none was counted."""
        out: dict[str, dict[str, int]] = {}
        for name, n in self.fields.items():
            if name.startswith(AGENT_FIELD):
                agent, _, outcome = name[len(AGENT_FIELD) :].rpartition(":")
                if agent and outcome:
                    out.setdefault(agent, {})[outcome] = n
        return out


@dataclass(frozen=True, slots=True)
class History:
    """``minutes`` of history, oldest first, one per minute of the window (minutes with
    nothing stored are empty), of ``workspace_id`` (None: every workspace); ``now`` is
    Valkey's clock when read (epoch seconds)."""

    minutes: list[HistoryMinute]
    workspace_id: str | None
    now: float

    def total(self, name: str) -> int:
        """The sum of field ``name`` over the window."""
        return sum(m.get(name) for m in self.minutes)

    def latency_counts(self, minutes: Iterable[HistoryMinute] | None = None) -> list[int]:
        """Deliveries per latency bucket over the window (or over ``minutes``)."""
        sums = [0] * len(LATENCY_BUCKETS)
        for m in self.minutes if minutes is None else minutes:
            for i, n in enumerate(m.latency_counts()):
                sums[i] += n
        return sums

    def agent_steps(
        self, minutes: Iterable[HistoryMinute] | None = None
    ) -> dict[str, dict[str, int]]:
        """Deliver and verify steps by agent and outcome over the window (or over
        ``minutes``): ``{agent: {outcome: steps}}`` (total history only)."""
        out: dict[str, dict[str, int]] = {}
        for m in self.minutes if minutes is None else minutes:
            for agent, steps in m.agent_steps().items():
                mine = out.setdefault(agent, {})
                for outcome, n in steps.items():
                    mine[outcome] = mine.get(outcome, 0) + n
        return out

    def latency_quantile(
        self, q: float, minutes: Iterable[HistoryMinute] | None = None
    ) -> float | None:
        """The ``q`` quantile (0..1) of accept → delivered seconds over the window (or over
        ``minutes``), as the upper bound of the bucket it falls in (``inf`` past the
        last bound), the way Prometheus' ``histogram_quantile`` reads buckets without
        interpolating; None when nothing was delivered."""
        sums = self.latency_counts(minutes)
        count = sum(sums)
        if not count:
            return None
        rank = q * count
        seen = 0
        for bound, n in zip(LATENCY_BUCKETS, sums, strict=True):
            seen += n
            if seen >= rank and n:
                return bound
        return LATENCY_BUCKETS[-1]  # pragma: no cover


def summary(history: History) -> dict[str, Any]:
    """A window's totals as the command line and the dashboard report them: ``accepted``,
    ``delivered`` (deliverer, verifier and ledger), ``failedAttempts`` (attempts known not
    to have delivered), ``unknownOutcomes`` (ambiguous attempts and inconclusive
    verifications), ``cutTurns`` (turns a Stop cut, counted in neither of those),
    ``cancelled`` (queued prompts cancelled, and cut ones that proved never delivered),
    ``movedToError``, ``parked``, and ``latencySeconds``: ``p50``,
    ``p95``, ``p99`` of accept → delivered as bucket upper bounds (seconds; ``"+Inf"``
    past the last bound, the way Prometheus names it; None when nothing was delivered)."""

    def bound(q: float) -> float | str | None:
        value = history.latency_quantile(q)
        return "+Inf" if value is not None and math.isinf(value) else value

    return {
        "minutes": len(history.minutes),
        "accepted": history.total("a"),
        "delivered": sum(m.delivered for m in history.minutes),
        "failedAttempts": sum(m.failed for m in history.minutes),
        "unknownOutcomes": sum(m.unknown for m in history.minutes),
        "cutTurns": sum(m.cut for m in history.minutes),
        "cancelled": sum(m.cancelled for m in history.minutes),
        "movedToError": history.total("e"),
        "parked": history.total("p"),
        "latencySeconds": {"p50": bound(0.5), "p95": bound(0.95), "p99": bound(0.99)},
    }


def _fields(raw: Any) -> dict[str, int]:
    items: Iterable[tuple[Any, Any]]
    if isinstance(raw, dict):
        items = raw.items()
    else:  # a flat [field, value, ...] reply
        items = zip(raw[::2], raw[1::2], strict=True)
    out: dict[str, int] = {}
    for k, v in items:
        try:
            out[as_text(k)] = int(v)
        except (TypeError, ValueError):
            continue
    return out


class HistoryReads(Transport):
    """Reading and writing the per-minute history (mixed into the core ``Outbox``)."""

    _history_ttl_ms: int  # set by OutboxBase from HISTORY_WINDOW

    def history(self, minutes: int = 60, workspace_id: str | None = None) -> History:
        """The last ``minutes`` whole-or-current minutes of history (1 .. 31 days' worth),
        of one workspace or in total, read in two round trips (Valkey's TIME, then every
        minute's HASH). Raises ``ValueError`` for a bad ``minutes``,
        :class:`~django_outbox.core.errors.InvalidIdentifier` for a bad workspace ID and
        :class:`~django_outbox.core.errors.OutboxUnavailable`."""
        if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 44_640:
            raise ValueError("minutes must be an integer from 1 to 44640 (31 days)")
        if workspace_id is not None:
            self.keys.history(0, workspace_id)  # checks the ID before anything is read
        now = self._history_now(self._run(iter_once(Cmd(("TIME",)))))
        last = int(now) // 60
        names = list(range(last - minutes + 1, last + 1))
        answers = self.execute_many(("HGETALL", self.keys.history(m, workspace_id)) for m in names)
        rows = []
        for m, raw in zip(names, answers, strict=True):
            if isinstance(raw, Exception):
                raise raw
            rows.append(HistoryMinute(m, _fields(raw)))
        return History(rows, workspace_id, now)

    def _history_now(self, time_reply: Any) -> float:
        """Epoch seconds: the injected clock (tests), else Valkey's ``TIME`` reply."""
        if self.clock is not None:
            return float(self.clock())
        seconds, micros = time_reply
        return int(seconds) + int(micros) / 1_000_000

    async def aflush_own_history(self, counter: HistoryCounter) -> None:
        """Write what this process counted itself (``adeliver_once``, no worker's history
        duty to write it); a failed write keeps the counts for the next one, and is logged,
        never raised."""
        try:
            await self.aflush_history(counter)
        except OutboxUnavailable:
            logger.info("the history write after adeliver_once failed; kept for the next one")

    async def aflush_history(self, counter: HistoryCounter) -> int:
        """Write what ``counter`` holds in one pipeline, after a ``TIME`` that updates
        its clock offset (a cluster pipeline cannot carry a keyless command). Returns
        the commands sent; on failure the counts are given back and the error raised
        (:class:`~django_outbox.core.errors.OutboxUnavailable` when Valkey is away)."""
        counts = counter.take()
        try:
            sent_at = counter._clock()
            now = self._history_now(await self._arun(iter_once(Cmd(("TIME",)))))
            counter.offset_us = int(now * 1_000_000) - sent_at
            calls: list[Any] = counter.flush_calls(counts)
            answers = await self._arun(iter_once(Pipe(calls))) if calls else []
        except BaseException:
            counter.give_back(counts)
            raise
        for answer in answers:
            if isinstance(answer, Exception):
                logger.warning("outbox: writing history: %s", answer)
                break
        return len(calls) + 1

    async def asample_history(self, worker_id: str) -> bool:
        """Sample this minute's depth into the total history unless another worker did
        already (the claim is ``histsample:<minute>``); on a cluster also add every
        workspace's accepts and parks of the minute before into the total. Returns
        whether this worker sampled. Runs the sync reads in a thread."""
        ttl_ms = self._history_ttl_ms
        if not ttl_ms:
            return False
        now = self._history_now(await self._arun(iter_once(Cmd(("TIME",)))))
        minute = int(now) // 60
        claim = ("SET", self.keys.history_sample(minute), worker_id, "NX", "PX", 120_000)
        if not await self._arun(iter_once(Cmd(claim))):
            return False
        key = self.keys.history(minute)
        # The changes counted so far this minute, read before any walk: one counted while
        # the walk runs differs from the mark, so the next sample walks again.
        (fields,) = await self._arun(iter_once(Pipe([Cmd(("HGETALL", key))])))
        current = None if isinstance(fields, Exception) else _fields(fields)
        changes = -1 if current is None else _changes(current)
        recent = await self._arecent_depth(minute, current)
        counts, walked, overdue, workers = await asyncio.to_thread(self._depth_sample, recent)
        mapping: dict[str, int] = {f"n:{status}": n for status, n in counts.items()}
        mapping["workers"] = len(workers)
        mapping["oldest"] = max(0, int(now - overdue.due_at)) if overdue is not None else 0
        calls = [Cmd(("HSET", key, *[x for kv in sorted(mapping.items()) for x in kv]))]
        calls.append(Cmd(("PEXPIRE", key, ttl_ms)))
        if walked:  # remember when, and how many changes had been counted before it
            mark = f"{minute} {changes}"
            calls.append(Cmd(("SET", self.keys.history_depth(), mark, "PX", ttl_ms)))
        if self.cluster:
            calls += await asyncio.to_thread(self._rollup_calls, minute - 1)
        await self._arun(iter_once(Pipe(calls)))
        return True

    async def _arecent_depth(
        self, minute: int, current: dict[str, int] | None
    ) -> dict[str, int] | None:
        """The entries by status of the last walk of every session (``{status: n}``) if
        they still hold at ``minute``, else None (walk again): None when there was no
        walk in the window, the last one is ``DEPTH_REFRESH_MINUTES`` old, some change
        was counted in the total history since (:data:`CHANGES`, ``o:*``; ``current``
        is ``minute``'s fields as just read, None if that read failed, and one HGETALL
        per earlier minute since, in one round trip), or a live worker has a delivery in flight
        (:meth:`_depth_sample` looks: a claim is not counted until it settles). An idle
        worker over many sessions then reads a few keys a minute instead of every
        session's statuses."""
        mark = await self._arun(iter_once(Cmd(("GET", self.keys.history_depth()))))
        try:
            walked, seen = (int(x) for x in as_text(mark).split())
        except (AttributeError, ValueError):
            return None
        if current is None or not walked <= minute < walked + DEPTH_REFRESH_MINUTES:
            return None
        calls = [Cmd(("HGETALL", self.keys.history(m))) for m in range(walked, minute)]
        answers = await self._arun(iter_once(Pipe(calls))) if calls else []
        if any(isinstance(a, Exception) for a in answers):
            return None
        fields = [*(_fields(a) for a in answers), current]
        if "workers" not in fields[0] or sum(_changes(f) for f in fields) != seen:
            return None
        return {k[2:]: v for k, v in fields[0].items() if k.startswith("n:")}

    def _depth_sample(
        self, recent: dict[str, int] | None
    ) -> tuple[dict[str, int], bool, Any, list[Any]]:
        """(entries by status, whether every session was walked for them, the most
        overdue session, the live workers): ``recent`` (the last walk's counts, see
        :meth:`_arecent_depth`) is used unless it is None or a worker has a delivery in
        flight."""
        reads: Any = self
        workers = reads.live_workers()
        if recent is None or any(w.in_flight for w in workers):
            return reads.entry_counts(), True, reads.most_overdue(), workers
        return recent, False, reads.most_overdue(), workers

    def _rollup_calls(self, minute: int) -> list[Cmd]:
        """Cluster only: the total's script-counted fields of ``minute`` (:data:`ROLLED_UP`),
        summed over the workspaces' HASHes (at most ``ROLLUP_MAX_WORKSPACES``)."""
        reads: Any = self
        names = reads.workspaces()[:ROLLUP_MAX_WORKSPACES]
        answers = self.execute_many(
            ("HMGET", self.keys.history(minute, ws), *ROLLED_UP) for ws in names
        )
        sums = dict.fromkeys(ROLLED_UP, 0)
        for answer in answers:
            if isinstance(answer, Exception):
                continue
            for name, value in zip(ROLLED_UP, answer, strict=True):
                sums[name] += int(value or 0)
        # Added, not written over: a cleanup counts its 'x' straight into the total (its
        # workspace's HASH is gone). One sampler a minute (histsample), so added once.
        key = self.keys.history(minute)
        counted = [Cmd(("HINCRBY", key, name, n)) for name, n in sums.items() if n]
        if not counted:
            return []
        return [*counted, Cmd(("PEXPIRE", key, self._history_ttl_ms))]


def _changes(fields: dict[str, int]) -> int:
    """How many status changes a minute's fields count (:data:`CHANGES` and ``o:*``)."""
    return sum(v for k, v in fields.items() if k in CHANGES or k.startswith("o:"))
