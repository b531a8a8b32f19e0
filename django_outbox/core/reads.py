"""Read-only queries for operators: index pages, search, workspace summaries, entry
counts and the server's settings (docs/reference/admin.md, docs/reference/checks.md).

:class:`QueueReads` is a floor of :class:`~django_outbox.core.service.Outbox`: the
admin, the system checks, ``manage.py outbox_worker`` and the metrics ask these
methods rather than sending commands themselves. They never write queue state:
plain commands go through ``execute_many`` (routed by key on a cluster) and
session reads through ``snapshots`` (the ``snapshot`` script).

The global indices (``KeySpace.index_keys``) have one key on a standalone server and
one copy per shard on Valkey Cluster. A page of an index continues from the position
of a session a page showed (an :class:`~django_outbox.core.paging.IndexPosition`),
never from an offset: every copy is read from that position and the copies are
merged by score (``core.paging``), so a page lists what one ZSET holding them all
would list, in ``O(per_page)`` rows and commands per copy however big the index.

A page also shows the workers. Their heartbeats are written and read in
:mod:`~django_outbox.core.heartbeats`; :class:`QueueReads` inherits its
:class:`~django_outbox.core.heartbeats.Heartbeats` beside ``OutboxBase``, so the
``Outbox`` has ``workers``, ``live_workers``, ``abeat`` and ``aforget_worker`` as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis
from redis.exceptions import RedisClusterException

from .base import OutboxBase
from .errors import OutboxUnavailable
from .heartbeats import Heartbeats, WorkerHeartbeat, workers_plan
from .paging import (
    CopyPage,
    IndexPosition,
    ReadPlan,
    Row,
    copy_page_plan,
    first_page_plan,
    in_index_order,
    is_valid_row,
    member_text,
    merge_copies,
    note_corrupt,
    page_of_given,
    page_of_sorted,
    read_side_by_side,
    score_pairs,
    side_by_side,
    valid_identifiers,
)
from .plans import Eval, Pipe, iter_once
from .redaction import redact
from .rules import check_identifier
from .scripts import due_argv
from .server import ServerCapabilities, aread_node, read_node

#: An entry-ID search inside a workspace reads at most this many of its sessions.
SEARCH_MAX_SESSIONS = 1000
#: Sessions whose entries :meth:`QueueReads.entry_counts` reads at most.
COUNT_MAX_SESSIONS = 50_000
#: A page of sessions holds each entry's text cut to this many characters on the server
#: (the admin shows 120 and an ellipsis beyond): a page never moves whole texts.
PAGE_PREVIEW_CHARS = 200
#: Seconds the server-settings probe of the system checks waits for Valkey.
PROBE_TIMEOUT = 1.0

#: The pageable indices and their order: attention oldest first, all sessions newest first.
PAGED_INDEXES = {"attention": False, "allsessions": True}
#: The global counts: (command, index) read from every copy.
COUNTED_INDEXES = (("SCARD", "workspaces"), ("ZCARD", "allsessions"), ("ZCARD", "attention"))

_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, RedisClusterException)


# =====================================================================================
# value types
# =====================================================================================


@dataclass(frozen=True, slots=True)
class IndexTotals:
    """The global counts: workspaces with sessions, sessions, sessions needing attention."""

    workspaces: int
    sessions: int
    attention: int


@dataclass(frozen=True, slots=True)
class IndexedSession:
    """A session of a page: its IDs, its index score (ms; None when it was not read from
    an index), its ``Snapshot`` (entries as ``Outbox.list`` gives them, and lease) and
    its tie offset in its copy of the index (see :class:`IndexPosition`; 0 unknown)."""

    workspace_id: str
    session_id: str
    score_ms: float | None
    snapshot: Any
    tie: int = 0

    @property
    def position(self) -> IndexPosition:
        """Where this session stands: a page continues after (or before) it."""
        return IndexPosition(self.score_ms, self.workspace_id, self.session_id, self.tie)


@dataclass(frozen=True, slots=True)
class SessionPage:
    """What :meth:`QueueReads.session_page` read: ``total`` sessions in the page's source
    (the index, or the sessions it was asked about), the page's ``sessions`` in order, the
    global ``totals`` and the ``workers`` (live first, then most recently seen).

    ``offset``: sessions of the source before the page when it was read;
    ``has_previous`` and ``has_next``: whether any come before or after it (paging
    from ``sessions[0].position`` back, or ``sessions[-1].position`` on).
    """

    total: int
    sessions: list[IndexedSession]
    totals: IndexTotals
    workers: list[WorkerHeartbeat]
    offset: int = 0
    has_previous: bool = False
    has_next: bool = False


@dataclass(frozen=True, slots=True)
class _Located:
    """A page found in its source: rows in index order, the source's size when known
    (None: the index's, from the totals), ``passed`` rows at or before the position
    and whether more follow the page, both in the reading direction."""

    rows: list[Row]
    total: int | None
    passed: int
    more: bool
    ties: dict[str, int]


@dataclass(frozen=True, slots=True)
class SessionSearch:
    """What a search names (see :meth:`QueueReads.search`).

    ``sessions``: the candidate ``(workspace, session)`` pairs, or None when the query
    named no workspace and no session (then ``entry_id`` is to be looked for in a page
    of an index). ``workspace_id``: the workspace the query named. ``entry_id``: the
    entry it named. ``exact``: ``sessions`` are the named session or the sessions
    holding the entry, to be shown whatever an index holds. ``workspace_sessions``: how
    many sessions the workspace had when the entry was looked for in it (at most
    ``max_sessions`` of them were read).
    """

    sessions: list[tuple[str, str]] | None
    workspace_id: str | None = None
    entry_id: str | None = None
    exact: bool = False
    workspace_sessions: int = 0


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """A session as a cleanup would delete it: its ``entries`` (queued and staged) and
    whether a delivery lease is held on it."""

    session_id: str
    entries: int
    leased: bool


@dataclass(frozen=True, slots=True)
class WorkspaceSummary:
    """A workspace's sessions (sorted by ID) with their entry counts."""

    workspace_id: str
    sessions: list[SessionSummary]

    @property
    def entry_count(self) -> int:
        return sum(s.entries for s in self.sessions)

    @property
    def leased(self) -> int:
        """Sessions with a delivery in flight."""
        return sum(s.leased for s in self.sessions)


@dataclass(frozen=True, slots=True)
class OverdueSession:
    """A session due before now: ``due_at`` is the epoch seconds it became due (its
    backoff ended, or its lease expired)."""

    workspace_id: str
    session_id: str
    due_at: float


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What a Valkey server is set to keep: ``node`` (the URL, or ``host:port`` of a
    cluster primary), ``maxmemory_policy``, ``aof_enabled``, and ``appendfsync`` and
    ``save`` (None where CONFIG GET is refused, as on some managed services)."""

    node: str
    maxmemory_policy: str | None
    aof_enabled: bool
    appendfsync: str | None = None
    save: str | None = None


# =====================================================================================
# helpers
# =====================================================================================


def _node_settings(node: str, client: Any) -> ServerSettings:
    info = client.info("memory")
    info.update(client.info("persistence"))
    appendfsync = save = None
    try:
        appendfsync = client.config_get("appendfsync").get("appendfsync")
        save = client.config_get("save").get("save")
    except redis.ResponseError:
        pass  # CONFIG may be disabled on managed services
    return ServerSettings(
        node=node,
        maxmemory_policy=info.get("maxmemory_policy"),
        aof_enabled=str(info.get("aof_enabled", "0")) == "1",
        appendfsync=appendfsync,
        save=save,
    )


def _settings_of(client: Any, url: str, cluster: bool) -> list[ServerSettings]:
    if cluster:
        return [_node_settings(n.name, n.redis_connection) for n in client.get_primaries()]
    return [_node_settings(redact(url), client)]  # a node is shown: never its password


def read_server_settings(
    url: str, *, cluster: bool = False, timeout: float = PROBE_TIMEOUT
) -> list[ServerSettings]:
    """:meth:`QueueReads.server_settings` of the server at ``url`` (every primary with
    ``cluster``), through a client of its own that waits at most ``timeout`` seconds
    and is closed afterwards (for the system checks, which build no ``Outbox``).

    Raises :class:`OutboxUnavailable` (its message is the client's) when it cannot be read.
    """
    return _probe(url, cluster, timeout, _settings_of)


T = TypeVar("T")


def _probe(url: str, cluster: bool, timeout: float, read: Callable[[Any, str, bool], T]) -> T:
    """``read(client, url, cluster)`` through a client of its own on ``url`` that waits at
    most ``timeout`` seconds and is closed afterwards; :class:`OutboxUnavailable` (the
    client's message, redacted) when the server cannot be reached."""
    options = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    try:
        if cluster:
            from redis.cluster import RedisCluster

            client: Any = RedisCluster.from_url(url, **options)
        else:
            client = redis.Redis.from_url(url, **options)
        try:
            return read(client, url, cluster)
        finally:
            _close(client, cluster)
    except _UNREACHABLE as exc:
        raise OutboxUnavailable(redact(str(exc))) from exc


def _capabilities_of(client: Any, url: str, cluster: bool) -> list[ServerCapabilities]:
    if cluster:
        return [read_node(n.name, n.redis_connection) for n in client.get_primaries()]
    return [read_node(redact(url), client)]


def read_capabilities(
    url: str, *, cluster: bool = False, timeout: float = PROBE_TIMEOUT
) -> list[ServerCapabilities]:
    """:meth:`QueueReads.server_capabilities` of the server at ``url`` through a client of
    its own, like :func:`read_server_settings` (for the system checks). Raises
    :class:`OutboxUnavailable` when it cannot be read."""
    return _probe(url, cluster, timeout, _capabilities_of)


def _close(client: Any, cluster: bool) -> None:
    nodes = client.get_nodes() if cluster else []
    client.close()
    for node in nodes:
        # A cluster client's close() leaves its nodes' connection pools open.
        if node.redis_connection is not None:
            node.redis_connection.connection_pool.disconnect()


def redis_py_version() -> str:
    """The installed redis-py's version string (the system checks warn about old ones)."""
    return redis.__version__


# =====================================================================================
# the mixin
# =====================================================================================


class QueueReads(OutboxBase, Heartbeats):
    """Read-only queries of the outbox; a floor of
    :class:`~django_outbox.core.service.Outbox` (see the module docstring). The worker
    heartbeats (:class:`~django_outbox.core.heartbeats.Heartbeats`, their write too)
    come into the ``Outbox`` through this class.

    Every method raises :class:`OutboxUnavailable` when Valkey cannot be reached.
    """

    # -- running read plans ---------------------------------------------------------------

    def _read(self, *plans: ReadPlan) -> list[Any]:
        """Run read plans side by side: each round trip sends what every unfinished plan
        asks for next (one ``execute_many``). A failed command raises its error."""
        return read_side_by_side(self.execute_many, *plans)

    def _ask(self, calls: list[tuple[Any, ...]]) -> list[Any]:
        """One round trip of plain commands; a failed command raises its error."""
        answers: list[Any]
        (answers,) = self._read(_asking(calls))
        return answers

    # -- index pages ----------------------------------------------------------------------

    def _totals_plan(self) -> ReadPlan:
        shards = len(self.keys.index_keys("workspaces"))
        answers = yield [
            (command, key)
            for command, index in COUNTED_INDEXES
            for key in self.keys.index_keys(index)
        ]
        counts = [
            sum(int(n) for n in answers[i : i + shards]) for i in range(0, len(answers), shards)
        ]
        return IndexTotals(*counts)

    def _index_page_plan(
        self, index: str, per_page: int, position: IndexPosition | None, forward: bool
    ) -> ReadPlan:
        descending = PAGED_INDEXES[index]
        copies = self.keys.index_keys(index)
        need = per_page + 1  # one more than shown tells whether more follow
        if position is None:
            pages: list[CopyPage] = yield from side_by_side(
                *(first_page_plan(key, need, descending) for key in copies)
            )
            rows, cut = merge_copies(pages, descending)
        else:
            seeking = descending if forward else not descending
            # The position's tie offset is its own copy's: only that copy starts there.
            own = self.keys.index(index, self.keys.shard_of(position.workspace_id))
            pages = yield from side_by_side(
                *(
                    copy_page_plan(
                        key,
                        position,
                        need,
                        per_page,
                        seeking,
                        hint=position.tie if forward and key == own else 0,
                        index_order=forward,
                    )
                    for key in copies
                )
            )
            rows, cut = merge_copies(pages, seeking)
        found = rows[:per_page]
        ties = {member: tie for page in pages for member, tie in page.ties.items()}
        passed = sum(page.passed for page in pages)
        return _Located(
            found if forward else found[::-1], None, passed, cut or len(rows) > per_page, ties
        )

    def _index_filter_plan(
        self,
        index: str,
        among: Sequence[tuple[str, str]],
        per_page: int,
        position: IndexPosition | None,
        forward: bool,
    ) -> ReadPlan:
        # One ZMSCORE per copy, asking it about the sessions of its own workspaces.
        groups: dict[str, list[tuple[str, str]]] = {}
        for ws, ses in among:
            groups.setdefault(self.keys.index(index, self.keys.shard_of(ws)), []).append((ws, ses))
        scores = yield [
            ("ZMSCORE", key, *(f"{ws} {ses}" for ws, ses in members))
            for key, members in groups.items()
        ]
        found = [
            (ws, ses, float(score))
            for members, answer in zip(groups.values(), scores, strict=True)
            for (ws, ses), score in zip(members, answer, strict=True)
            if score is not None
        ]
        descending = PAGED_INDEXES[index]
        rows = in_index_order(found, descending)
        page, passed, more = page_of_sorted(rows, position, per_page, descending, forward)
        return _Located(page, len(found), passed, more, {})

    def session_page(
        self,
        index: str,
        per_page: int,
        *,
        after: IndexPosition | None = None,
        before: IndexPosition | None = None,
        among: Sequence[tuple[str, str]] | None = None,
        indexed_only: bool = True,
    ) -> SessionPage:
        """A page of ``per_page`` sessions of ``index`` (``"attention"``: sessions needing
        attention, oldest first; ``"allsessions"``: newest first), with the global totals
        and the workers, each session read with its snapshot.

        The page is the first one, or the sessions strictly ``after`` a position (the
        last session a page showed: ``SessionPage.sessions[-1].position``), or those
        strictly ``before`` one (paging back from ``sessions[0].position``; fewer than
        ``per_page`` when the index starts sooner). Sessions leaving or entering the
        index elsewhere never move a session past a position, as an offset would.

        ``among`` pages only these ``(workspace, session)`` pairs: those the index holds,
        in its order; with ``indexed_only=False`` all of them, in the order given (a
        position not among them gives the first page).

        Costs two round trips (index page, totals and workers; the sessions' snapshots)
        and one more for the workers' heartbeat records when any worker is known; each
        copy of the index is read in O(``per_page``) commands and rows. Only a position
        among more than ``per_page`` sessions of the same score (entered in the same
        millisecond) whose place is unknown, or changed by more than a page, costs a few
        more (see ``core.paging``). Raises ``ValueError`` for another index, for both
        ``after`` and ``before``, or for a position without a score in an index.
        """
        if index not in PAGED_INDEXES:
            raise ValueError(f"not a pageable index: {index!r}")
        if after is not None and before is not None:
            raise ValueError("a page is after a position or before one, not both")
        position = after or before
        forward = before is None
        scored = among is None or indexed_only
        if position is not None and position.score_ms is None and scored:
            raise ValueError("a position in an index needs a score")
        if among is None:
            locate = self._index_page_plan(index, per_page, position, forward)
        elif indexed_only:
            locate = self._index_filter_plan(index, among, per_page, position, forward)
        else:
            if position is not None and (position.workspace_id, position.session_id) not in among:
                position, forward = None, True  # not among them: the first page
            page, passed, more = page_of_given(among, position, per_page, forward)
            locate = _answer(_Located(page, len(among), passed, more, {}))
        located, totals, workers = self._read(locate, self._totals_plan(), workers_plan(self.keys))
        total = located.total
        if total is None:
            total = totals.attention if index == "attention" else totals.sessions
        # A corrupt member (written by hand or another program) is counted where the
        # index holds it but never shown, nor read as a session.
        chosen = [row for row in located.rows if is_valid_row(row)]
        note_corrupt(index, [f"{w} {s}" for w, s, _ in located.rows if not is_valid_row((w, s, _))])
        pairs = [(ws, ses) for ws, ses, _ in chosen]
        snapshots = self.snapshots(pairs, preview_chars=PAGE_PREVIEW_CHARS) if chosen else []
        sessions = [
            IndexedSession(ws, ses, score, snapshot, located.ties.get(f"{ws} {ses}", 0))
            for (ws, ses, score), snapshot in zip(chosen, snapshots, strict=True)
        ]
        if forward:
            offset, has_previous, has_next = located.passed, located.passed > 0, located.more
        else:  # read backwards: ``passed`` lie at or after the position
            offset = max(0, total - located.passed - len(sessions))
            has_previous, has_next = located.more, located.passed > 0
        return SessionPage(total, sessions, totals, workers, offset, has_previous, has_next)

    def index_totals(self) -> IndexTotals:
        """The global counts (one round trip; on a cluster every shard's copies are summed,
        and they may lag behind the workspaces' own keys)."""
        totals: IndexTotals
        (totals,) = self._read(self._totals_plan())
        return totals

    # -- search -------------------------------------------------------------------------

    def search(self, query: str, *, max_sessions: int = SEARCH_MAX_SESSIONS) -> SessionSearch:
        """The sessions a search-box ``query`` names, never found by SCAN.

        Forms (``/`` or spaces between the parts; every part must be a valid ID):

        * ``ws/ses/entry``: that entry, in that session (no read);
        * ``ws/ses``: that session; if ``ses`` is not a session of ``ws``, ``ses`` is
          taken as an entry ID and looked for in the workspace's sessions (at most
          ``max_sessions`` of them, by session ID; cost follows the workspace, never
          the keyspace);
        * ``word``: the workspace ``word`` (its session SET) and every session named
          ``word`` (one SISMEMBER per workspace). If neither exists, ``word`` is taken
          as an entry ID: ``sessions`` is None and the caller looks for it in a page of
          an index (finding an entry ID anywhere would mean reading every session).

        Raises :class:`InvalidIdentifier` for an invalid part, ``ValueError`` for no
        part or more than three.
        """
        parts = query.replace("/", " ").split()
        for kind, part in zip(("workspace ID", "session ID", "entry ID"), parts, strict=False):
            check_identifier(kind if len(parts) > 1 else "ID", part)
        if not 1 <= len(parts) <= 3:
            raise ValueError(
                "a search names workspace, workspace/session or workspace/session/entry"
            )
        if len(parts) == 3:
            ws, ses, entry_id = parts
            return SessionSearch([(ws, ses)], ws, entry_id, exact=True)
        keys = self.keys
        if len(parts) == 2:
            ws, second = parts
            is_session, sessions = self._ask(
                [("SISMEMBER", keys.sessions(ws), second), ("SMEMBERS", keys.sessions(ws))]
            )
            if int(is_session):
                return SessionSearch([(ws, second)], ws)
            names = sorted(valid_identifiers(sessions, keys.sessions(ws)))
            pairs = [(ws, s) for s in names[:max_sessions]]
            snapshots = self.snapshots(pairs, preview_chars=1) if pairs else []  # IDs only
            holding = [
                pair
                for pair, snapshot in zip(pairs, snapshots, strict=True)
                if any(e.id == second for e in snapshot.entries)
            ]
            return SessionSearch(holding, ws, second, exact=True, workspace_sessions=len(names))
        (word,) = parts
        # The word's own session SET says exactly whether it is a workspace (a shard's
        # workspace SET may lag behind on a cluster); the workspace SETs of every
        # shard name the workspaces that may hold a session called ``word``.
        own, *workspace_sets = self._ask(
            [
                ("SMEMBERS", keys.sessions(word)),
                *(("SMEMBERS", key) for key in keys.index_keys("workspaces")),
            ]
        )
        names = sorted(
            {
                w
                for key, members in zip(keys.index_keys("workspaces"), workspace_sets, strict=True)
                for w in valid_identifiers(members, key)
            }
        )
        hits = self._ask([("SISMEMBER", keys.sessions(w), word) for w in names]) if names else []
        scope = [(w, word) for w, hit in zip(names, hits, strict=True) if int(hit)]
        if own:
            scope += sorted((word, s) for s in valid_identifiers(own, keys.sessions(word)))
        if not scope:
            return SessionSearch(None, entry_id=word)
        # A session named after its own workspace is listed once.
        return SessionSearch(list(dict.fromkeys(scope)), word if own else None)

    # -- workspaces -----------------------------------------------------------------------

    def session_counts(self, workspace_ids: Sequence[str]) -> list[int]:
        """How many sessions each workspace has, in the order given (one round trip)."""
        answers = self._ask([("SCARD", self.keys.sessions(ws)) for ws in workspace_ids])
        return [int(n) for n in answers]

    def workspace_summaries(self, workspace_ids: Sequence[str]) -> list[WorkspaceSummary]:
        """What a cleanup of each workspace would delete: its sessions, their entries and
        leases, in the order given (exact counts; two round trips: the session SETs,
        then LLEN of every queue and staging list and EXISTS of every lease)."""
        members = self._ask([("SMEMBERS", self.keys.sessions(ws)) for ws in workspace_ids])
        layout = [
            (ws, sorted(valid_identifiers(sessions, self.keys.sessions(ws))))
            for ws, sessions in zip(workspace_ids, members, strict=True)
        ]
        calls: list[tuple[Any, ...]] = []
        for ws, names in layout:
            for ses in names:
                k = self.keys.session(ws, ses)
                calls += [("LLEN", k.queue), ("LLEN", k.staging), ("EXISTS", k.lock)]
        answers = iter(self._ask(calls) if calls else [])
        summaries = []
        for ws, names in layout:
            sessions = []
            for ses in names:
                queued, staged, locked = int(next(answers)), int(next(answers)), int(next(answers))
                sessions.append(SessionSummary(ses, queued + staged, bool(locked)))
            summaries.append(WorkspaceSummary(ws, sessions))
        return summaries

    def entry_counts(self, max_sessions: int = COUNT_MAX_SESSIONS) -> dict[str, int]:
        """Entries by stored status (``{"pending": 3, ...}``, absent statuses left out),
        staged ones included, walking workspaces in order until ``max_sessions``
        sessions have been read (two round trips per workspace; statuses only, never
        an entry's content: :meth:`status_counts`)."""
        counts: dict[str, int] = {}
        seen = 0
        for ws in self.workspaces():
            (members,) = self._ask([("SMEMBERS", self.keys.sessions(ws))])
            sessions = valid_identifiers(members, self.keys.sessions(ws))
            for found in self.status_counts((ws, ses) for ses in sessions):
                for status, n in found.items():
                    counts[status] = counts.get(status, 0) + n
            seen += len(sessions)
            if seen >= max_sessions:
                break
        return counts

    def most_overdue(self, max_workspaces: int = COUNT_MAX_SESSIONS) -> OverdueSession | None:
        """The session that has waited longest past its due time on the server's clock
        (a queued entry whose backoff has passed, or a lease that expired), or None when
        nothing is overdue; looks at the first ``max_workspaces`` workspaces (sorted),
        one due-index script per workspace in one round trip. A session being delivered
        under a live lease is not overdue."""
        names = self.workspaces()[:max_workspaces]
        if not names:
            return None
        calls = [Eval("due", [self.keys.due(ws)], due_argv(0, 1, with_scores=True)) for ws in names]
        answers = self._run(iter_once(Pipe(calls)))
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        found = []
        for ws, answer in zip(names, answers, strict=True):
            pairs = score_pairs(answer)
            valid = set(valid_identifiers([member for member, _ in pairs], self.keys.due(ws)))
            found += [
                OverdueSession(ws, text, float(score) / 1000)
                for member, score in pairs
                if (text := member_text(member)) in valid
            ]
        return min(found, key=lambda o: o.due_at, default=None)

    # -- the server -----------------------------------------------------------------------

    def server_settings(self) -> list[ServerSettings]:
        """The persistence and eviction settings of the server, or of every primary of a
        cluster (INFO memory and persistence, CONFIG GET appendfsync and save)."""
        try:
            return _settings_of(self.client, self.url, self.cluster)
        except _UNREACHABLE as exc:
            raise OutboxUnavailable(redact(str(exc))) from exc

    #: What :meth:`server_capabilities` read (the version and commands of a server do not
    #: change while it runs; a restart into another version needs a worker restart too).
    _capabilities: list[ServerCapabilities] | None = None

    def server_capabilities(self) -> list[ServerCapabilities]:
        """The version and probed commands of the server, or of every primary of a
        cluster (:mod:`~django_outbox.core.server`), read on the first call only.
        Raises :class:`OutboxUnavailable` when it cannot be read."""
        if self._capabilities is None:
            try:
                self._capabilities = _capabilities_of(self.client, self.url, self.cluster)
            except _UNREACHABLE as exc:
                raise OutboxUnavailable(redact(str(exc))) from exc
        return self._capabilities

    async def aserver_capabilities(self) -> list[ServerCapabilities]:
        """:meth:`server_capabilities`, read through the asyncio client."""
        if self._capabilities is None:
            client = await self._aclient_ready()
            try:
                if self.cluster:
                    found = [
                        await aread_node(n.name, client, target_nodes=n)
                        for n in client.get_primaries()
                    ]
                else:
                    found = [await aread_node(redact(self.url), client)]
            except _UNREACHABLE as exc:
                raise OutboxUnavailable(redact(str(exc))) from exc
            self._capabilities = found
        return self._capabilities


def _asking(calls: list[tuple[Any, ...]]) -> ReadPlan:
    return (yield calls)


def _answer(value: Any) -> ReadPlan:
    """A read plan that needs no read."""
    return value
    yield  # pragma: no cover (makes this a generator)
