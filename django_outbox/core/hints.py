"""Cluster index hints: the client's half of ``index.lua`` (docs/howto/cluster.md).

On Valkey Cluster a per-session script cannot write the global indices of its
workspace's shard (they live in other slots), so it answers ``{reply, HINT}``
(:data:`~django_outbox.core.scripts.HINTED` scripts; the HINT members are listed in
``index.lua``): what those indices need — the workspace's earliest due time, a wake,
the session's attention verdict, new/gone/empty flags and the session's version.
:func:`hinted` and :func:`ahinted` apply a hint with one ``index`` script call on
the shard's keys, before the reply reaches the plan, and return the reply.

If that fails, an accept raises ``OutboxUnavailable(accepted=True)``: the client's
retry with the same key replays the accept, which reports the hint again. Any other
transition logs it: the worker's index repair finds the workspace later.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol, TypeGuard

import redis
from redis.exceptions import RedisClusterException

from .errors import OutboxUnavailable
from .keys import KeySpace
from .paging import as_text
from .plans import Cmd, Eval
from .scripts import HINTED, index_hint_argv
from .unavailable import is_torn_connection

logger = logging.getLogger("django_outbox")

#: Most items a cluster shard's wake list holds (the standalone list's cap is in the Lua).
MAX_WAKE_ITEMS = 10000


class ScriptRunner(Protocol):
    """What applying a hint needs of :class:`~django_outbox.core.transport.Transport`."""

    keys: KeySpace

    @property
    def client(self) -> Any: ...

    def _now_us(self) -> int: ...

    def _evalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any: ...

    async def _aevalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any: ...

    async def _aclient_ready(self) -> Any: ...


def is_hinted(call: Eval | Cmd, result: Any) -> TypeGuard[Eval]:
    """Whether ``result`` (a pipeline's answer to ``call``) is a ``[reply, HINT]`` pair."""
    return isinstance(call, Eval) and call.script in HINTED and not isinstance(result, Exception)


def hint_call(runner: ScriptRunner, args: list[Any], hint: list[Any]) -> Eval | None:
    """The ``index`` call that applies ``hint`` to the shard of the workspace in the
    per-session script's ``args`` (ARGV: session ID third, workspace ID fourth), or None
    when the hint asks for nothing."""
    due, wake, attention, new, gone, empty, version = (int(h) for h in hint[:7])
    if due < 0 and not wake and attention < 0 and not new and not gone and not empty:
        return None
    session_id, workspace_id = as_text(args[2]), as_text(args[3])
    keys = runner.keys.shard_keys(runner.keys.shard_of(workspace_id))
    now_ms = runner._now_us() // 1000
    hint_values = (due, wake, attention, new, gone, empty, version)
    return Eval(
        "index",
        keys,
        index_hint_argv(workspace_id, session_id, hint_values, now_ms, MAX_WAKE_ITEMS),
    )


def hint_failed(name: str, exc: Exception) -> None:
    """After the hint of script ``name`` failed to apply: raise for an accept, else log."""
    if name == "accept":
        raise OutboxUnavailable(
            f"accepted, but the cluster index update failed: {exc}; retry with the same "
            "clientMessageID",
            accepted=True,
        ) from exc
    logger.warning("outbox: cluster index update after %s failed: %s", name, exc)


def hinted(runner: ScriptRunner, name: str, args: list[Any], result: Any) -> Any:
    """Apply the hint in ``result`` (``[reply, HINT]``, what script ``name`` answered
    to ``args``) and return the reply (see the module docstring for failures)."""
    reply, hint = result
    call = hint_call(runner, args, hint)
    if call is not None:
        try:
            client = runner.client
            if as_text(runner._evalsha(client, "index", call.keys, call.args)) == "recheck":
                recheck_workspace(client, runner.keys, as_text(args[3]))
        except (redis.RedisError, RedisClusterException, AttributeError, TypeError) as exc:
            if isinstance(exc, (AttributeError, TypeError)) and not is_torn_connection(exc):
                raise
            hint_failed(name, exc)
    return reply


async def ahinted(runner: ScriptRunner, name: str, args: list[Any], result: Any) -> Any:
    """Async :func:`hinted`."""
    reply, hint = result
    call = hint_call(runner, args, hint)
    if call is not None:
        client = await runner._aclient_ready()
        try:
            if as_text(await runner._aevalsha(client, "index", call.keys, call.args)) == "recheck":
                await arecheck_workspace(client, runner.keys, as_text(args[3]))
        except (redis.RedisError, RedisClusterException, AttributeError, TypeError) as exc:
            if isinstance(exc, (AttributeError, TypeError)) and not is_torn_connection(exc):
                raise
            hint_failed(name, exc)
    return reply


def recheck_workspace(client: Any, keys: KeySpace, workspace_id: str) -> None:
    """After ``index.lua`` dropped an emptied workspace from its shard: re-add it if a
    session was accepted there meanwhile (remove, then re-check, never check-then-remove)."""
    if client.exists(keys.sessions(workspace_id)):
        client.sadd(workspaces_key(keys, workspace_id), workspace_id)


async def arecheck_workspace(client: Any, keys: KeySpace, workspace_id: str) -> None:
    """Async :func:`recheck_workspace`."""
    if await client.exists(keys.sessions(workspace_id)):
        await client.sadd(workspaces_key(keys, workspace_id), workspace_id)


def workspaces_key(keys: KeySpace, workspace_id: str) -> str:
    """The workspaces SET of the shard that indexes ``workspace_id``."""
    return keys.index("workspaces", keys.shard_of(workspace_id))
