"""What "Valkey unavailable" means, and waiting it out.

A cut connection, a timeout, a cluster between topologies and the replies that mean
"not now" (OOM, READONLY, LOADING, ...) all become :class:`OutboxUnavailable`, for
single calls (the drivers in :mod:`~django_outbox.core.transport`) and for each
answer of a pipeline alike; :func:`retry_unavailable` waits out a short outage
where an outcome must not be lost (docs/howto/valkey.md#what-each-setting-keeps).
"""

from __future__ import annotations

import asyncio
import logging
import os
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

#: Where redis-py's own connection code (and the asyncio stream under it) runs. A
#: connection torn down by another task between redis-py's "is it connected" check
#: and its write shows up there as a plain Python error instead of redis-py's
#: ConnectionError: ``AttributeError: 'NoneType' object has no attribute
#: 'writelines'`` (the writer already cleared, seen on a cluster in failover, where
#: one command's error makes the client drop connections other commands are using),
#: or on newer Pythons a ``TypeError`` from the transport's cleared internals
#: (redis-py issue #4287). Nothing was written on such a connection.
_CONNECTION_CODE = tuple(
    os.sep + os.path.join(*parts)
    for parts in (
        ("redis", "asyncio", "connection.py"),
        ("redis", "connection.py"),
        ("asyncio", "streams.py"),
        ("asyncio", "selector_events.py"),
    )
)


def is_torn_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is redis-py failing to write on a connection that another task
    tore down under it (see ``_CONNECTION_CODE``): an ``AttributeError`` or
    ``TypeError`` raised in redis-py's connection code or the asyncio stream it
    writes to, never one raised by our own code or a caller's."""
    if not isinstance(exc, (AttributeError, TypeError)):
        return False
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename.endswith(_CONNECTION_CODE)


def is_unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` means "Valkey cannot be reached right now": one of
    ``UNREACHABLE``, or a connection torn down mid-command (:func:`is_torn_connection`)."""
    return isinstance(exc, UNREACHABLE) or is_torn_connection(exc)


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
    if is_torn_connection(exc):
        return OutboxUnavailable(
            "Valkey unavailable: the connection was closed while the command was being "
            f"sent ({type(exc).__name__}: {exc})"
        )
    return OutboxUnavailable(f"Valkey unavailable: {type(exc).__name__}: {exc}")


def as_unavailable(exc: Exception) -> OutboxUnavailable | None:
    """The :class:`OutboxUnavailable` for an error that means "Valkey unavailable" (a
    cut or torn connection, a cluster between topologies, OOM, READONLY, ...: what the
    drivers raise for a single call), else None (the error is the caller's to raise)."""
    if is_unreachable(exc) or (isinstance(exc, redis.ResponseError) and is_unavailable_reply(exc)):
        return unavailable_error(exc)
    return None


def classified(result: Any) -> Any:
    """A pipeline's per-command result, with "Valkey unavailable" errors turned into
    :class:`OutboxUnavailable` (:func:`as_unavailable`) like the drivers do for single
    calls; a moved slot's ASK answer too (the slot map is changing)."""
    if isinstance(result, redis.exceptions.AskError):
        return unavailable_error(result)
    if isinstance(result, Exception):
        return as_unavailable(result) or result
    return result


#: The "not now" replies redis-py's parser gives a class of their own, cutting the code off
#: the message (a TRYAGAIN reply's text no longer starts with ``TRYAGAIN``), so they are
#: known by their class.
_UNAVAILABLE_CLASSES = (
    redis.OutOfMemoryError,
    redis.ReadOnlyError,
    redis.BusyLoadingError,
    redis.exceptions.TryAgainError,
)


def is_unavailable_reply(exc: Exception) -> bool:
    """Whether a Valkey error reply ``exc`` means "not now" (:data:`UNAVAILABLE_REPLIES`),
    whether redis-py kept its code in the message or parsed it into its own class."""
    if isinstance(exc, _UNAVAILABLE_CLASSES):
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
