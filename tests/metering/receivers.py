"""The receivers the metering app connects in every worker process.

- :func:`meter` (``once=True``): one :class:`~tests.metering.models.Metering` row.
- ``tests.recorder`` (plain, connected before): appends to ``test:delivered`` in Valkey,
  so replays of the signal show there.
- :func:`linger` (plain, async: it runs after the sync receivers): sleeps
  ``OUTBOX_TEST_RECEIVER_SLEEP`` seconds, so a SIGKILL often lands after the receivers
  ran and before the acknowledgement — the window in which the signal is replayed.
"""

import asyncio
import os

from .models import Metering


def meter(sender, entry, **kwargs):
    Metering.objects.create(entry_id=entry.id, delivered_at=entry.delivered_at, pid=os.getpid())


async def linger(sender, entry, **kwargs):
    await asyncio.sleep(float(os.environ.get("OUTBOX_TEST_RECEIVER_SLEEP", "0")))
