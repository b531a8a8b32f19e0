"""A delivery process to be SIGKILLed by tests: logs each delivery to a Valkey list.

Usage: python -m tests.support.children.crash URL WS SES LOCK_TTL HANG_ON_TEXT
Delivers the session's entries one step at a time; on the entry whose text is
HANG_ON_TEXT it logs "<text>:started" and hangs inside the deliverer.
"""

import asyncio
import os
import sys

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from django_outbox.core.service import Outbox


async def main(url: str, ws: str, ses: str, lock_ttl: float, hang_on: str) -> None:
    cluster = os.environ.get("OUTBOX_TEST_CLUSTER") == "1"  # as tests/conftest.py
    log = (RedisCluster if cluster else redis.asyncio.Redis).from_url(url)

    async def deliver(entry, *, workspace_id, session_id, attempt):
        if entry.text == hang_on:
            await log.rpush("test:log", f"{entry.text}:started")
            await asyncio.Event().wait()
        await log.rpush("test:log", entry.text)

    outbox = Outbox(url=url, deliverer=deliver, lock_ttl=lock_ttl, cluster=cluster)
    while True:
        if not await outbox.adeliver_once(ws, ses):
            await asyncio.sleep(0.01)


if __name__ == "__main__":
    url, ws, ses, ttl, hang_on = sys.argv[1:]
    asyncio.run(main(url, ws, ses, float(ttl), hang_on))
