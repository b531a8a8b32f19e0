"""The outbox service on Valkey: accept, list, deliver, verify, recover, operate.

Every operation is written once, as a *plan*: a generator that yields the
Valkey calls (and hook calls) it needs and receives their results. A sync
driver and an async driver run the same plans, so ``accept`` and ``aaccept``
share everything but the I/O (DESIGN section 7). State transitions happen in
the Lua scripts of ``core/lua``; this module picks them, passes the clock and
the tunables, and turns their answers into entries, results and errors.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
import time
import weakref
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError, RedisClusterException
from redis.retry import Retry

from .config import Config
from .entry import (
    LEDGER_STATE_ADMITTED,
    LEDGER_STATE_FAILED,
    LEDGER_STATE_LEDGERED,
    LEDGER_STATE_PROMOTED,
    LEDGER_STATE_STALLED,
    LEDGER_STATE_TURN_ENDED,
    REASON_UNVERIFIABLE,
    DismissResult,
    Entry,
    RetryResult,
    Status,
    Verdict,
    fingerprint,
    format_time,
    fresh_entry_json,
    new_entry_id,
)
from .errors import (
    AmbiguousError,
    Duplicate,
    IdempotencyConflict,
    OutboxFull,
    OutboxUnavailable,
    PriorAttemptPendingError,
    TransientDeliveryError,
)
from .keys import KeySpace, SessionKeys
from .reads import QueueReads
from .rules import check_identifier, check_reason, check_user_id, validate_content
from .scripts import HINTED, Script, load_scripts

logger = logging.getLogger("django_outbox")

#: Sessions recovered per pipeline by recover().
RECOVER_PAGE = 500
#: Sessions whose key names are kept ready (KeySpace.session, script KEYS lists).
KEY_CACHE_SIZE = 4096
#: Per-node connection cap of the async cluster client (Valkey's default maxclients).
CLUSTER_MAX_CONNECTIONS = 10_000
#: Most items a cluster shard's wake list holds (the standalone list's cap is in _lib.lua).
MAX_WAKE_ITEMS = 10000
#: How long a settle receipt is kept so a replayed settle recognises its own write (ms).
RECEIPT_TTL_MS = 10 * 60 * 1000
MAX_ERROR_CHARS = 2000
#: Seconds a session's watcher count outlives its last change (see Outbox.awatch).
WATCH_TTL = 24 * 3600


# --- events -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutboxEvent:
    """Something happened to an entry.

    ``kind`` is ``"staged"``, ``"delivered"`` or ``"updated"`` (every state
    change, including accept and dismissal); ``state`` is the queue-UI state of
    DESIGN section 9 (``queued``, ``delivering``, ``verifying``, ``sent``,
    ``error``, ``parked``, ``pending``, ``dismissed``); ``version`` is the
    session's version counter after the change.
    """

    kind: str
    state: str
    entry: Entry
    workspace_id: str
    session_id: str
    version: int
    #: False when no WebSocket client watches the session: publishing can be skipped.
    watched: bool = True


@dataclass(frozen=True, slots=True)
class Lease:
    """Who holds a session's delivery lease: ``owner`` (a worker ID, or host-pid),
    ``acquired_at`` (RFC 3339), ``entry_id`` it was taken for, ``held_for`` (seconds).
    """

    owner: str
    acquired_at: str
    entry_id: str | None
    held_for: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A session's queue at one instant: its ``version``, ``entries`` in FIFO order and
    the ``lease`` if one is held.
    """

    version: int
    entries: list[Entry]
    lease: Lease | None = None


# --- plan effects -----------------------------------------------------------------


@dataclass(slots=True)
class _Eval:
    script: str
    keys: list[str]
    args: list[Any]


@dataclass(slots=True)
class _Cmd:
    args: tuple[Any, ...]


@dataclass(slots=True)
class _Pipe:
    calls: list[_Eval | _Cmd]


@dataclass(slots=True)
class _Emit:
    events: list[OutboxEvent]


@dataclass(slots=True)
class _Call:
    """Call user code (a ledger probe) from a plan."""

    fn: Callable[..., Any]
    kwargs: dict[str, Any]


Plan = Generator[Any, Any, Any]

#: Errors that mean "Valkey cannot be reached right now": a cut connection, a
#: timeout, or a cluster between topologies (a failover, slots not yet covered).
_UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    RedisClusterException,
)

_UNAVAILABLE_REPLIES = (
    "OOM",
    "READONLY",
    "MASTERDOWN",
    "LOADING",
    "BUSY",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
)


def _unavailable(exc: Exception) -> OutboxUnavailable:
    return OutboxUnavailable(f"Valkey unavailable: {type(exc).__name__}: {exc}")


def _classified(result: Any) -> Any:
    """A pipeline's per-command result, with "Valkey unavailable" errors (a cut
    connection, a cluster between topologies, OOM, READONLY, ...) turned into
    :class:`OutboxUnavailable` like the drivers do for single calls."""
    if isinstance(result, (*_UNREACHABLE, redis.exceptions.AskError)) or (
        isinstance(result, redis.ResponseError) and _is_unavailable_reply(result)
    ):
        return _unavailable(result)
    return result


def _is_unavailable_reply(exc: Exception) -> bool:
    if isinstance(exc, redis.OutOfMemoryError | redis.ReadOnlyError | redis.BusyLoadingError):
        return True
    text = str(exc)
    return any(text.startswith(code) for code in _UNAVAILABLE_REPLIES) or "maxmemory" in text


def _moved(result: Any) -> bool:
    return isinstance(result, redis.exceptions.AskError)  # MovedError is an AskError


def _is_hinted(call: Any, result: Any) -> bool:
    return isinstance(call, _Eval) and call.script in HINTED and not isinstance(result, Exception)


try:
    import hiredis
except ImportError:  # optional: pip install django-outbox[fast]
    hiredis = None


class _HiredisPacking:
    """Mixed into redis-py's async connection classes when hiredis is installed: pack
    commands in C, as redis-py's sync client already does (its async client packs in
    Python, a sixth of a worker's CPU). Same bytes on the wire; anything hiredis will
    not pack falls back to redis-py's own packer."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):
            packed = (*head.encode().split(), *args[1:])
        elif b" " in head:
            packed = (*head.split(), *args[1:])
        else:
            packed = args
        try:
            return [hiredis.pack_command(packed)]
        except (TypeError, hiredis.HiredisError):
            return super().pack_command(*args)  # type: ignore[misc]


_PACKING_CLASSES: dict[type, type] = {}


def _with_hiredis_packing(connection_class: type) -> type:
    if hiredis is None or not hasattr(hiredis, "pack_command"):
        return connection_class
    cls = _PACKING_CLASSES.get(connection_class)
    if cls is None:
        name = f"HiredisPacking{connection_class.__name__}"
        cls = _PACKING_CLASSES[connection_class] = type(
            name, (_HiredisPacking, connection_class), {}
        )
    return cls


def _text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


class _Batcher:
    """Auto-pipelining for one event loop (standalone servers).

    Script calls that concurrent tasks make within one turn of the loop go out
    together as one non-transactional pipeline (at most ``MAX``): each is still
    its own atomic script, and each caller gets its own answer or error. One
    session's calls keep their order, because its task awaits each answer before
    it makes the next call. A caller cancelled while waiting may still see its
    script run — as with any command already sent.
    """

    MAX = 128

    def __init__(self, outbox: Outbox, loop: asyncio.AbstractEventLoop) -> None:
        self.outbox = outbox
        self.loop = loop
        self.pending: list[tuple[_Eval, asyncio.Future[Any]]] = []
        self.scheduled = False
        self.sending: set[asyncio.Task[None]] = set()

    def submit(self, call: _Eval) -> asyncio.Future[Any]:
        future = self.loop.create_future()
        self.pending.append((call, future))
        if len(self.pending) >= self.MAX:
            self._flush()
        elif not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self._flush)
        return future

    def _flush(self) -> None:
        self.scheduled = False
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        task = self.loop.create_task(self._send(batch))
        self.sending.add(task)
        task.add_done_callback(self.sending.discard)

    async def _send(self, batch: list[tuple[_Eval, asyncio.Future[Any]]]) -> None:
        outbox = self.outbox
        try:
            if len(batch) == 1:
                results = [await outbox._ado(batch[0][0], batch=False)]
            else:
                results = await outbox._ado(_Pipe([call for call, _ in batch]), batch=False)
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        except BaseException as exc:  # cancelled with the loop: the callers are told
            for _, future in batch:
                if not future.done():
                    future.set_exception(OutboxUnavailable(f"cancelled: {exc!r}"))
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():  # its caller was cancelled
                continue
            result = _classified(result)
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


class _LeaseKeeper:
    """Renews every lease held on one event loop, in one script call per round.

    A lease is renewed every third of ``LOCK_TTL`` (DESIGN section 6); one
    background task serves all deliveries of the loop and ends when none is held.
    """

    def __init__(self, outbox: Outbox, loop: asyncio.AbstractEventLoop) -> None:
        self.outbox = outbox
        self.loop = loop
        self.held: dict[str, tuple[SessionKeys, str, str]] = {}
        self.lost: set[str] = set()
        self.task: asyncio.Task[None] | None = None

    def hold(self, token: str, keys: SessionKeys, workspace_id: str, session_id: str) -> None:
        self.held[token] = (keys, workspace_id, session_id)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def drop(self, token: str) -> bool:
        """Stop renewing; return True if the lease was seen lost meanwhile."""
        self.held.pop(token, None)
        if token in self.lost:
            self.lost.discard(token)
            return True
        return False

    async def _run(self) -> None:
        interval = self.outbox.config.lock_ttl / 3
        while self.held:
            await asyncio.sleep(interval)
            if not self.held:
                return
            try:
                await self.renew_now()
            except Exception:  # keep renewing: a lost round only shortens the lease
                logger.warning("outbox: lease renewal failed", exc_info=True)

    async def renew_now(self) -> None:
        batch = list(self.held.items())
        if not batch:
            return
        outbox = self.outbox
        # One script call for all leases on a standalone server; on a cluster one
        # per workspace (its keys share a slot), all in one pipeline.
        groups: dict[str, list[tuple[str, tuple[SessionKeys, str, str]]]] = {}
        for item in batch:
            groups.setdefault(item[1][1] if outbox.cluster else "", []).append(item)
        calls = []
        for items in groups.values():
            keys: list[str] = [] if outbox.cluster else [outbox.keys.workspaces_due]
            args: list[Any] = [len(keys), outbox._now_us(), "", "", "", outbox._lock_ttl_ms]
            for token, (skeys, workspace_id, session_id) in items:
                keys += [skeys.lock, skeys.due]
                args += [token, session_id, workspace_id]
            calls.append(_Eval("renew", keys, args))
        results = await outbox._arun(iter_once(_Pipe(calls)))
        for items, result in zip(groups.values(), results, strict=True):
            if isinstance(result, Exception):
                raise result
            for (token, _), ok in zip(items, result, strict=True):
                if not ok and token in self.held:
                    self.lost.add(token)
                    logger.warning("outbox: lease %s lost before the delivery ended", token)


class Outbox(QueueReads):
    """The outbox service: one per process, safe for concurrent use.

    ``Outbox(url="redis://127.0.0.1:6379/0", deliverer=..., verifier=..., ledger_probe=...,
    **tunables)`` where tunables are the snake_case names of
    :class:`~django_outbox.core.config.Config` (durations in seconds). ``clock``
    returns seconds since the epoch (injectable for tests). ``cluster=True`` uses
    Valkey Cluster clients. Sync methods use one thread-safe client; async
    methods (``a``-prefixed) use one client per running event loop.

    Subclasses may override :meth:`emit` / :meth:`aemit` to observe
    :class:`OutboxEvent`s (the Django layer turns them into signals).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        deliverer: Callable[..., Any] | None = None,
        verifier: Callable[..., Any] | None = None,
        ledger_probe: Callable[..., Any] | None = None,
        cluster: bool = False,
        clock: Callable[[], float] = time.time,
        client_options: dict[str, Any] | None = None,
        config: Config | None = None,
        **tunables: Any,
    ) -> None:
        if config is not None and tunables:
            raise TypeError("pass either config or tunables, not both")
        self.config = config or Config.from_mapping(tunables)
        self.url = url or "redis://127.0.0.1:6379/0"
        self.deliverer = deliverer
        self.verifier = verifier
        self.ledger_probe = ledger_probe
        self.cluster = cluster
        self.clock = clock
        self.keys = KeySpace(self.config.key_prefix, self.config.cluster_shards if cluster else 0)
        self.scripts = load_scripts()
        options = {
            "socket_connect_timeout": 2.0,
            "socket_timeout": 5.0,
            "health_check_interval": 30,
            # A blocking pool: under load callers wait for a connection rather
            # than failing (a failed settle would turn a known outcome into one
            # that must be verified).
            "max_connections": 128,
            "timeout": 20.0,
        }
        options.update(client_options or {})
        self._client_options = options
        self._explicit_options = set(client_options or ())
        self._client: redis.Redis | None = None
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        self._keepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LeaseKeeper] = (
            weakref.WeakKeyDictionary()
        )
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Batcher] = (
            weakref.WeakKeyDictionary()
        )
        # The last loop's client, batcher and keeper (a worker runs one loop). These
        # hold the loop strongly only until another loop asks.
        self._last_loop: asyncio.AbstractEventLoop | None = None
        self._last_client: Any = None
        self._last_batcher: _Batcher | None = None
        self._last_keeper: _LeaseKeeper | None = None
        self._lock_ttl_ms = int(self.config.lock_ttl * 1000)
        self._dedupe_ttl_ms = int(self.config.dedupe_ttl * 1000)
        self._global_keys = [] if cluster else self.keys.global_keys()
        #: SessionKeys -> the KEYS list of its scripts (shared, never mutated).
        self._script_keys: dict[SessionKeys, list[str]] = {}
        #: Names this process in lease tokens ("<owner>.<random>"), so the admin
        #: can tell who holds a lease. The worker sets it to its worker ID.
        self.owner = f"{socket.gethostname()}-{os.getpid()}"
        #: Callables ``(step, outcome, result, seconds)`` told about every delivery
        #: step: ``step`` is "deliver" or "verify", ``outcome`` the classified
        #: ending (delivered, failed, ambiguous, ...), ``result`` what the settle
        #: script answered (removed, updated, lost, ...). A claim that recovered
        #: a dead holder's staging reports ("recover", "recovered", count, 0).
        self.step_listeners: list[Callable[[str, str, str, float], None]] = []

    # -- clients ----------------------------------------------------------------

    def _client_kwargs(self, *, asynchronous: bool = False) -> dict[str, Any]:
        # Every script is replay-safe (see the scripts' headers), so a command
        # whose reply was lost may be sent again. The async client needs the
        # async Retry class: the sync one would not await the attempt.
        retry_class = AsyncRetry if asynchronous else Retry
        return {
            **self._client_options,
            "retry": retry_class(ExponentialBackoff(cap=0.5, base=0.02), 3),
            "retry_on_error": [redis.ConnectionError, redis.TimeoutError],
        }

    @property
    def client(self) -> Any:
        """The sync redis-py client (created on first use)."""
        if self._client is None:
            if self.cluster:
                from redis.cluster import RedisCluster

                kwargs = self._client_kwargs()
                kwargs.pop("timeout", None)
                self._client = RedisCluster.from_url(self.url, **kwargs)
            else:
                pool = redis.BlockingConnectionPool.from_url(self.url, **self._client_kwargs())
                self._client = redis.Redis.from_pool(pool)
        return self._client

    def _aclient(self) -> Any:
        loop = asyncio.get_running_loop()
        if loop is self._last_loop and self._last_client is not None:
            return self._last_client  # (WeakKeyDictionary lookups are hot-path costly)
        client = self._aclients.get(loop)
        if client is None:
            if self.cluster:
                from redis.asyncio.cluster import RedisCluster

                kwargs = self._client_kwargs(asynchronous=True)
                kwargs.pop("timeout", None)
                if "max_connections" not in self._explicit_options:
                    # redis-py's async cluster client has no blocking pool: at the cap it
                    # raises MaxConnectionsError instead of waiting, which would fail
                    # settles of deliveries that happened (its default cap is 100 per node
                    # from redis-py 6). A worker holds about CONCURRENCY + CLUSTER_SHARDS + 4
                    # connections per node, so the cap is only Valkey's own maxclients.
                    kwargs["max_connections"] = CLUSTER_MAX_CONNECTIONS
                client = RedisCluster.from_url(self.url, **kwargs)
            else:
                pool = redis.asyncio.BlockingConnectionPool.from_url(
                    self.url, **self._client_kwargs(asynchronous=True)
                )
                pool.connection_class = _with_hiredis_packing(pool.connection_class)
                client = redis.asyncio.Redis.from_pool(pool)
            self._aclients[loop] = client
        self._last_loop, self._last_client = loop, client
        return client

    def _loop_local(self, last: str, table: weakref.WeakKeyDictionary, make: Callable) -> Any:
        """The running loop's object in ``table`` (made by ``make(loop)`` on first use),
        remembered in attribute ``last``: a worker runs one loop, and WeakKeyDictionary
        lookups showed in its profile."""
        loop = asyncio.get_running_loop()
        value = getattr(self, last)
        if value is not None and value.loop is loop:
            return value
        value = table.get(loop)
        if value is None:
            value = table[loop] = make(loop)
        setattr(self, last, value)
        return value

    def _abatcher(self) -> _Batcher:
        return self._loop_local("_last_batcher", self._batchers, lambda loop: _Batcher(self, loop))

    def load_scripts(self) -> None:
        """Load every script into Valkey now (otherwise each loads on first NOSCRIPT).

        Uses ``SCRIPT LOAD`` through the client's own method, which a cluster
        client sends to every primary. Raises :class:`OutboxUnavailable`.
        """
        try:
            for script in self.scripts.values():
                self.client.script_load(script.text)
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc

    async def aload_scripts(self) -> None:
        """Async :meth:`load_scripts`."""
        client = self._aclient()
        try:
            for script in self.scripts.values():
                await client.script_load(script.text)
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc

    def close(self) -> None:
        """Close the sync client's connections."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close the running loop's async client."""
        loop = asyncio.get_running_loop()
        if self._last_loop is loop:
            self._last_loop = self._last_client = None
        client = self._aclients.pop(loop, None)
        if client is not None:
            await client.aclose()

    # -- clock and arguments -------------------------------------------------------

    def _now_us(self) -> int:
        return int(self.clock() * 1_000_000)

    def _session_args(
        self, keys: SessionKeys, workspace_id: str, session_id: str, now_us: int | None = None
    ) -> tuple[list[str], list[Any]]:
        """(KEYS, ARGV prefix) of a per-session script (the layout of ``_lib.lua``)."""
        script_keys = self._script_keys.get(keys)
        if script_keys is None:
            if len(self._script_keys) >= KEY_CACHE_SIZE:
                self._script_keys.clear()
            script_keys = self._script_keys[keys] = keys.script_keys() + self._global_keys
        return (
            script_keys,
            [
                len(self._global_keys),
                self._now_us() if now_us is None else now_us,
                session_id,
                workspace_id,
                self.config.ordering,
            ],
        )

    def _session_eval(
        self,
        name: str,
        workspace_id: str,
        session_id: str,
        extra_args: Iterable[Any] = (),
        extra_keys: Iterable[str] = (),
    ) -> _Eval:
        keys = self.keys.session(workspace_id, session_id)
        script_keys, args = self._session_args(keys, workspace_id, session_id)
        return _Eval(name, script_keys + list(extra_keys), args + list(extra_args))

    # -- drivers ---------------------------------------------------------------------

    def _run(self, plan: Plan) -> Any:
        try:
            effect = next(plan)
            while True:
                try:
                    result = self._do(effect)
                except Exception as exc:
                    effect = plan.throw(exc)
                else:
                    effect = plan.send(result)
        except StopIteration as stop:
            return stop.value

    async def _arun(self, plan: Plan) -> Any:
        try:
            effect = next(plan)
            while True:
                try:
                    result = await self._ado(effect)
                except Exception as exc:
                    effect = plan.throw(exc)
                else:
                    effect = plan.send(result)
        except StopIteration as stop:
            return stop.value

    def _evalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self.scripts[name]
        try:
            result = client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(script.text)
            result = client.evalsha(script.sha, len(keys), *keys, *args)
        if self.cluster and name in HINTED:
            return self._hinted(name, args, result)
        return result

    async def _aevalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self.scripts[name]
        try:
            result = await client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            await client.script_load(script.text)
            result = await client.evalsha(script.sha, len(keys), *keys, *args)
        if self.cluster and name in HINTED:
            return await self._ahinted(name, args, result)
        return result

    # -- cluster index hints -----------------------------------------------------------
    #
    # On a cluster a per-session script answers {reply, hint}: what the global
    # indices of its workspace's shard need (see _lib.lua and index.lua). The
    # hint is applied before the reply reaches the plan. If that fails, an
    # accept raises OutboxUnavailable(accepted=True) — the client's retry with
    # the same key replays the accept, which reports the hint again; any other
    # transition logs it: the worker's index repair finds the workspace later.

    def _hint_call(self, args: list[Any], hint: list[Any]) -> _Eval | None:
        due, wake, attention, new, gone, empty, version = (int(h) for h in hint[:7])
        if due < 0 and not wake and attention < 0 and not new and not gone and not empty:
            return None
        session_id, workspace_id = _text(args[2]), _text(args[3])
        keys = self.keys.shard_keys(self.keys.shard_of(workspace_id))
        now_ms = self._now_us() // 1000
        return _Eval(
            "index",
            keys,
            ["hint", workspace_id, session_id, due, wake, attention, new, gone, empty, version,
             now_ms, MAX_WAKE_ITEMS],
        )  # fmt: skip

    def _hint_failed(self, name: str, exc: Exception) -> None:
        if name == "accept":
            raise OutboxUnavailable(
                f"accepted, but the cluster index update failed: {exc}; retry with the same "
                "clientMessageID",
                accepted=True,
            ) from exc
        logger.warning("outbox: cluster index update after %s failed: %s", name, exc)

    def _hinted(self, name: str, args: list[Any], result: Any) -> Any:
        reply, hint = result
        call = self._hint_call(args, hint)
        if call is not None:
            try:
                if _text(self._evalsha(self.client, "index", call.keys, call.args)) == "recheck":
                    self._recheck_workspace(_text(args[3]))
            except (redis.RedisError, RedisClusterException) as exc:
                self._hint_failed(name, exc)
        return reply

    async def _ahinted(self, name: str, args: list[Any], result: Any) -> Any:
        reply, hint = result
        call = self._hint_call(args, hint)
        if call is not None:
            client = self._aclient()
            try:
                if _text(await self._aevalsha(client, "index", call.keys, call.args)) == "recheck":
                    await self._arecheck_workspace(_text(args[3]))
            except (redis.RedisError, RedisClusterException) as exc:
                self._hint_failed(name, exc)
        return reply

    def _recheck_workspace(self, workspace_id: str) -> None:
        """After dropping an emptied workspace from its shard: re-add it if a session
        was accepted there meanwhile (remove, then re-check, never check-then-remove)."""
        if self.client.exists(self.keys.sessions(workspace_id)):
            self.client.sadd(self._workspaces_key(workspace_id), workspace_id)

    async def _arecheck_workspace(self, workspace_id: str) -> None:
        client = self._aclient()
        if await client.exists(self.keys.sessions(workspace_id)):
            await client.sadd(self._workspaces_key(workspace_id), workspace_id)

    def _workspaces_key(self, workspace_id: str) -> str:
        return self.keys.index("workspaces", self.keys.shard_of(workspace_id))

    def _queue(self, pipe: Any, call: _Eval | _Cmd) -> None:
        if isinstance(call, _Eval):
            script = self.scripts[call.script]
            pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        else:
            pipe.execute_command(*call.args)

    def _pipe_scripts(self, calls: list[_Eval | _Cmd]) -> list[Script]:
        """The distinct scripts the calls use."""
        return list(
            {c.script: self.scripts[c.script] for c in calls if isinstance(c, _Eval)}.values()
        )

    # One pipeline's calls, sent by ``send(calls) -> answers`` (a standalone pipeline
    # or one node's). Calls that found their script missing (a restarted server)
    # are re-sent once after loading it; the others ran and must not run twice.

    def _pipelined(self, client: Any, send: Callable, calls: list[_Eval | _Cmd]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for _ in range(2):
            for i, answer in zip(todo, send([calls[i] for i in todo]), strict=True):
                results[i] = answer
            todo = [i for i in todo if isinstance(results[i], NoScriptError)]
            if not todo:
                break
            for script in self._pipe_scripts([calls[i] for i in todo]):
                client.script_load(script.text)
        return results

    async def _apipelined(
        self, client: Any, send: Callable, calls: list[_Eval | _Cmd]
    ) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for _ in range(2):
            for i, answer in zip(todo, await send([calls[i] for i in todo]), strict=True):
                results[i] = answer
            todo = [i for i in todo if isinstance(results[i], NoScriptError)]
            if not todo:
                break
            for script in self._pipe_scripts([calls[i] for i in todo]):
                await client.script_load(script.text)
        return results

    def _pipeline_sender(self, pipeline: Callable[[], Any]) -> Callable:
        def send(calls: list[_Eval | _Cmd]) -> list[Any]:
            pipe = pipeline()
            for call in calls:
                self._queue(pipe, call)
            return pipe.execute(raise_on_error=False)

        return send

    def _apipeline_sender(self, pipeline: Callable[[], Any]) -> Callable:
        async def send(calls: list[_Eval | _Cmd]) -> list[Any]:
            pipe = pipeline()
            for call in calls:
                self._queue(pipe, call)
            return await pipe.execute(raise_on_error=False)

        return send

    # Pipelines on a cluster. redis-py's cluster pipeline refuses EVALSHA, so the
    # calls are grouped by the node that owns each one's slot and every group is
    # one pipeline on one connection to that node. WAIT / WAITAOF count the
    # acknowledgements of *that connection's* writes, so they go with the script
    # before them (a cluster client would send them to every primary). A group
    # answered MOVED/ASK (the slot map changed: a failover, a reshard) is re-run
    # once on a fresh map; scripts are replay-safe.

    def _node_groups(self, client: Any, calls: list[_Eval | _Cmd]) -> list[tuple[Any, list[int]]]:
        anchor: str | None = None
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, call in enumerate(calls):
            if isinstance(call, _Eval):
                key = anchor = call.keys[0]
            elif call.args[0] in ("WAIT", "WAITAOF"):
                key = anchor
            else:
                key = call.args[1] if len(call.args) > 1 else None
            if key is None:
                raise ValueError(f"cannot route {call.args[0]!r} in a cluster pipeline")
            node = client.get_node_from_key(key)
            groups.setdefault(node.name, (node, []))[1].append(i)
        return list(groups.values())

    def _cluster_pipe(self, client: Any, calls: list[_Eval | _Cmd]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        for attempt in range(2):
            todo = [i for i, r in enumerate(results) if r is None or _moved(r)]
            if not todo:
                break
            if attempt:
                client.nodes_manager.initialize()
            for node, indices in self._node_groups(client, [calls[i] for i in todo]):
                group = [calls[todo[j]] for j in indices]
                send = self._pipeline_sender(
                    lambda node=node: node.redis_connection.pipeline(transaction=False)
                )
                answers = self._pipelined(client, send, group)
                for j, answer in zip(indices, answers, strict=True):
                    results[todo[j]] = answer
        return [
            self._hinted(call.script, call.args, result)
            if _is_hinted(call, result)
            else _classified(result)
            for call, result in zip(calls, results, strict=True)
        ]

    async def _acluster_pipe(self, client: Any, calls: list[_Eval | _Cmd]) -> list[Any]:
        from redis.asyncio.cluster import PipelineCommand

        await client.initialize()  # no-op once the slot map is loaded
        results: list[Any] = [None] * len(calls)

        async def run(node: Any, indices: list[int]) -> None:
            async def send(group: list[_Eval | _Cmd]) -> list[Any]:
                commands = []
                for n, call in enumerate(group):
                    if isinstance(call, _Eval):
                        sha = self.scripts[call.script].sha
                        args = ("EVALSHA", sha, len(call.keys), *call.keys, *call.args)
                    else:
                        args = call.args
                    commands.append(PipelineCommand(n, *args))
                await node.execute_pipeline(commands)
                return [c.result for c in commands]

            answers = await self._apipelined(client, send, [calls[i] for i in indices])
            for i, answer in zip(indices, answers, strict=True):
                results[i] = answer

        for attempt in range(2):
            todo = [i for i, r in enumerate(results) if r is None or _moved(r)]
            if not todo:
                break
            if attempt:
                await client.nodes_manager.initialize()
            groups = self._node_groups(client, [calls[i] for i in todo])
            await asyncio.gather(
                *(run(node, [todo[j] for j in indices]) for node, indices in groups)
            )
        out = []
        for call, result in zip(calls, results, strict=True):
            if _is_hinted(call, result):
                result = await self._ahinted(call.script, call.args, result)
            out.append(_classified(result))
        return out

    def _do(self, effect: Any) -> Any:
        if isinstance(effect, _Emit):
            for event in effect.events:
                self._safe_emit(event)
            return None
        if isinstance(effect, _Call):
            result = effect.fn(**effect.kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
            return result
        client = self.client
        try:
            if isinstance(effect, _Eval):
                return self._evalsha(client, effect.script, effect.keys, effect.args)
            if isinstance(effect, _Cmd):
                return client.execute_command(*effect.args)
            if self.cluster:
                return self._cluster_pipe(client, effect.calls)
            send = self._pipeline_sender(lambda: client.pipeline(transaction=False))
            return self._pipelined(client, send, effect.calls)
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc
        except redis.ResponseError as exc:
            if _is_unavailable_reply(exc):
                raise _unavailable(exc) from exc
            raise

    async def _ado(self, effect: Any, batch: bool = True) -> Any:
        if isinstance(effect, _Emit):
            for event in effect.events:
                await self._safe_aemit(event)
            return None
        if isinstance(effect, _Call):
            if _is_async_callable(effect.fn):
                return await effect.fn(**effect.kwargs)
            result = await asyncio.to_thread(effect.fn, **effect.kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result
        if isinstance(effect, _Eval) and batch and not self.cluster:
            return await self._abatcher().submit(effect)
        client = self._aclient()
        try:
            if isinstance(effect, _Eval):
                return await self._aevalsha(client, effect.script, effect.keys, effect.args)
            if isinstance(effect, _Cmd):
                return await client.execute_command(*effect.args)
            if self.cluster:
                return await self._acluster_pipe(client, effect.calls)
            send = self._apipeline_sender(lambda: client.pipeline(transaction=False))
            return await self._apipelined(client, send, effect.calls)
        except _UNREACHABLE as exc:
            raise _unavailable(exc) from exc
        except redis.ResponseError as exc:
            if _is_unavailable_reply(exc):
                raise _unavailable(exc) from exc
            raise

    # -- events ------------------------------------------------------------------------

    def emit(self, event: OutboxEvent) -> None:
        """Observe an event (sync context). The base class does nothing."""

    async def aemit(self, event: OutboxEvent) -> None:
        """Observe an event (async context). Defaults to :meth:`emit` in a thread."""
        if type(self).emit is not Outbox.emit:
            await asyncio.to_thread(self.emit, event)

    def _safe_emit(self, event: OutboxEvent) -> None:
        try:
            self.emit(event)
        except Exception:
            logger.exception("outbox: event listener failed for %s", event.kind)

    async def _safe_aemit(self, event: OutboxEvent) -> None:
        try:
            await self.aemit(event)
        except Exception:
            logger.exception("outbox: event listener failed for %s", event.kind)

    def listening(self, kind: str, watched: bool) -> bool:
        """Whether events of ``kind`` (``"staged"``, ``"delivered"``, ``"updated"``) have an
        observer; ``watched`` is True when a WebSocket client watches the session. When
        this answers False the event is not built at all (the worker's hot path parses
        entries only for it). The base class listens if :meth:`emit` or :meth:`aemit`
        is overridden; the Django outbox asks its signals and the watchers."""
        cls = type(self)
        return cls.emit is not Outbox.emit or cls.aemit is not Outbox.aemit

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

    # ==================================================================================
    # accept
    # ==================================================================================

    def _accept_plan(
        self,
        workspace_id: str,
        session_id: str,
        user_id: Any,
        client_message_id: Any,
        text: Any,
        model: Any,
    ) -> Plan:
        keys = self.keys.session(workspace_id, session_id)
        validate_content(text, model, client_message_id, self.config.max_text_bytes)
        user_id = check_user_id(user_id)
        now_us = self._now_us()
        entry_id = new_entry_id(now_us // 1000)
        accepted_at = format_time(now_us)
        script_keys, args = self._session_args(keys, workspace_id, session_id, now_us)
        call = _Eval(
            "accept",
            [*script_keys, self.keys.dedupe(workspace_id, session_id, client_message_id)],
            [
                *args,
                fresh_entry_json(entry_id, accepted_at, client_message_id, user_id, text, model),
                entry_id,
                fingerprint(text, model),
                self.config.cap,
                self._dedupe_ttl_ms,
                client_message_id,
                "queue",
            ],
        )
        answer, unacknowledged = yield from self._durably(call)
        status = _text(answer[0])
        if status in ("ok", "own"):
            version, watched = int(answer[1]), bool(answer[2])
            entry = Entry(
                id=entry_id,
                client_message_id=client_message_id,
                user_id=user_id,
                text=text,
                model=model,
                accepted_at=accepted_at,
                seq=version if status == "ok" else int(answer[3]),
            )
            if unacknowledged is not None:
                raise unacknowledged
            if self.listening("updated", watched):
                event = OutboxEvent(
                    "updated", "queued", entry, workspace_id, session_id, version, watched
                )
                yield _Emit([event])
            return entry
        if status == "duplicate":
            raise Duplicate(_text(answer[1]))
        if status == "conflict":
            raise IdempotencyConflict(_text(answer[1]))
        if status == "full":
            raise OutboxFull(self.config.cap)
        raise AssertionError(f"unexpected accept answer {answer!r}")  # pragma: no cover

    def _durably(self, call: _Eval) -> Plan:
        """Run ``call``; with ``WAIT_REPLICAS`` / ``WAIT_AOF`` follow it with the wait,
        pipelined on the same connection (the wait counts that connection's writes).
        Returns ``(answer, None)``, or ``(answer, OutboxUnavailable)`` when the write
        was made but not acknowledged in time; raises if the call itself failed."""
        waits = self._durability_waits()
        if not waits:
            return (yield call), None
        results = yield _Pipe([call, *waits])
        if isinstance(results[0], Exception):
            raise results[0]
        try:
            self._check_waits(results[1:])
        except OutboxUnavailable as exc:
            return results[0], exc
        return results[0], None

    def _durability_waits(self) -> list[_Cmd]:
        timeout_ms = max(1, int(self.config.wait_timeout * 1000))
        if self.config.wait_aof:
            return [_Cmd(("WAITAOF", 1, self.config.wait_replicas, timeout_ms))]
        if self.config.wait_replicas:
            return [_Cmd(("WAIT", self.config.wait_replicas, timeout_ms))]
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

    def accept(
        self,
        workspace_id: str,
        session_id: str,
        *,
        user_id: str,
        client_message_id: str,
        text: str,
        model: dict[str, Any] | None = None,
    ) -> Entry:
        """Accept a prompt into the session's queue; return the stored entry (status pending).

        One atomic script checks the dedupe marker and the cap, appends the entry,
        writes the marker (value: entry ID and a digest of text and model, TTL
        ``DEDUPE_TTL`` seconds) and updates the indices: a refused or failed call
        writes nothing. Raises :class:`Duplicate` (same key, same content; carries
        ``accepted_id``), :class:`IdempotencyConflict` (same key, other content),
        :class:`OutboxFull` (``CAP`` reached), :class:`InvalidIdentifier`,
        ``ValueError`` (text, model or key breaks a rule of
        :func:`~django_outbox.core.entry.validate_content`) and
        :class:`OutboxUnavailable` (Valkey unreachable, out of memory, or a
        ``WAIT_REPLICAS``/``WAIT_AOF`` wait timed out — then ``accepted`` is True).
        """
        return self._run(
            self._accept_plan(workspace_id, session_id, user_id, client_message_id, text, model)
        )

    async def aaccept(
        self,
        workspace_id: str,
        session_id: str,
        *,
        user_id: str,
        client_message_id: str,
        text: str,
        model: dict[str, Any] | None = None,
    ) -> Entry:
        """Async :meth:`accept`. The write is one script, so a cancelled caller cannot split it."""
        return await self._arun(
            self._accept_plan(workspace_id, session_id, user_id, client_message_id, text, model)
        )

    # ==================================================================================
    # list
    # ==================================================================================

    def _snapshot_plan(self, workspace_id: str, session_id: str) -> Plan:
        answer = yield self._session_eval("snapshot", workspace_id, session_id)
        return self._snapshot_from(answer)

    def _snapshots_plan(self, pairs: Iterable[tuple[str, str]]) -> Plan:
        calls = [self._session_eval("snapshot", ws, ses) for ws, ses in pairs]
        if not calls:
            return []
        answers = yield _Pipe(list(calls))
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return [self._snapshot_from(answer) for answer in answers]

    def _snapshot_from(self, answer: list[Any]) -> Snapshot:
        version, queued, staged, lock, _pttl = answer
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
            token, acquired, *rest = _text(lock).split()
            acquired_ms = int(acquired)
            held_for = max(0.0, (self._now_us() // 1000 - acquired_ms) / 1000)
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
        return Snapshot(int(version), entries, lease)

    def snapshot(self, workspace_id: str, session_id: str) -> Snapshot:
        """The session's ``version``, entries (FIFO, staged ones included) and lease, read
        atomically. Raises :class:`InvalidIdentifier` or :class:`OutboxUnavailable`.
        """
        return self._run(self._snapshot_plan(workspace_id, session_id))

    async def asnapshot(self, workspace_id: str, session_id: str) -> Snapshot:
        """Async :meth:`snapshot`."""
        return await self._arun(self._snapshot_plan(workspace_id, session_id))

    def execute_many(self, commands: Iterable[tuple[Any, ...]]) -> list[Any]:
        """Run plain Valkey commands (tuples such as ``("ZCARD", key)``) in one round trip.

        For adapters that read the outbox's indices (the admin); answers come in
        order, a failed command's answer is its exception. Connection failures
        raise :class:`OutboxUnavailable`. Never use it to write queue state: the
        scripts own every transition.
        """
        calls = [_Cmd(tuple(c)) for c in commands]
        return self._run(iter_once(_Pipe(calls))) if calls else []

    def snapshots(self, pairs: Iterable[tuple[str, str]]) -> list[Snapshot]:
        """:meth:`snapshot` of many ``(workspace_id, session_id)`` pairs in one round trip
        (each still atomic on its own), in the order given.
        """
        return self._run(self._snapshots_plan(list(pairs)))

    async def asnapshots(self, pairs: Iterable[tuple[str, str]]) -> list[Snapshot]:
        """Async :meth:`snapshots`."""
        return await self._arun(self._snapshots_plan(list(pairs)))

    def list(self, workspace_id: str, session_id: str) -> list[Entry]:
        """The session's entries in FIFO order, staged (delivering) ones included.

        Pending entries waiting behind a held lease carry ``blocked_by_in_flight``
        and ``in_flight_for`` (seconds the lease has been held). Raises
        :class:`InvalidIdentifier` or :class:`OutboxUnavailable`.
        """
        return self.snapshot(workspace_id, session_id).entries

    async def alist(self, workspace_id: str, session_id: str) -> list[Entry]:
        """Async :meth:`list`."""
        return (await self.asnapshot(workspace_id, session_id)).entries

    # ==================================================================================
    # operator actions
    # ==================================================================================

    def _operate_plan(
        self,
        workspace_id: str,
        session_id: str,
        op: str,
        arg1: str = "",
        arg2: str = "",
        removed_state: str = "dismissed",
    ) -> Plan:
        answer = yield self._session_eval(
            "operate", workspace_id, session_id, extra_args=[op, arg1, arg2]
        )
        result, version, count = _text(answer[0]), int(answer[1]), int(answer[2])
        watched, changed = bool(answer[3]), answer[4:]
        if changed:
            state = removed_state if result == "removed" else None
            yield _Emit(
                self._events("updated", changed, workspace_id, session_id, version, state, watched)
            )
        return result, count, changed

    def _retry_plan(self, workspace_id: str, session_id: str, entry_id: str) -> Plan:
        check_identifier("entry ID", entry_id)
        has_verifier = "1" if self.verifier is not None else "0"
        result, _, _ = yield from self._operate_plan(
            workspace_id, session_id, "retry", entry_id, has_verifier
        )
        return {"updated": RetryResult.UPDATED, "busy": RetryResult.BUSY}.get(
            result, RetryResult.NOT_FOUND
        )

    def retry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """Re-arm an entry now: an error entry returns to pending (to verifying if
        it failed as ``unverifiable`` and a verifier is configured, so a message
        that may have arrived is checked before any resend); a pending or
        verifying entry loses its backoff gate. Counters of transient failures and
        verification passes restart; ``attempts`` does not, so attempt numbers
        stay unique and one retry grants one more attempt after ``MAX_ATTEMPTS``.
        Never passes through dedupe.

        Returns ``BUSY`` while the entry is being delivered or verified under a
        live lease, or is parked (only unpark moves parked entries), and
        ``NOT_FOUND`` if no such entry exists.
        """
        return self._run(self._retry_plan(workspace_id, session_id, entry_id))

    async def aretry(self, workspace_id: str, session_id: str, entry_id: str) -> RetryResult:
        """Async :meth:`retry`."""
        return await self._arun(self._retry_plan(workspace_id, session_id, entry_id))

    def _dismiss_plan(self, workspace_id: str, session_id: str, entry_id: str) -> Plan:
        check_identifier("entry ID", entry_id)
        result, _, _ = yield from self._operate_plan(workspace_id, session_id, "dismiss", entry_id)
        return {"removed": DismissResult.REMOVED, "busy": DismissResult.BUSY}.get(
            result, DismissResult.NOT_FOUND
        )

    def dismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """Remove an entry whatever its status. Its dedupe marker stays for
        ``DEDUPE_TTL`` (a resend of its key answers Duplicate). Returns ``BUSY``
        while it is being delivered or verified under a live lease, ``NOT_FOUND``
        if absent.
        """
        return self._run(self._dismiss_plan(workspace_id, session_id, entry_id))

    async def adismiss(self, workspace_id: str, session_id: str, entry_id: str) -> DismissResult:
        """Async :meth:`dismiss`."""
        return await self._arun(self._dismiss_plan(workspace_id, session_id, entry_id))

    def _sessions_plan(self, workspace_id: str) -> Plan:
        members = yield _Cmd(("SMEMBERS", self.keys.sessions(workspace_id)))
        return sorted(_text(m) for m in members)

    def _bulk_plan(self, workspace_id: str, op: str, arg1: str = "") -> Plan:
        check_identifier("workspace ID", workspace_id)
        total = 0
        for session_id in (yield from self._sessions_plan(workspace_id)):
            _, count, _ = yield from self._operate_plan(workspace_id, session_id, op, arg1)
            total += count
        return total

    def _park_plan(self, workspace_id: str, reason: str) -> Plan:
        return (yield from self._bulk_plan(workspace_id, "park", check_reason(reason)))

    def _unpark_plan(self, workspace_id: str, reason: str | None) -> Plan:
        arg = "" if reason is None else check_reason(reason)
        return (yield from self._bulk_plan(workspace_id, "unpark", arg))

    def park_workspace(self, workspace_id: str, reason: str) -> int:
        """Park every pending, verifying and delivering entry of the workspace with ``reason``
        (a machine code such as ``"mode_transition"``). Parked entries are inert
        until unparked or dismissed; one parked mid-delivery keeps its lease, and
        its outcome is recorded when the delivery ends (a confirmed delivery still
        completes it). Returns the number parked.
        """
        return self._run(self._park_plan(workspace_id, reason))

    async def apark_workspace(self, workspace_id: str, reason: str) -> int:
        """Async :meth:`park_workspace`."""
        return await self._arun(self._park_plan(workspace_id, reason))

    def unpark_workspace(self, workspace_id: str, reason: str | None = None) -> int:
        """Return parked entries (only those parked with ``reason``, if given) to the state
        they were parked from — pending, or verifying when their last attempt's
        outcome is unknown, so unparking never resends blindly. Returns the count.
        """
        return self._run(self._unpark_plan(workspace_id, reason))

    async def aunpark_workspace(self, workspace_id: str, reason: str | None = None) -> int:
        """Async :meth:`unpark_workspace`."""
        return await self._arun(self._unpark_plan(workspace_id, reason))

    def _sweep_unverifiable_plan(self, workspace_id: str) -> Plan:
        check_identifier("workspace ID", workspace_id)
        if self.verifier is None:
            return 0
        return (yield from self._bulk_plan(workspace_id, "rearm_unverifiable"))

    def sweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """Re-arm the workspace's ``unverifiable`` error entries as verifying with a fresh
        verification window (call it when an agent that was unreachable is back).
        Returns the number re-armed; 0 without a verifier. Idempotent.
        """
        return self._run(self._sweep_unverifiable_plan(workspace_id))

    async def asweep_workspace_unverifiable(self, workspace_id: str) -> int:
        """Async :meth:`sweep_workspace_unverifiable`."""
        return await self._arun(self._sweep_unverifiable_plan(workspace_id))

    def _sweep_parked_plan(self, workspace_id: str) -> Plan:
        check_identifier("workspace ID", workspace_id)
        probe = self.ledger_probe
        if probe is None:
            return 0
        recovered = 0
        for session_id in (yield from self._sessions_plan(workspace_id)):
            snap = yield from self._snapshot_plan(workspace_id, session_id)
            for entry in snap.entries:
                if entry.status is not Status.ERROR:
                    continue
                attempt = entry.attempts + (1 if entry.reason == REASON_UNVERIFIABLE else 0)
                try:
                    state = yield _Call(
                        probe,
                        {
                            "workspace_id": workspace_id,
                            "session_id": session_id,
                            "entry_id": entry.id,
                            "attempt": attempt,
                        },
                    )
                except Exception:
                    logger.warning("outbox: ledger probe failed for %s", entry.id, exc_info=True)
                    continue
                if state in (LEDGER_STATE_TURN_ENDED, LEDGER_STATE_PROMOTED):
                    op = "ledger_complete"
                elif state is None or state == LEDGER_STATE_FAILED:
                    op = "ledger_rearm"
                else:
                    if state not in (
                        LEDGER_STATE_LEDGERED,
                        LEDGER_STATE_ADMITTED,
                        LEDGER_STATE_STALLED,
                    ):
                        logger.warning("outbox: unknown ledger state %r for %s", state, entry.id)
                    continue
                # A completed entry's entry_delivered is owed and fired by the
                # next claim of its session (exactly once, even if we die now).
                result, _, _ = yield from self._operate_plan(
                    workspace_id, session_id, op, entry.id, str(entry.attempts), "sent"
                )
                if result in ("removed", "updated"):
                    recovered += 1
        return recovered

    def sweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """Ask the ledger probe about each error entry of the workspace and act on the answer
        (DESIGN section 7): ``TURN_ENDED``/``PROMOTED`` → completed (removed;
        ``entry_delivered`` fires in the worker that next claims the session);
        no row or ``FAILED`` → re-armed to pending;
        ``LEDGERED``/``ADMITTED``/``STALLED`` → left as they are; a probe that
        raises leaves the entry for the next sweep. Returns the number completed
        or re-armed; 0 without a probe. Idempotent.
        """
        return self._run(self._sweep_parked_plan(workspace_id))

    async def asweep_workspace_parked_errors(self, workspace_id: str) -> int:
        """Async :meth:`sweep_workspace_parked_errors`."""
        return await self._arun(self._sweep_parked_plan(workspace_id))

    def _cleanup_plan(self, workspace_id: str) -> Plan:
        check_identifier("workspace ID", workspace_id)
        removed = 0
        for session_id in (yield from self._sessions_plan(workspace_id)):
            keys = self.keys.session(workspace_id, session_id)
            while True:
                cmids = [_text(m) for m in (yield _Cmd(("ZRANGE", keys.markers, 0, -1)))]
                marker_keys = [self.keys.dedupe(workspace_id, session_id, c) for c in cmids]
                answer = yield self._session_eval(
                    "cleanup", workspace_id, session_id, extra_args=cmids, extra_keys=marker_keys
                )
                removed += int(answer[1])
                if _text(answer[0]) == "done":
                    break
        return removed

    def cleanup_workspace(self, workspace_id: str) -> int:
        """Delete every key of the workspace — queues, staging, leases, versions and
        dedupe markers (so its idempotency keys are free again). Walks the
        workspace's session set, never the keyspace. Returns the number of keys
        removed; idempotent. A delivery in flight meanwhile loses its lease and
        settles nothing.
        """
        return self._run(self._cleanup_plan(workspace_id))

    async def acleanup_workspace(self, workspace_id: str) -> int:
        """Async :meth:`cleanup_workspace`."""
        return await self._arun(self._cleanup_plan(workspace_id))

    # ==================================================================================
    # recovery
    # ==================================================================================

    def _workspaces_plan(self) -> Plan:
        """Every workspace with sessions, sorted (one SMEMBERS per shard on a cluster)."""
        answers = yield _Pipe([_Cmd(("SMEMBERS", k)) for k in self.keys.index_keys("workspaces")])
        members = set()
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
            members.update(_text(m) for m in answer)
        return sorted(members)

    def _recover_plan(self) -> Plan:
        recovered = 0
        now_ms = self._now_us() // 1000
        for workspace_id in (yield from self._workspaces_plan()):
            due = yield _Cmd(("ZRANGEBYSCORE", self.keys.due(workspace_id), "-inf", now_ms))
            sessions = sorted(_text(s) for s in due)
            # One pipeline per page of sessions (each script still atomic on its own):
            # a worker starting on a backlog must not spend a round trip per session.
            for start in range(0, len(sessions), RECOVER_PAGE):
                page = sessions[start : start + RECOVER_PAGE]
                answers = yield _Pipe(
                    [
                        self._session_eval(
                            "operate", workspace_id, ses, extra_args=["recover", "", ""]
                        )
                        for ses in page
                    ]
                )
                events: list[OutboxEvent] = []
                for session_id, answer in zip(page, answers, strict=True):
                    if isinstance(answer, Exception):
                        raise answer
                    version, count = int(answer[1]), int(answer[2])
                    watched, changed = bool(answer[3]), answer[4:]
                    recovered += count
                    events += self._events(
                        "updated", changed, workspace_id, session_id, version, None, watched
                    )
                if events:
                    yield _Emit(events)
        return recovered

    def workspaces(self) -> list[str]:
        """Every workspace that has sessions, sorted (one ``SMEMBERS`` per shard).

        Raises :class:`OutboxUnavailable`.
        """
        return self._run(self._workspaces_plan())

    async def aworkspaces(self) -> list[str]:
        """Async :meth:`workspaces`."""
        return await self._arun(self._workspaces_plan())

    def recover(self) -> int:
        """Return staged entries whose lease is gone (a crashed or cut-off worker) to their
        queue as ``verifying`` — the interrupted attempt's outcome is unknown.
        Looks only at sessions the due index says are due (a staged session is
        indexed at its lease's expiry), so the cost follows the work, not the
        keyspace. Live leases are never taken. Returns the number recovered.
        Workers also recover continuously: a claim on a session with a dead
        holder's staging recovers it first.
        """
        return self._run(self._recover_plan())

    async def arecover(self) -> int:
        """Async :meth:`recover`."""
        return await self._arun(self._recover_plan())

    # ==================================================================================
    # watchers
    # ==================================================================================

    async def awatch(self, workspace_id: str, session_id: str, delta: int) -> int:
        """Count a WebSocket watcher of the session in (``delta`` +1) or out (-1); return
        the count after the change.

        The scripts report the count to their callers (``watched``), which skip
        building events nobody would see. The count expires ``WATCH_TTL`` seconds
        after its last change, so one left by a server that died without
        disconnecting does not last (meanwhile events are only published
        needlessly, never skipped wrongly). Raises :class:`OutboxUnavailable`.
        """
        key = self.keys.session(workspace_id, session_id).watch
        answers = await self._arun(
            iter_once(_Pipe([_Cmd(("INCRBY", key, delta)), _Cmd(("EXPIRE", key, WATCH_TTL))]))
        )
        count = answers[0]
        if isinstance(count, Exception):
            raise count
        if int(count) <= 0:
            await self._arun(iter_once(_Cmd(("DEL", key))))
        return int(count)

    # ==================================================================================
    # testing
    # ==================================================================================

    def _seed_plan(self, workspace_id: str, session_id: str, raw_json: str | bytes) -> Plan:
        entry = Entry.from_json(raw_json)
        check_identifier("entry ID", entry.id)
        if entry.accepted_at is None:
            raise ValueError("a seeded entry needs acceptedAt")
        target = "staging" if entry.status is Status.DELIVERING else "queue"
        answer = yield self._session_eval(
            "accept",
            workspace_id,
            session_id,
            extra_args=[entry.to_json(), entry.id, "", 0, 0, "", target],
            extra_keys=[self.keys.dedupe(workspace_id, session_id, "-")],
        )
        if _text(answer[0]) == "exists":
            raise ValueError(f"entry {entry.id} is already queued in {workspace_id}/{session_id}")
        version = int(answer[1])
        yield _Emit(
            self._events(
                "updated", [entry.evolve(seq=version).to_json()], workspace_id, session_id, version
            )
        )

    def seed_entry_for_test(
        self, workspace_id: str, session_id: str, raw_json: str | bytes
    ) -> None:
        """Push a raw JSON entry as-is (test harnesses only): no cap, no dedupe.

        An entry with status ``delivering`` goes to staging, as if a worker had
        died delivering it. Raises ``ValueError`` if the JSON is not an entry.
        """
        self._run(self._seed_plan(workspace_id, session_id, raw_json))

    async def aseed_entry_for_test(
        self, workspace_id: str, session_id: str, raw_json: str | bytes
    ) -> None:
        """Async :meth:`seed_entry_for_test`."""
        await self._arun(self._seed_plan(workspace_id, session_id, raw_json))

    # ==================================================================================
    # delivery
    # ==================================================================================

    def _keeper(self) -> _LeaseKeeper:
        return self._loop_local(
            "_last_keeper", self._keepers, lambda loop: _LeaseKeeper(self, loop)
        )

    def _settle_args(self, token: str, entry_id: str, outcome: str, error: str) -> list[Any]:
        c = self.config
        us = 1_000_000
        return [
            token,
            entry_id,
            outcome,
            error[:MAX_ERROR_CHARS],
            c.max_attempts,
            int(c.retry_backoff * us),
            int(c.max_backoff * us),
            c.max_transient_failures,
            int(c.verify_delay * us),
            int(c.verify_backoff * us),
            int(c.max_verify_backoff * us),
            c.max_verify_attempts,
            RECEIPT_TTL_MS,
        ]

    async def _invoke(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if _is_async_callable(fn):
            return await fn(*args, **kwargs)
        result = await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _deliver(
        self, deliverer: Callable[..., Any], entry: Entry, ws: str, ses: str
    ) -> tuple[str, str]:
        """Call the deliverer; classify its ending as (outcome, error text)."""
        try:
            if _is_async_callable(deliverer):
                async with asyncio.timeout(self.config.delivery_timeout):
                    await deliverer(
                        entry, workspace_id=ws, session_id=ses, attempt=entry.attempts + 1
                    )
            else:
                await self._invoke_sync_deliverer(deliverer, entry, ws, ses)
        except AmbiguousError as exc:
            outcome = "ambiguous" if self.verifier is not None else "unverifiable"
            return outcome, f"ambiguous: {exc}"
        except TimeoutError as exc:
            outcome = "ambiguous" if self.verifier is not None else "unverifiable"
            return outcome, f"timed out after {self.config.delivery_timeout}s: {exc}".rstrip(": ")
        except TransientDeliveryError as exc:
            return "transient", f"transient: {exc}"
        except PriorAttemptPendingError as exc:
            return "prior_pending", f"prior attempt pending: {exc}"
        except Exception as exc:
            return "failed", f"{type(exc).__name__}: {exc}"
        return "delivered", ""

    async def _invoke_sync_deliverer(
        self, deliverer: Callable[..., Any], entry: Entry, ws: str, ses: str
    ) -> None:
        """Run a sync deliverer in a thread and wait for it to *finish*.

        A thread cannot be interrupted: abandoning it at ``DELIVERY_TIMEOUT``
        would release the lease while it still sends, and a verification that
        finds nothing yet would send the message again alongside it. So the
        lease is kept (renewed) until the call returns, and its real outcome is
        recorded; overstaying the timeout is logged. Sync deliverers must bound
        their own I/O (e.g. an HTTP client timeout).
        """
        call = asyncio.ensure_future(
            asyncio.to_thread(
                deliverer, entry, workspace_id=ws, session_id=ses, attempt=entry.attempts + 1
            )
        )
        done, _ = await asyncio.wait({call}, timeout=self.config.delivery_timeout)
        if not done:
            logger.warning(
                "outbox: sync deliverer for %s/%s %s exceeded DELIVERY_TIMEOUT (%ss); waiting for "
                "it to return (a thread cannot be interrupted)",
                ws,
                ses,
                entry.id,
                self.config.delivery_timeout,
            )
        result = await asyncio.shield(call)
        if inspect.isawaitable(result):
            async with asyncio.timeout(self.config.delivery_timeout):
                await result

    async def _verify(self, entry: Entry, ws: str, ses: str) -> tuple[str, str]:
        verifier = self.verifier
        if verifier is None:
            return "unverifiable", "outcome unknown and no verifier is configured"
        try:
            async with asyncio.timeout(self.config.delivery_timeout):
                verdict = await self._invoke(verifier, entry, workspace_id=ws, session_id=ses)
        except Exception as exc:
            return "inconclusive", f"verifier failed: {type(exc).__name__}: {exc}"
        if verdict is Verdict.DELIVERED:
            return "delivered", ""
        if verdict is Verdict.ABSENT:
            return "absent", "verifier: not in the agent's transcript"
        if verdict is not Verdict.INCONCLUSIVE:
            logger.warning("outbox: verifier returned %r, not a Verdict", verdict)
        return "inconclusive", "verifier: inconclusive"

    async def adeliver_once(
        self,
        workspace_id: str,
        session_id: str,
        deliverer: Callable[..., Any] | None = None,
    ) -> bool:
        """Take one step for one session: claim its lease, then deliver or verify its next entry.

        Returns True if a step was taken (an entry was delivered, verified or
        failed), False if the session was busy (another holder's lease) or had
        nothing due. The lease is renewed every ``LOCK_TTL / 3`` while the
        deliverer runs; the deliverer is bounded by ``DELIVERY_TIMEOUT`` (a
        timeout is an ambiguous outcome). The outcome is recorded by one script
        that also releases the lease; if the lease was lost meanwhile nothing is
        recorded and the entry is left to verification. Cancelling this coroutine
        mid-delivery records the attempt as ambiguous.

        ``deliverer`` overrides the configured one; raises ``ValueError`` if
        neither is set, :class:`OutboxUnavailable` if Valkey cannot be reached.
        """
        deliverer = deliverer or self.deliverer
        if deliverer is None:
            raise ValueError("no deliverer: pass one or configure DELIVERER")
        took, carry = await self._astep(workspace_id, session_id, deliverer)
        if carry is not None:
            await self._arun(self._release_plan(workspace_id, session_id, *carry))
        return took

    def _new_token(self) -> str:
        return f"{self.owner}.{secrets.token_hex(8)}"

    async def _astep(
        self,
        ws: str,
        ses: str,
        deliverer: Callable[..., Any],
        carry: tuple[str, list[str]] | None = None,
    ) -> tuple[bool, tuple[str, list[str]] | None]:
        """One step (see :meth:`adeliver_once`); returns (step taken, carry).

        ``carry`` is ``(token, entry IDs)``: a lease still held after a delivery
        whose entry_delivered already fired, and the entries to acknowledge. The
        next step's claim acknowledges them and reuses the lease, which saves a
        round trip per message in the worker loop; whoever ends the loop must
        release a carry with :meth:`_release_plan`.
        """
        keys = self.keys.session(ws, ses)
        token, ack = carry if carry is not None else (self._new_token(), [])
        answer = await self._arun(self._claim_plan(ws, ses, token, ack))
        kind, claimed, recovered = answer
        if recovered:
            self._tell_listeners("recover", "recovered", str(recovered), 0.0)
        if kind == "owed":
            await self._afire_owed(ws, ses, keys, token, claimed)
            return True, None
        if kind == "unreplicated":
            # The claim is not known to the replicas: do not call the agent. The
            # entry goes back as a failure in which nothing was attempted.
            error = (
                "transient: replicas did not acknowledge the claim within "
                f"{self.config.wait_timeout}s"
            )
            result = await self._asettle(ws, ses, token, claimed, "transient", error)
            self._tell_listeners("deliver", "transient", result, 0.0)
            return True, None
        if kind not in ("deliver", "verify"):
            return False, None
        entry: Entry = claimed
        keeper = self._keeper()
        keeper.hold(token, keys, ws, ses)
        started = time.monotonic()
        try:
            if kind == "deliver":
                outcome, error = await self._deliver(deliverer, entry, ws, ses)
            else:
                outcome, error = await self._verify(entry, ws, ses)
        except asyncio.CancelledError:
            keeper.drop(token)
            if kind == "deliver":
                await asyncio.shield(
                    self._arun(self._settle_plan(ws, ses, token, entry, "ambiguous", "cancelled"))
                )
            else:
                await asyncio.shield(self._arun(self._release_plan(ws, ses, token)))
            raise
        try:
            result = await self._asettle(ws, ses, token, entry, outcome, error)
        finally:
            if keeper.drop(token):
                logger.warning("outbox: lease lost while delivering %s/%s %s", ws, ses, entry.id)
        seconds = time.monotonic() - started
        step = "deliver" if kind == "deliver" else "verify"
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "outbox %s ws=%s ses=%s entry=%s attempt=%d outcome=%s result=%s duration=%.3fs%s",
                step,
                ws,
                ses,
                entry.id,
                entry.attempts + 1,
                outcome,
                result,
                seconds,
                f" error={error!r}" if error else "",
            )
        self._tell_listeners(step, outcome, result, seconds)
        delivered = result == "removed"
        return True, ((token, [entry.id]) if delivered else None)

    async def _asettle(
        self, ws: str, ses: str, token: str, entry: Entry, outcome: str, error: str
    ) -> str:
        """Record an outcome, retrying while Valkey is briefly unavailable.

        The outcome is known here; losing it to a hiccup would leave the entry to
        verification. The lease keeper goes on renewing meanwhile; after half a
        lease of failures the error propagates (the entry is then recovered as
        verifying once the lease expires — safe, only slower).
        """
        return await retry_unavailable(
            lambda: self._arun(self._settle_plan(ws, ses, token, entry, outcome, error)),
            patience=self.config.lock_ttl / 2,
            first_delay=0.05,
            max_delay=1.0,
            what=f"recording {outcome} for {entry.id}",
        )

    async def _afire_owed(
        self, ws: str, ses: str, keys: SessionKeys, token: str, owed: list[Entry]
    ) -> None:
        """Fire the entry_delivered a dead holder owed, then acknowledge it."""
        keeper = self._keeper()
        keeper.hold(token, keys, ws, ses)
        try:
            version = (await self.asnapshot(ws, ses)).version
            await self._arun(
                iter_once(
                    _Emit([OutboxEvent("delivered", "sent", e, ws, ses, version) for e in owed])
                )
            )
            await self._arun(self._release_plan(ws, ses, token, [e.id for e in owed]))
        finally:
            keeper.drop(token)
        logger.info("outbox: %s/%s fired %d owed entry_delivered", ws, ses, len(owed))

    def _tell_listeners(self, step: str, outcome: str, result: str, seconds: float) -> None:
        for listener in self.step_listeners:
            try:
                listener(step, outcome, result, seconds)
            except Exception:
                logger.exception("outbox: step listener failed")

    async def arun(
        self,
        deliverer: Callable[..., Any] | None = None,
        *,
        concurrency: int | None = None,
        tick: float | None = None,
        stop: asyncio.Event | None = None,
        grace: float = 30.0,
        once: bool = False,
        heartbeat: bool = True,
    ) -> Any:
        """Deliver until ``stop`` is set (or, with ``once``, until nothing is due now).

        Loads the scripts, recovers staged entries whose lease is gone, then
        delivers due sessions with at most ``concurrency`` (default
        ``CONCURRENCY``) at once, finding them through the due index every
        ``tick`` seconds (default ``TICK``) and at once through the wake list
        that accepts push to. After ``stop``, in-flight deliveries get ``grace``
        seconds to finish before they are cancelled (recorded as ambiguous).
        Every task is joined before this returns the run's
        :class:`~django_outbox.core.worker.WorkerStats`.
        """
        from .worker import Worker

        worker = Worker(
            self,
            deliverer,
            concurrency=concurrency or self.config.concurrency,
            tick=tick or self.config.tick,
            stop=stop or asyncio.Event(),
            grace=grace,
            once=once,
            heartbeat=heartbeat,
        )
        return await worker.run()

    def _claim_plan(self, ws: str, ses: str, token: str, acknowledge: Iterable[str] = ()) -> Plan:
        call = self._session_eval(
            "claim", ws, ses, extra_args=[token, self._lock_ttl_ms, *acknowledge]
        )
        # With WAIT_REPLICAS / WAIT_AOF the claim must be durable before the agent
        # is called: a claim lost in a failover would make the entry look never
        # tried, and it would be sent again without verification.
        answer, unacknowledged = yield from self._durably(call)
        kind = _text(answer[0])
        if unacknowledged is not None and kind == "deliver":  # (a verification sends nothing)
            kind = "unreplicated"
        if kind == "busy":
            return ("busy", None, 0)
        if kind == "owed":
            return ("owed", [Entry.from_json(raw) for raw in answer[4:]], 0)
        version, watched = int(answer[2]), bool(answer[3])
        recovered = answer[4:]
        events = self._events("updated", recovered, ws, ses, version, None, watched)
        entry = Entry.from_json(answer[1]) if answer[1] else None
        if kind == "unreplicated":
            return (kind, entry, len(recovered))
        if kind == "deliver" and entry is not None:
            for event_kind in ("staged", "updated"):
                if self.listening(event_kind, watched):
                    events.append(
                        OutboxEvent(event_kind, "delivering", entry, ws, ses, version, watched)
                    )
        if events:
            yield _Emit(events)
        return (kind, entry, len(recovered))

    def _settle_plan(
        self, ws: str, ses: str, token: str, entry: Entry, outcome: str, error: str
    ) -> Plan:
        # Durable before entry_delivered fires: a delivered-settle lost in a
        # failover would be verified again and fire the signal a second time.
        answer, unacknowledged = yield from self._durably(
            self._session_eval(
                "settle", ws, ses, extra_args=self._settle_args(token, entry.id, outcome, error)
            )
        )
        if unacknowledged is not None:
            logger.warning("outbox: settle of %s: %s", entry.id, unacknowledged)
        kind = _text(answer[0])
        if kind == "removed" or (kind == "replayed" and _text(answer[1]) == "removed"):
            # Delivered. The lease is still ours and the entry stays staged as
            # delivered until its receivers ran: acknowledge it afterwards, so a
            # crash in between leaves the signal owed to the next claimer.
            watched = True if kind != "removed" else bool(answer[3])
            kinds = [k for k in ("delivered", "updated") if self.listening(k, watched)]
            if kinds:
                if kind == "removed":
                    version = int(answer[2])
                    done = Entry.from_json(answer[1])
                else:  # our settle ran but its reply was lost
                    version = (yield from self._snapshot_plan(ws, ses)).version
                    done = entry
                yield _Emit(
                    [OutboxEvent(k, "sent", done, ws, ses, version, watched) for k in kinds]
                )
            kind = "removed"  # the caller acknowledges (release, or the next claim)
        elif kind == "updated":
            yield _Emit(
                self._events("updated", [answer[1]], ws, ses, int(answer[2]), None, bool(answer[3]))
            )
        elif kind == "lost":
            logger.warning(
                "outbox: %s/%s %s: lease lost, outcome %s left to verification",
                ws,
                ses,
                entry.id,
                outcome,
            )
        return kind

    def _release_plan(self, ws: str, ses: str, token: str, acknowledge: Iterable[str] = ()) -> Plan:
        return (yield self._session_eval("release", ws, ses, extra_args=[token, *acknowledge]))


async def retry_unavailable(
    step: Callable[[], Any],
    *,
    patience: float,
    first_delay: float,
    max_delay: float,
    what: str,
    sleep: Callable[[float], Any] = asyncio.sleep,
    give_up: Callable[[], bool] = lambda: False,
) -> Any:
    """Await ``step()``, retrying while it raises :class:`OutboxUnavailable`.

    Delays start at ``first_delay`` seconds and double up to ``max_delay``; after
    ``patience`` seconds (or as soon as ``give_up()`` is true) the last error
    propagates. ``sleep`` may be an interruptible wait.
    """
    deadline = time.monotonic() + patience
    delay = first_delay
    while True:
        try:
            return await step()
        except OutboxUnavailable as exc:
            if give_up() or time.monotonic() + delay > deadline:
                raise
            logger.warning("outbox: %s failed (%s); retrying in %.2fs", what, exc, delay)
            await sleep(delay)
            delay = min(delay * 2, max_delay)


def iter_once(effect: Any) -> Plan:
    """A plan of one effect, returning its result."""
    return (yield effect)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable
