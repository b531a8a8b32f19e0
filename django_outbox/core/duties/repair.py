"""The index repair duty (cluster only): workspaces missing from their shard's
workspaces-due index put back (``index.lua`` explains the hint that can go missing)."""

from __future__ import annotations

from ..finding import IndexTransport
from ..transport import as_text
from . import Duty

REPAIR_INTERVAL = 10.0  # seconds between passes of the cluster index repair
REPAIR_BATCH = 100  # workspaces per shard per repair pass (SSCAN COUNT hint)


async def repair_indices(
    outbox: IndexTransport, cursors: dict[int, int], batch: int = REPAIR_BATCH
) -> int:
    """Cluster only: one paced pass of the index repair; returns workspaces checked.

    A shard's workspaces-due score is written by the client *after* the
    script (the hint). A client that dies between the two (and whose caller
    never retries) leaves a workspace due in its own index but not in the
    shard's. This walks each shard's workspaces SET with SSCAN, at most
    ``batch`` workspaces per shard per pass, and adds each one's earliest
    due time with ZADD LT (never later than it is). ``cursors`` carries the
    SSCAN positions from pass to pass (updated in place).
    """
    client = await outbox._aclient_ready()
    keys = outbox.keys
    checked = 0
    for shard in range(keys.shards):
        shard_keys = keys.shard_keys(shard)
        cursor, members = await client.sscan(shard_keys[1], cursors.get(shard, 0), count=batch)
        cursors[shard] = cursor
        workspaces = [as_text(m) for m in members]
        if not workspaces:
            continue
        pipe = client.pipeline(transaction=False)
        for ws in workspaces:
            pipe.zrange(keys.due(ws), 0, 0, withscores=True)
        earliest = {
            ws: int(first[0][1])
            for ws, first in zip(workspaces, await pipe.execute(), strict=True)
            if first
        }
        if earliest:
            await client.zadd(shard_keys[0], earliest, lt=True)
        checked += len(workspaces)
    return checked


def index_repair(outbox: IndexTransport) -> Duty:
    """Every ``REPAIR_INTERVAL`` seconds, the first one after the start: one pass of
    :func:`repair_indices`, continuing the last pass's scan. For a cluster only."""
    cursors: dict[int, int] = {}
    return Duty("index repair", REPAIR_INTERVAL, lambda: repair_indices(outbox, cursors))
