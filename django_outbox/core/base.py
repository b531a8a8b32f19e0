"""What every outbox operation stands on: configuration, script arguments, durability,
events and session snapshots.

:class:`OutboxBase` extends the :class:`~django_outbox.core.transport.Transport`
with what is shared by the operations (:mod:`~django_outbox.core.service`), the
delivery step (:mod:`~django_outbox.core.step`) and the worker loop
(:mod:`~django_outbox.core.worker`): the KEYS/ARGV prefix of the per-session
scripts (the layout of ``lua/lib/layout.lua``), ``WAIT_REPLICAS``/``WAIT_AOF``
waits, building events only when someone listens, atomic snapshots of a session,
the list of workspaces, and the duties registered for its workers
(docs/explanation/storage.md). How a worker finds due sessions is
:mod:`~django_outbox.core.finding`.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable
from typing import Any

from .agents import Agent, AgentRouting
from .config import Config
from .duties import Duty
from .entry import Entry, Lease, OutboxEvent, Snapshot, Status, format_time
from .errors import OutboxUnavailable
from .history import HistoryCounter
from .keys import KeySpace, SessionKeys
from .paging import valid_identifiers
from .plans import Cmd, Eval, Pipe, Plan, iter_once
from .replies import SnapshotReply
from .scripts import session_prefix
from .transport import Transport, as_text

#: Sessions whose key names are kept ready (KeySpace.session, script KEYS lists).
KEY_CACHE_SIZE = 4096


class OutboxBase(AgentRouting, Transport):
    """The shared floor of :class:`~django_outbox.core.service.Outbox`.

    ``OutboxBase(url="redis://127.0.0.1:6379/0", deliverer=..., verifier=...,
    ledger_probe=..., aborter=..., **tunables)`` where tunables are the snake_case names of
    :class:`~django_outbox.core.config.Config` (durations in seconds), or
    ``config=Config(...)``. ``clock`` is None (the default: every time decision is
    taken on Valkey's clock) or returns seconds since the epoch (tests).
    ``cluster=True`` uses Valkey Cluster clients. Raises
    :class:`~django_outbox.core.config.ConfigError` for invalid tunables and
    ``TypeError`` if both ``config`` and tunables are given.

    ``agents`` (``{name: Agent}``) and ``router`` (``(workspace_id, session_id) ->
    name``) deliver different sessions to different backends; ``aborter`` is the
    default agent's (:class:`~django_outbox.core.agents.AgentRouting`,
    docs/howto/agents.md). ``ValueError`` when ``agents`` is not a mapping of names
    to :class:`~django_outbox.core.agents.Agent` or ``router`` is not callable.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        deliverer: Callable[..., Any] | None = None,
        verifier: Callable[..., Any] | None = None,
        ledger_probe: Callable[..., Any] | None = None,
        cluster: bool = False,
        clock: Callable[[], float] | None = None,
        client_options: dict[str, Any] | None = None,
        config: Config | None = None,
        agents: dict[str, Agent] | None = None,
        router: Callable[[str, str], Any] | None = None,
        aborter: Callable[..., Any] | None = None,
        **tunables: Any,
    ) -> None:
        if config is not None and tunables:
            raise TypeError("pass either config or tunables, not both")
        self.config = config or Config.from_mapping(tunables)
        super().__init__(
            url or "redis://127.0.0.1:6379/0",
            cluster=cluster,
            keys=KeySpace(self.config.key_prefix, self.config.cluster_shards if cluster else 0),
            clock=clock,
            client_options=client_options,
        )
        self.deliverer = deliverer
        self.verifier = verifier
        self.ledger_probe = ledger_probe
        self.aborter = aborter
        agents = dict(agents or {})
        for name, agent in agents.items():
            if not isinstance(agent, Agent) or agent.name != name:
                raise ValueError(f"agents[{name!r}] must be an Agent named {name!r}")
        if router is not None and not callable(router):
            raise ValueError("router must be a callable (workspace_id, session_id) -> name")
        self.agents = agents
        self.router = router
        self._lock_ttl_ms = int(self.config.lock_ttl * 1000)
        self._dedupe_ttl_ms = int(self.config.dedupe_ttl * 1000)
        # The per-minute history outlives the window by two minutes (the last one
        # shown is whole); 0: history off (docs/howto/observe.md).
        window = self.config.history_window
        self._history_ttl_ms = int((window + 120) * 1000) if window else 0
        #: This process's settles, counted until a worker writes them (core/history.py).
        self.history_counter = HistoryCounter(
            self.keys,
            self._history_ttl_ms,
            clock=None if clock is None else (lambda: int(clock() * 1_000_000)),
        )
        self._global_keys = [] if cluster else self.keys.global_keys()
        #: Duties every worker of this outbox runs beside its own (heartbeat, history...;
        #: :mod:`~django_outbox.core.duties`): the Django layer adds the receipts pruner.
        self.duties: list[Duty] = []
        #: SessionKeys -> the KEYS list of its scripts (shared, never mutated).
        self._script_keys: dict[SessionKeys, list[str]] = {}

    # -- script arguments ------------------------------------------------------------------

    def _session_args(
        self, keys: SessionKeys, workspace_id: str, session_id: str, now_us: int | None = None
    ) -> tuple[list[str], list[Any]]:
        """(KEYS, ARGV prefix) of a per-session script (``lua/lib/layout.lua``)."""
        script_keys = self._script_keys.get(keys)
        if script_keys is None:
            if len(self._script_keys) >= KEY_CACHE_SIZE:
                self._script_keys.clear()
            script_keys = self._script_keys[keys] = keys.script_keys() + self._global_keys
        now_us = self._now_us() if now_us is None else now_us
        prefix = session_prefix(
            len(self._global_keys), now_us, session_id, workspace_id, self.config.ordering
        )
        return script_keys, prefix

    def _session_eval(
        self,
        name: str,
        workspace_id: str,
        session_id: str,
        extra_args: Iterable[Any] = (),
        extra_keys: Iterable[str] = (),
        now_us: int | None = None,
    ) -> Eval:
        keys = self.keys.session(workspace_id, session_id)
        script_keys, args = self._session_args(keys, workspace_id, session_id, now_us)
        return Eval(name, script_keys + list(extra_keys), args + list(extra_args))

    def run_script(
        self,
        name: str,
        workspace_id: str,
        session_id: str,
        argv: Iterable[Any] = (),
        *,
        extra_keys: Iterable[str] = (),
        now_us: int | None = None,
    ) -> Any:
        """Run one per-session script as it is: ``name`` (a file of ``core/lua``) with the
        session's KEYS and ARGV prefix (``lib/layout.lua``), then ``argv`` and
        ``extra_keys`` as the script's header states them (the builders of
        :mod:`~django_outbox.core.scripts` make them). ``now_us`` (None: the outbox's
        clock, 0 the server's) is the transition's now in microseconds. Returns the reply
        as Valkey answered it (on a cluster, with its index hint applied and taken off);
        :mod:`~django_outbox.core.replies` parses it. For tests and tools that exercise
        one transition: it bypasses every check the public methods make. Raises
        :class:`OutboxUnavailable` or the script's error."""
        call = self._session_eval(name, workspace_id, session_id, argv, extra_keys, now_us)
        return self._run(iter_once(call))

    # -- durability -------------------------------------------------------------------------

    def _durably(self, call: Eval) -> Plan[tuple[Any, OutboxUnavailable | None]]:
        """Run ``call``; with ``WAIT_REPLICAS`` / ``WAIT_AOF`` follow it with the wait,
        pipelined on the same connection (the wait counts that connection's writes).
        Returns ``(answer, None)``, or ``(answer, OutboxUnavailable)`` when the write
        was made but not acknowledged in time; raises if the call itself failed."""
        waits = self._durability_waits()
        if not waits:
            return (yield call), None
        results = yield Pipe([call, *waits])
        if isinstance(results[0], Exception):
            raise results[0]
        try:
            self._check_waits(results[1:])
        except OutboxUnavailable as exc:
            return results[0], exc
        return results[0], None

    def _durability_waits(self) -> list[Cmd]:
        timeout_ms = max(1, int(self.config.wait_timeout * 1000))
        if self.config.wait_aof:
            return [Cmd(("WAITAOF", 1, self.config.wait_replicas, timeout_ms))]
        if self.config.wait_replicas:
            return [Cmd(("WAIT", self.config.wait_replicas, timeout_ms))]
        return []

    def _check_waits(self, results: list[Any]) -> None:
        for r in results:
            if isinstance(r, Exception):
                raise OutboxUnavailable(
                    f"accepted, but the durability wait failed: {r}", accepted=True
                )
            if isinstance(r, list):  # WAITAOF: [local fsynced, replicas fsynced]
                ok = int(r[0]) >= 1 and int(r[1]) >= self.config.wait_replicas
            else:
                ok = int(r) >= self.config.wait_replicas
            if not ok:
                raise OutboxUnavailable(
                    "accepted, but not acknowledged by the required replicas/AOF within "
                    f"{self.config.wait_timeout}s (WAIT answered {r!r}); retry with the same "
                    "clientMessageID",
                    accepted=True,
                )

    # -- events -------------------------------------------------------------------------------

    def listening(self, kind: str, watched: bool) -> bool:
        """Whether events of ``kind`` (``"staged"``, ``"delivered"``, ``"updated"``) have an
        observer; ``watched`` is True when a WebSocket client watches the session. When
        this answers False the event is not built at all (the worker's hot path parses
        entries only for it). The base class listens if :meth:`emit` or :meth:`aemit`
        is overridden; the Django outbox asks its signals and the watchers."""
        cls = type(self)
        return cls.emit is not Transport.emit or cls.aemit is not Transport.aemit

    def _events(
        self,
        kind: str,
        raws: Iterable[Any],
        ws: str,
        ses: str,
        version: int,
        state: str | None = None,
        watched: bool = True,
    ) -> list[OutboxEvent]:
        if not raws or not self.listening(kind, watched):
            return []
        events = []
        for raw in raws:
            entry = Entry.from_json(raw)
            events.append(
                OutboxEvent(kind, state or str(entry.status), entry, ws, ses, version, watched)
            )
        return events

    # -- snapshots ------------------------------------------------------------------------------

    def _snapshot_plan(self, workspace_id: str, session_id: str) -> Plan[Snapshot]:
        answer = yield self._session_eval("snapshot", workspace_id, session_id)
        return self._snapshot_from(answer)

    def _snapshots_plan(
        self, pairs: Iterable[tuple[str, str]], preview_chars: int = 0
    ) -> Plan[builtins.list[Snapshot]]:
        extra = [preview_chars] if preview_chars > 0 else []
        calls = [self._session_eval("snapshot", ws, ses, extra) for ws, ses in pairs]
        if not calls:
            return []
        answers = yield Pipe(list(calls))
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return [self._snapshot_from(answer) for answer in answers]

    def _snapshot_from(self, answer: list[Any]) -> Snapshot:
        reply = SnapshotReply.parse(answer)
        queued, staged, lock, now_us = reply.queued, reply.staged, reply.lock, reply.now_us
        entries = [Entry.from_json(raw) for raw in queued]
        for raw in staged:
            entry = Entry.from_json(raw)
            if entry.delivered_at is not None:
                continue  # delivered; only its signal is still owed
            at = next(
                (
                    i
                    for i, e in enumerate(entries)
                    if (e.seq, e.accepted_at) > (entry.seq, entry.accepted_at)
                ),
                len(entries),
            )
            entries.insert(at, entry)
        lease = None
        if lock:
            token, acquired, *rest = as_text(lock).split()
            acquired_ms = int(acquired)
            held_for = max(0.0, (int(now_us) // 1000 - acquired_ms) / 1000)
            lease = Lease(
                owner=token.rsplit(".", 1)[0],
                acquired_at=format_time(acquired_ms * 1000),
                entry_id=rest[0] if rest else None,
                held_for=held_for,
            )
            entries = [
                e.evolve(blocked_by_in_flight=True, in_flight_for=held_for)
                if e.status is Status.PENDING
                else e
                for e in entries
            ]
        return Snapshot(reply.version, entries, lease, reply.endings)

    def snapshot(self, workspace_id: str, session_id: str) -> Snapshot:
        """The session's ``version``, entries (FIFO, staged ones included) and lease, read
        atomically. Raises :class:`InvalidIdentifier` or :class:`OutboxUnavailable`.
        """
        return self._run(self._snapshot_plan(workspace_id, session_id))

    async def asnapshot(self, workspace_id: str, session_id: str) -> Snapshot:
        """Async :meth:`snapshot`."""
        return await self._arun(self._snapshot_plan(workspace_id, session_id))

    def snapshots(
        self, pairs: Iterable[tuple[str, str]], *, preview_chars: int = 0
    ) -> list[Snapshot]:
        """:meth:`snapshot` of many ``(workspace_id, session_id)`` pairs in one round trip
        (each still atomic on its own), in the order given. With ``preview_chars`` > 0
        each entry's text is its first ``preview_chars`` characters, cut on the server
        (for pages that show previews: whole texts are not sent).
        """
        return self._run(self._snapshots_plan(list(pairs), preview_chars))

    async def asnapshots(
        self, pairs: Iterable[tuple[str, str]], *, preview_chars: int = 0
    ) -> list[Snapshot]:
        """Async :meth:`snapshots`."""
        return await self._arun(self._snapshots_plan(list(pairs), preview_chars))

    def _statuses_plan(
        self, pairs: Iterable[tuple[str, str]]
    ) -> Plan[builtins.list[dict[str, int]]]:
        calls = [self._session_eval("statuses", ws, ses) for ws, ses in pairs]
        if not calls:
            return []
        answers = yield Pipe(calls)
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return [{as_text(s): int(n) for s, n in zip(a[::2], a[1::2], strict=True)} for a in answers]

    def status_counts(self, pairs: Iterable[tuple[str, str]]) -> list[dict[str, int]]:
        """How many entries (queued and staged) of each ``(workspace_id, session_id)`` pair
        hold each stored status, ``{"pending": 2, ...}``, in the order given; one round
        trip, and no entry's content is sent (the ``statuses`` script)."""
        return self._run(self._statuses_plan(list(pairs)))

    async def astatus_counts(self, pairs: Iterable[tuple[str, str]]) -> list[dict[str, int]]:
        """Async :meth:`status_counts`."""
        return await self._arun(self._statuses_plan(list(pairs)))

    def list(self, workspace_id: str, session_id: str) -> list[Entry]:
        """The session's entries in FIFO order, staged (delivering) ones included.

        Pending entries waiting behind a held lease carry ``blocked_by_in_flight``
        and ``in_flight_for`` (seconds the lease has been held). Raises
        :class:`InvalidIdentifier` or :class:`OutboxUnavailable`.
        """
        return self.snapshot(workspace_id, session_id).entries

    async def alist(self, workspace_id: str, session_id: str) -> builtins.list[Entry]:
        """Async :meth:`list`."""
        return (await self.asnapshot(workspace_id, session_id)).entries

    # -- workspaces ---------------------------------------------------------------------------

    def _workspaces_plan(self) -> Plan[builtins.list[str]]:
        """Every workspace with sessions, sorted (one SMEMBERS per shard on a cluster)."""
        answers = yield Pipe([Cmd(("SMEMBERS", k)) for k in self.keys.index_keys("workspaces")])
        members: set[str] = set()
        for key, answer in zip(self.keys.index_keys("workspaces"), answers, strict=True):
            if isinstance(answer, Exception):
                raise answer
            members.update(valid_identifiers(answer, key))  # a corrupt member is skipped
        return sorted(members)

    def workspaces(self) -> builtins.list[str]:
        """Every workspace that has sessions, sorted (one ``SMEMBERS`` per shard).

        Raises :class:`OutboxUnavailable`.
        """
        return self._run(self._workspaces_plan())

    async def aworkspaces(self) -> builtins.list[str]:
        """Async :meth:`workspaces`."""
        return await self._arun(self._workspaces_plan())
