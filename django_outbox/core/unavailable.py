"""What "Valkey unavailable" means, and waiting it out.

A cut connection, a timeout, a cluster between topologies and the replies that mean
"not now" (OOM, READONLY, LOADING, ...) all become :class:`OutboxUnavailable`, for
single calls (the drivers in :mod:`~django_outbox.core.transport`) and for each
answer of a pipeline alike; :func:`retry_unavailable` waits out a short outage
where an outcome must not be lost (README "Operations: what each Valkey setting keeps").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import RedisClusterException

from .errors import OutboxUnavailable

T = TypeVar("T")

logger = logging.getLogger("django_outbox")

#: Errors that mean "Valkey cannot be reached right now": a cut connection, a
#: timeout, or a cluster between topologies (a failover, slots not yet covered).
UNREACHABLE = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterError,
    RedisClusterException,
)

UNAVAILABLE_REPLIES = (
    "OOM",
    "READONLY",
    "MASTERDOWN",
    "LOADING",
    "BUSY",
    "NOREPLICAS",
    "TRYAGAIN",
    "CLUSTERDOWN",
)


def unavailable_error(exc: Exception) -> OutboxUnavailable:
    """The :class:`OutboxUnavailable` for a redis-py error that means "not now"."""
    if isinstance(exc, redis.OutOfMemoryError) or str(exc).startswith("OOM"):
        return OutboxUnavailable(
            "Valkey is out of memory (maxmemory reached) and refused this change whole, "
            "before it ran; deliveries, dismissals and cleanup still run and free memory"
        )
    return OutboxUnavailable(f"Valkey unavailable: {type(exc).__name__}: {exc}")


def classified(result: Any) -> Any:
    """A pipeline's per-command result, with "Valkey unavailable" errors (a cut
    connection, a cluster between topologies, OOM, READONLY, ...) turned into
    :class:`OutboxUnavailable` like the drivers do for single calls."""
    if isinstance(result, (*UNREACHABLE, redis.exceptions.AskError)) or (
        isinstance(result, redis.ResponseError) and is_unavailable_reply(result)
    ):
        return unavailable_error(result)
    return result


def is_unavailable_reply(exc: Exception) -> bool:
    if isinstance(exc, redis.OutOfMemoryError | redis.ReadOnlyError | redis.BusyLoadingError):
        return True
    text = str(exc)
    return any(text.startswith(code) for code in UNAVAILABLE_REPLIES) or "maxmemory" in text


async def retry_unavailable(
    step: Callable[[], Awaitable[T]],
    *,
    patience: float,
    first_delay: float,
    max_delay: float,
    what: str,
    sleep: Callable[[float], Any] = asyncio.sleep,
    give_up: Callable[[], bool] = lambda: False,
) -> T:
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
