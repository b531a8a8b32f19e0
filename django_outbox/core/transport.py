"""The Valkey transport: clients per event loop and the drivers that run plans.

:class:`Transport` owns the redis-py clients (one sync client; one async client
per running event loop, as channels-redis keeps them), runs the effects of
:mod:`~django_outbox.core.plans` with a sync and an async driver, sends
pipelines (one per node on a cluster, re-running only calls whose script was
missing), hands a per-session script's reply on a cluster to
:mod:`~django_outbox.core.hints` (which applies its index hint), and turns every
"Valkey cannot serve this now" error (a cut connection, a failover, OOM,
READONLY, LOADING, ...) into :class:`~django_outbox.core.errors.OutboxUnavailable`.
Auto-pipelining (:class:`Batcher`) and hiredis command packing make the async
path cheap.
Nothing here knows what a queue is: the operations live in
:mod:`~django_outbox.core.service` and :mod:`~django_outbox.core.step`.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import Any, TypeVar, cast
from urllib.parse import parse_qs, urlsplit

import redis
import redis.asyncio
import redis.cluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import NoScriptError
from redis.retry import Retry

from .entry import OutboxEvent
from .errors import OutboxUnavailable, SignalOwed
from .hints import ahinted, hinted, is_hinted
from .keys import KeySpace
from .packing import with_hiredis_packing
from .plans import Call, Cmd, Emit, Eval, Pipe, Plan, T, iter_once
from .scripts import HINTED, Script, load_scripts
from .unavailable import (
    UNREACHABLE,
    as_unavailable,
    classified,
    unavailable_error,
)

V = TypeVar("V")
#: Sends one pipeline's calls and returns their answers in order (errors as objects).
Sender = Callable[[list[Eval | Cmd]], list[Any]]
AsyncSender = Callable[[list[Eval | Cmd]], Awaitable[list[Any]]]

logger = logging.getLogger("django_outbox")

#: Per-node connection cap of the async cluster client (Valkey's default maxclients).
CLUSTER_MAX_CONNECTIONS = 10_000


def is_moved(result: Any) -> bool:
    return isinstance(result, redis.exceptions.AskError)  # MovedError is an AskError


def _node_pipeline(node: Any) -> Any:
    """A non-transactional pipeline on one cluster node's own connection."""
    return node.redis_connection.pipeline(transaction=False)


def as_text(value: Any) -> Any:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def is_async_callable(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


class Batcher:
    """Auto-pipelining for one event loop (standalone servers).

    Script calls that concurrent tasks make within one turn of the loop go out
    together as one non-transactional pipeline (at most ``MAX``): each is still
    its own atomic script, and each caller gets its own answer or error. One
    session's calls keep their order, because its task awaits each answer before
    it makes the next call. A caller cancelled while waiting may still see its
    script run — as with any command already sent.
    """

    MAX = 128

    def __init__(self, transport: Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self.loop = loop
        self.pending: list[tuple[Eval, asyncio.Future[Any]]] = []
        self.scheduled = False
        self.sending: set[asyncio.Task[None]] = set()

    def submit(self, call: Eval) -> asyncio.Future[Any]:
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

    async def _send(self, batch: list[tuple[Eval, asyncio.Future[Any]]]) -> None:
        transport = self.transport
        try:
            if len(batch) == 1:
                results = [await transport._ado(batch[0][0], batch=False)]
            else:
                results = await transport._ado(Pipe([call for call, _ in batch]), batch=False)
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
            result = classified(result)
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)


async def awaited(awaitable: Any) -> Any:
    return await awaitable


def url_socket_timeout(url: str) -> float | None:
    """The ``socket_timeout`` of ``url``'s query (docs/howto/valkey.md, "Timeouts in the
    URL"), None without one. A value that is not a number is None here, and redis-py
    refuses it when the client is made."""
    raw = parse_qs(urlsplit(url).query).get("socket_timeout")
    if not raw:
        return None
    try:
        return float(raw[0])
    except ValueError:
        return None


def url_read_timeout_only(url: str) -> float | None:
    """The ``socket_timeout`` of ``url``'s query when it sets no ``socket_connect_timeout``
    (then connecting waits as long, as redis-py documents it: docs/howto/valkey.md,
    "Timeouts in the URL"), else None."""
    if "socket_connect_timeout" in parse_qs(urlsplit(url).query):
        return None
    return url_socket_timeout(url)


class Transport:
    """Clients and drivers for one outbox (see the module docstring).

    ``url`` is a ``redis://`` / ``rediss://`` / ``unix://`` URL; ``cluster=True``
    uses Valkey Cluster clients; ``client_options`` are redis-py client keyword
    arguments laid over ours; ``keys`` names the keys; ``clock`` (None: Valkey's own
    clock, see :meth:`_now_us`) returns seconds
    since the epoch. Sync methods share one thread-safe client; async ones use the
    running loop's own client.
    """

    def __init__(
        self,
        url: str,
        *,
        cluster: bool,
        keys: KeySpace,
        clock: Callable[[], float] | None,
        client_options: dict[str, Any] | None = None,
    ) -> None:
        self.url = url
        self.cluster = cluster
        self.keys = keys
        self.clock = clock
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
        read_timeout = url_read_timeout_only(url)
        if read_timeout is not None and "socket_connect_timeout" not in (client_options or {}):
            # A URL's options win over these keywords, but one that sets only
            # socket_timeout would still connect within our 2 s (or redis-py 8's 5 s):
            # connecting waits as long as a read, as a redis-py URL means it.
            options["socket_connect_timeout"] = read_timeout
        self._client_options = options
        self._explicit_options = set(client_options or ())
        self._client: redis.Redis | redis.cluster.RedisCluster | None = None
        self._aclients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = (
            weakref.WeakKeyDictionary()
        )
        #: Async cluster clients already initialised (see _aclient_ready).
        self._ready_clients: weakref.WeakSet[Any] = weakref.WeakSet()
        self._batchers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Batcher] = (
            weakref.WeakKeyDictionary()
        )
        # The last loop's client and batcher (a worker runs one loop). These hold
        # the loop strongly only until another loop asks.
        self._last_loop: asyncio.AbstractEventLoop | None = None
        self._last_client: Any = None
        self._last_batcher: Batcher | None = None

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
                pool.connection_class = with_hiredis_packing(pool.connection_class)
                client = redis.asyncio.Redis.from_pool(pool)
            self._aclients[loop] = client
        self._last_loop, self._last_client = loop, client
        return client

    async def _aclient_ready(self) -> Any:
        """:meth:`_aclient`, initialised before its first use on a cluster.

        redis-py's async RedisCluster initialises itself on first use, and when many tasks
        use a fresh client at once some of their commands ran on connections that the
        initialisation was replacing: they failed with ``AttributeError: 'NoneType' object
        has no attribute 'writelines'`` (an accept burst on a fresh web process; see
        tools/repro/redis_cluster_burst.py). Awaiting ``initialize()`` first (its own lock
        makes the others wait) closes that window; after that this is one set lookup.
        Raises :class:`~django_outbox.core.errors.OutboxUnavailable` when no node answers."""
        client = self._aclient()
        if self.cluster and client not in self._ready_clients:
            try:
                await client.initialize()
            except Exception as exc:
                unavailable = as_unavailable(exc)
                if unavailable is None:
                    raise
                raise unavailable from exc
            self._ready_clients.add(client)
        return client

    def _loop_local(
        self,
        last: str,
        table: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, V],
        make: Callable[[asyncio.AbstractEventLoop], V],
    ) -> V:
        """The running loop's object in ``table`` (made by ``make(loop)`` on first use),
        remembered in attribute ``last``: a worker runs one loop, and WeakKeyDictionary
        lookups showed in its profile."""
        loop = asyncio.get_running_loop()
        remembered = getattr(self, last)
        if remembered is not None and remembered.loop is loop:
            return cast(V, remembered)
        value = table.get(loop)
        if value is None:
            value = table[loop] = make(loop)
        setattr(self, last, value)
        return value

    @property
    def read_timeout(self) -> float | None:
        """Seconds a reply may take on this outbox's connections: the URL's
        ``socket_timeout`` (a URL's options win over client options, docs/howto/valkey.md
        "Timeouts in the URL"), else the client option (5 s by default); None for no
        limit. A blocking wait must stay under it."""
        from_url = url_socket_timeout(self.url)
        if from_url is not None:
            return from_url
        value = self._client_options.get("socket_timeout")
        return float(value) if value else None

    def _abatcher(self) -> Batcher:
        return self._loop_local("_last_batcher", self._batchers, lambda loop: Batcher(self, loop))

    def load_scripts(self) -> None:
        """Load every script into Valkey now (otherwise each loads on first NOSCRIPT).

        Uses ``SCRIPT LOAD`` through the client's own method, which a cluster
        client sends to every primary. Raises :class:`OutboxUnavailable`.
        """
        try:
            for script in self.scripts.values():
                self.client.script_load(script.text)
        except UNREACHABLE as exc:
            raise unavailable_error(exc) from exc

    async def aload_scripts(self) -> None:
        """Async :meth:`load_scripts`."""
        client = await self._aclient_ready()
        try:
            for script in self.scripts.values():
                await client.script_load(script.text)
        except UNREACHABLE as exc:
            raise unavailable_error(exc) from exc

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

    # -- clock ---------------------------------------------------------------------------

    def _now_us(self) -> int:
        """ "Now" for the scripts, in microseconds: 0 means "take Valkey's TIME".

        Every time decision that crosses processes (leases, due times, backoff and
        verify gates, ``acceptedAt``, marker expiry) is taken inside the scripts on
        the server's clock, so a process whose clock is wrong can neither freeze a
        session, shorten a backoff nor delay a prompt (docs/explanation/ordering.md#clocks). An
        injected ``clock`` (tests) replaces it.
        """
        return 0 if self.clock is None else int(self.clock() * 1_000_000)

    # -- drivers ---------------------------------------------------------------------

    def _run(self, plan: Plan[T]) -> T:
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
            return cast(T, stop.value)

    async def _arun(self, plan: Plan[T]) -> T:
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
            return cast(T, stop.value)

    def _evalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self.scripts[name]
        try:
            result = client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(script.text)
            result = client.evalsha(script.sha, len(keys), *keys, *args)
        if self.cluster and name in HINTED:
            return hinted(self, name, args, result)
        return result

    async def _aevalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        script = self.scripts[name]
        try:
            result = await client.evalsha(script.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            await client.script_load(script.text)
            result = await client.evalsha(script.sha, len(keys), *keys, *args)
        if self.cluster and name in HINTED:
            return await ahinted(self, name, args, result)
        return result

    def _queue(self, pipe: Any, call: Eval | Cmd) -> None:
        if isinstance(call, Eval):
            script = self.scripts[call.script]
            pipe.evalsha(script.sha, len(call.keys), *call.keys, *call.args)
        else:
            pipe.execute_command(*call.args)

    def _pipe_scripts(self, calls: list[Eval | Cmd]) -> list[Script]:
        """The distinct scripts the calls use."""
        return list(
            {c.script: self.scripts[c.script] for c in calls if isinstance(c, Eval)}.values()
        )

    # One pipeline's calls, sent by ``send(calls) -> answers`` (a standalone pipeline
    # or one node's). Calls that found their script missing (a restarted server)
    # are re-sent once after loading it; the others ran and must not run twice.

    def _pipelined(self, client: Any, send: Sender, calls: list[Eval | Cmd]) -> list[Any]:
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
        self, client: Any, send: AsyncSender, calls: list[Eval | Cmd]
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

    def _pipeline_sender(self, pipeline: Callable[[], Any]) -> Sender:
        def send(calls: list[Eval | Cmd]) -> list[Any]:
            pipe = pipeline()
            for call in calls:
                self._queue(pipe, call)
            answers: list[Any] = pipe.execute(raise_on_error=False)
            return answers

        return send

    def _apipeline_sender(self, pipeline: Callable[[], Any]) -> AsyncSender:
        async def send(calls: list[Eval | Cmd]) -> list[Any]:
            pipe = pipeline()
            for call in calls:
                self._queue(pipe, call)
            answers: list[Any] = await pipe.execute(raise_on_error=False)
            return answers

        return send

    # Pipelines on a cluster. redis-py's cluster pipeline refuses EVALSHA, so the
    # calls are grouped by the node that owns each one's slot and every group is
    # one pipeline on one connection to that node. WAIT / WAITAOF count the
    # acknowledgements of *that connection's* writes, so they go with the script
    # before them (a cluster client would send them to every primary). A group
    # answered MOVED/ASK (the slot map changed: a failover, a reshard) is re-run
    # once on a fresh map; scripts are replay-safe.

    def _node_groups(self, client: Any, calls: list[Eval | Cmd]) -> list[tuple[Any, list[int]]]:
        anchor: str | None = None
        groups: dict[str, tuple[Any, list[int]]] = {}
        for i, call in enumerate(calls):
            key: str | None
            if isinstance(call, Eval):
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

    def _cluster_pipe(self, client: Any, calls: list[Eval | Cmd]) -> list[Any]:
        results: list[Any] = [None] * len(calls)
        for attempt in range(2):
            todo = [i for i, r in enumerate(results) if r is None or is_moved(r)]
            if not todo:
                break
            if attempt:
                client.nodes_manager.initialize()
            for node, indices in self._node_groups(client, [calls[i] for i in todo]):
                group = [calls[todo[j]] for j in indices]
                send = self._pipeline_sender(partial(_node_pipeline, node))
                answers = self._pipelined(client, send, group)
                for j, answer in zip(indices, answers, strict=True):
                    results[todo[j]] = answer
        return [
            hinted(self, call.script, call.args, result)
            if is_hinted(call, result)
            else classified(result)
            for call, result in zip(calls, results, strict=True)
        ]

    async def _acluster_pipe(self, client: Any, calls: list[Eval | Cmd]) -> list[Any]:
        from redis.asyncio.cluster import PipelineCommand

        await client.initialize()  # no-op once the slot map is loaded
        results: list[Any] = [None] * len(calls)

        async def run(node: Any, indices: list[int]) -> None:
            async def send(group: list[Eval | Cmd]) -> list[Any]:
                commands = []
                for n, call in enumerate(group):
                    if isinstance(call, Eval):
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
            todo = [i for i, r in enumerate(results) if r is None or is_moved(r)]
            if not todo:
                break
            if attempt:
                await client.nodes_manager.initialize()
            groups = self._node_groups(client, [calls[i] for i in todo])
            if len(groups) == 1:  # the usual case (one session's keys): no task to make
                node, indices = groups[0]
                await run(node, [todo[j] for j in indices])
                continue
            await asyncio.gather(
                *(run(node, [todo[j] for j in indices]) for node, indices in groups)
            )
        out = []
        for call, result in zip(calls, results, strict=True):
            if is_hinted(call, result):
                result = await ahinted(self, call.script, call.args, result)
            out.append(classified(result))
        return out

    def _do(self, effect: Any) -> Any:
        if isinstance(effect, Emit):  # answers the events whose hooks raised SignalOwed
            return [e for e in effect.events if not self._safe_emit(e)]
        if isinstance(effect, Call):
            result = effect.fn(**effect.kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(awaited(result))
            return result
        client = self.client
        try:
            if isinstance(effect, Eval):
                return self._evalsha(client, effect.script, effect.keys, effect.args)
            if isinstance(effect, Cmd):
                return client.execute_command(*effect.args)
            if self.cluster:
                return self._cluster_pipe(client, effect.calls)
            send = self._pipeline_sender(lambda: client.pipeline(transaction=False))
            # Each answer classified as the drivers classify single calls: an OOM or
            # READONLY answer is OutboxUnavailable, whichever path sent it.
            return [classified(r) for r in self._pipelined(client, send, effect.calls)]
        except Exception as exc:
            unavailable = as_unavailable(exc)
            if unavailable is None:
                raise
            raise unavailable from exc

    async def _ado(self, effect: Any, batch: bool = True) -> Any:
        if isinstance(effect, Emit):
            return [e for e in effect.events if not await self._safe_aemit(e)]
        if isinstance(effect, Call):
            if is_async_callable(effect.fn):
                return await effect.fn(**effect.kwargs)
            result = await asyncio.to_thread(effect.fn, **effect.kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result
        if isinstance(effect, Eval) and batch and not self.cluster:
            return await self._abatcher().submit(effect)
        client = self._aclient()
        if self.cluster and client not in self._ready_clients:  # (inlined: the hot path)
            client = await self._aclient_ready()
        try:
            if isinstance(effect, Eval):
                return await self._aevalsha(client, effect.script, effect.keys, effect.args)
            if isinstance(effect, Cmd):
                return await client.execute_command(*effect.args)
            if self.cluster:
                return await self._acluster_pipe(client, effect.calls)
            send = self._apipeline_sender(lambda: client.pipeline(transaction=False))
            return [classified(r) for r in await self._apipelined(client, send, effect.calls)]
        except Exception as exc:
            unavailable = as_unavailable(exc)
            if unavailable is None:
                raise
            raise unavailable from exc

    def execute_many(self, commands: Iterable[tuple[Any, ...]]) -> list[Any]:
        """Run plain Valkey commands (tuples such as ``("ZCARD", key)``) in one round trip.

        For reads of the outbox's indices; answers come in
        order, a failed command's answer is its exception. Connection failures
        raise :class:`OutboxUnavailable`. Never use it to write queue state: the
        scripts own every transition.
        """
        calls = [Cmd(tuple(c)) for c in commands]
        return self._run(iter_once(Pipe(calls))) if calls else []

    # -- events ------------------------------------------------------------------------

    def emit(self, event: OutboxEvent) -> None:
        """Observe an event (sync context). The base class does nothing."""

    async def aemit(self, event: OutboxEvent) -> None:
        """Observe an event (async context). Defaults to :meth:`emit` in a thread."""
        if type(self).emit is not Transport.emit:
            await asyncio.to_thread(self.emit, event)

    def _safe_emit(self, event: OutboxEvent) -> bool:
        """Run the hook; False if it raised :class:`SignalOwed` (the event stays owed)."""
        try:
            self.emit(event)
        except SignalOwed:
            return False
        except Exception:
            logger.exception("outbox: event listener failed for %s", event.kind)
        return True

    async def _safe_aemit(self, event: OutboxEvent) -> bool:
        try:
            await self.aemit(event)
        except SignalOwed:
            return False
        except Exception:
            logger.exception("outbox: event listener failed for %s", event.kind)
        return True
