"""Quick accept-rate check: our accept vs a raw 3-key EVALSHA on the same server.

Usage: python bench/quick_accept.py REDIS_URL [N]
Prints accepts/s (sync, one connection; async, 64 tasks) and the raw script rate.
"""

import asyncio
import sys
import time

import redis
import redis.asyncio

from django_outbox.core.service import Outbox

RAW = "redis.call('RPUSH', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[2]); redis.call('EXPIRE', KEYS[3], 60); return 1"


def rate(n, fn):
    started = time.perf_counter()
    fn()
    return n / (time.perf_counter() - started)


def main(url, n):
    client = redis.Redis.from_url(url)
    client.flushall()
    sha = client.script_load(RAW)
    raw = rate(n, lambda: [client.evalsha(sha, 3, f"q{i % 1000}", f"m{i}", f"q{i % 1000}", "x" * 100, "v") for i in range(n)])
    outbox = Outbox(url=url, cap=10**6)
    outbox.load_scripts()
    ours = rate(n, lambda: [outbox.accept(f"w{i % 10}", f"s{i % 1000}", user_id="u", client_message_id=f"k{i}", text="x" * 100) for i in range(n)])
    client.flushall()

    async def run_async():
        sem = asyncio.Semaphore(64)

        async def one(i):
            async with sem:
                await outbox.aaccept(f"w{i % 10}", f"s{i % 1000}", user_id="u", client_message_id=f"a{i}", text="x" * 100)

        started = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        elapsed = time.perf_counter() - started
        await outbox.aclose()
        return n / elapsed

    ours_async = asyncio.run(run_async())
    print(f"raw_evalsha_sync {raw:8.0f}/s  accept_sync {ours:8.0f}/s ({ours / raw:.0%})  accept_async(64) {ours_async:8.0f}/s")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5000)
