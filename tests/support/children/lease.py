"""A worker process that takes a session's lease and hangs holding it, to be SIGKILLed.

Usage: python -m tests.support.children.lease URL WS SES LOCK_TTL MODE

MODE names the lease it hangs under (tests/delivery/test_leases.py):

- ``verify``: the verification lease: the verifier pushes ``verify:started`` onto the
  Valkey list ``test:log`` and never returns;
- ``owed``: the lease a claim takes to fire an ``entry_delivered`` a dead holder owed:
  the event hook pushes ``owed:started`` and never returns.

It steps the session until a step hangs; the test kills it once the marker is pushed,
before the first renewal of the lease (a third of ``LOCK_TTL`` after it was taken).
"""

import asyncio
import os
import sys

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from django_outbox.core.entry import OutboxEvent
from django_outbox.core.errors import AmbiguousError
from django_outbox.core.service import Outbox


async def main(url: str, ws: str, ses: str, lock_ttl: float, mode: str) -> None:
    cluster = os.environ.get("OUTBOX_TEST_CLUSTER") == "1"  # as tests/conftest.py
    log = (RedisCluster if cluster else redis.asyncio.Redis).from_url(url)

    async def deliver(entry, **kwargs):
        raise AmbiguousError("the child never delivers")

    async def verify(entry, **kwargs):
        if mode == "verify":
            await log.rpush("test:log", "verify:started")
            await asyncio.Event().wait()
        raise AssertionError(f"unexpected verification in mode {mode}")

    class Hanging(Outbox):
        def listening(self, kind: str, watched: bool) -> bool:
            return True

        async def aemit(self, event: OutboxEvent) -> None:
            if mode == "owed" and event.kind == "delivered":
                await log.rpush("test:log", "owed:started")
                await asyncio.Event().wait()

    outbox = Hanging(
        url=url, deliverer=deliver, verifier=verify, lock_ttl=lock_ttl, cluster=cluster
    )
    while True:
        if not await outbox.adeliver_once(ws, ses):
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    url, ws, ses, ttl, mode = sys.argv[1:]
    asyncio.run(main(url, ws, ses, float(ttl), mode))
