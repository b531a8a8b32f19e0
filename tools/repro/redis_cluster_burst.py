"""Reproduction (not a test, not run by CI) of what django_outbox's transport now avoids by
awaiting ``initialize()`` before a client's first use (``Transport._aclient_ready``; the test is
``tests/cluster/test_cluster.py::test_a_burst_on_a_fresh_client_is_accepted_whole``): redis-py's
async RedisCluster (8.1.0 here) fails a few commands of a burst on a fresh client with
``AttributeError: 'NoneType' object has no attribute 'writelines'`` while it sets up connections
(``connect_check_health`` -> ``on_connect_check_health``). Found by ``make bench-cluster``,
whose first 64-task accept burst hits it; ``Outbox.aaccept`` on a cluster is affected the same
way (a fresh ASGI process's first burst of accepts). Awaiting ``client.initialize()`` first
avoids it in every run; serialising the scripts' loading did not.

Run: ``.venv/bin/python tools/repro/redis_cluster_burst.py`` (starts a 3-master cluster in a
temporary folder; prints the errors of each variant).
"""

import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import redis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster as SyncCluster

from tests.support.cluster import ValkeyCluster

SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]) return 1"


async def main(url, sha, **kw):
    rc = RedisCluster.from_url(url, **kw)
    errors = []
    sem = asyncio.Semaphore(64)

    async def one(i):
        async with sem:
            try:
                await rc.evalsha(sha, 1, f"{{w{i % 50}}}k{i}", "v")
            except Exception as e:
                errors.append(repr(e))

    await asyncio.gather(*(one(i) for i in range(3000)))
    print(list(kw), "errors", len(errors), errors[:1])
    await rc.aclose()


with tempfile.TemporaryDirectory() as tmp:
    c = ValkeyCluster(Path(tmp) / "c", appendonly="no", save="")
    c.start()
    try:
        url = c.startup_url
        sha = SyncCluster.from_url(url).script_load(SCRIPT)
        asyncio.run(main(url, sha))
        asyncio.run(
            main(
                url,
                sha,
                max_connections=10000,
                retry=AsyncRetry(ExponentialBackoff(cap=0.5, base=0.02), 3),
                retry_on_error=[redis.ConnectionError, redis.TimeoutError],
            )
        )
    finally:
        c.stop()
