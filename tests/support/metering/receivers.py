"""The receivers the metering app connects in every worker process.

- :func:`meter` (``once=True``): one :class:`~tests.support.metering.models.Metering` row.
- ``tests.support.recorder`` (plain, connected before): appends to ``test:delivered`` in Valkey,
  so replays of the signal show there.
- :func:`linger` (plain, async: it runs after the sync receivers): sleeps
  ``OUTBOX_TEST_RECEIVER_SLEEP`` seconds, so a SIGKILL often lands after the receivers
  ran and before the acknowledgement — the window in which the signal is replayed. While
  it sleeps, the Valkey hash ``test:lingering`` counts it under the worker's PID, so a test
  can aim a SIGKILL at a worker that is in that window.
"""

import asyncio
import os

import redis.asyncio

from .models import Metering

_clients: dict[int, redis.asyncio.Redis] = {}


def _client() -> redis.asyncio.Redis:
    key = id(asyncio.get_running_loop())
    if key not in _clients:
        _clients[key] = redis.asyncio.Redis.from_url(os.environ["OUTBOX_VALKEY_URL"])
    return _clients[key]


def meter(sender, entry, **kwargs):
    Metering.objects.create(entry_id=entry.id, delivered_at=entry.delivered_at, pid=os.getpid())


async def linger(sender, entry, **kwargs):
    seconds = float(os.environ.get("OUTBOX_TEST_RECEIVER_SLEEP", "0"))
    if seconds <= 0:
        return
    r, pid = _client(), str(os.getpid())
    await r.hincrby("test:lingering", pid, 1)
    try:
        await asyncio.sleep(seconds)
    finally:
        await r.hincrby("test:lingering", pid, -1)
