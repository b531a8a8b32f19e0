"""How a worker finds work: the due index and the wake lists (docs/explanation/storage.md).

Two reads, run by the loop in :mod:`~django_outbox.core.worker` (and by nothing
else): :func:`due_sessions` reads the workspaces-due index, then the due sessions
of each due workspace (its tick), and :func:`wait_wake` blocks on one wake list
that accepts push ``"<ws> <ses>"`` onto (its wake). Both take the outbox as an
:class:`IndexTransport`: the transport members they run on.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from .keys import KeySpace
from .paging import score_pairs
from .plans import Eval, Pipe, Plan, T, iter_once
from .scripts import due_argv, index_drop_argv
from .transport import as_text

logger = logging.getLogger("django_outbox")


class IndexTransport(Protocol):
    """What the index reads use of an outbox: the members of
    :class:`~django_outbox.core.transport.Transport` they run on."""

    keys: KeySpace
    cluster: bool

    def _now_us(self) -> int: ...
    async def _arun(self, plan: Plan[T]) -> T: ...
    async def _aclient_ready(self) -> Any: ...
    async def _aevalsha(self, client: Any, name: str, keys: list[str], args: list[Any]) -> Any: ...


async def due_sessions(outbox: IndexTransport, limit: int) -> list[tuple[str, str]]:
    """``(workspace_id, session_id)`` of sessions due now, at most ``limit``
    workspaces (every shard of the workspaces-due index on a cluster) and
    ``limit`` sessions of each, in two pipelined round trips.

    On a cluster a shard's score may be early (see ``index.lua``): a workspace
    found with nothing due gets its true earliest due time back. Raises
    :class:`~django_outbox.core.errors.OutboxUnavailable`.
    """
    now_us = outbox._now_us()  # 0: each shard's own clock decides (due.lua)
    answers = await outbox._arun(
        iter_once(
            Pipe(
                [
                    Eval("due", [key], due_argv(now_us, limit, with_scores=True))
                    for key in outbox.keys.index_keys("wsdue")
                ]
            )
        )
    )
    workspaces: dict[str, int] = {}
    for shard in answers:
        if isinstance(shard, Exception):
            raise shard
        for ws, score in score_pairs(shard):
            workspaces[as_text(ws)] = int(float(score))
    if not workspaces:
        return []
    answers = await outbox._arun(
        iter_once(
            Pipe([Eval("due", [outbox.keys.due(ws)], due_argv(now_us, limit)) for ws in workspaces])
        )
    )
    due: list[tuple[str, str]] = []
    idle: dict[str, int] = {}
    for ws, sessions in zip(workspaces, answers, strict=True):
        if isinstance(sessions, Exception):
            raise sessions
        if not sessions:
            idle[ws] = workspaces[ws]
        due += [(ws, as_text(ses)) for ses in sessions]
    if idle and outbox.cluster:
        await _raise_scores(outbox, idle)
    return due


async def _raise_scores(outbox: IndexTransport, idle: dict[str, int]) -> None:
    """Cluster only: move workspaces whose shard score was early to their true
    earliest due time. Remove-then-recheck: drop the score only if it is still
    the one read (index.lua 'drop'), then read the workspace's own due index and
    add its earliest time back with ZADD LT, so a hint that arrived meanwhile
    is never overwritten by a later time."""
    client = await outbox._aclient_ready()
    keys = outbox.keys

    async def one(ws: str, score: int) -> None:
        shard = keys.shard_keys(keys.shard_of(ws))
        await outbox._aevalsha(client, "index", shard, index_drop_argv(ws, score))
        first = await client.zrange(keys.due(ws), 0, 0, withscores=True)
        if first:
            await client.zadd(shard[0], {ws: int(first[0][1])}, lt=True)

    await asyncio.gather(*(one(ws, score) for ws, score in idle.items()))


async def wait_wake(
    outbox: IndexTransport, key: str, block: float, batch: int
) -> list[tuple[str, str]]:
    """Wait up to ``block`` seconds on wake list ``key`` (one of
    ``keys.index_keys("wake")``); return the ``(workspace_id, session_id)`` pairs
    taken, each handed to exactly this caller: up to ``1 + batch`` in one BLMPOP
    (a burst of accepts comes in one round trip, and a single wake-up is not held
    back by a second one). ``[]`` when the wait timed out. Raises what the BLMPOP
    raises (Valkey 7.2+ / Redis 7 have it).

    On a cluster redis-py asks the server for BLMPOP's keys (``COMMAND GETKEYS``)
    before every call, three commands per wait per shard per worker, so a cluster
    worker waits with BLPOP, then takes the burst with one LPOP (a failed LPOP is
    logged and the pairs already taken are returned).
    """
    client = await outbox._aclient_ready()
    if outbox.cluster:
        item = await client.blpop([key], timeout=block)
        if item is None:
            return []
        items = [item[1]]
        if batch > 0:
            try:
                items += await client.lpop(key, batch) or []
            except Exception as exc:
                logger.warning("outbox: wake read failed: %s", exc)
    else:
        reply = await client.blmpop(block, 1, key, direction="LEFT", count=batch + 1)
        if reply is None:
            return []
        items = reply[1]
    pairs = []
    for raw in items:
        ws, _, ses = as_text(raw).partition(" ")
        if ws and ses:
            pairs.append((ws, ses))
    return pairs
