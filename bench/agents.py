"""Deliverers for benchmarks: record when they were called, do nothing else (or sleep)."""

import asyncio
import os
import time

import redis.asyncio

_client = None
_cpu = {"calls": 0, "first": 0.0}


def _r():
    global _client
    if _client is None:
        url = os.environ["OUTBOX_VALKEY_URL"]
        if os.environ.get("BENCH_CLUSTER") == "1":  # bench.cluster_bench's bounded run
            from redis.asyncio.cluster import RedisCluster

            _client = RedisCluster.from_url(url)
        else:
            _client = redis.asyncio.Redis.from_url(url)
    return _client


async def noop(entry, *, workspace_id, session_id, attempt):
    return None


async def cpu_noop(entry, *, workspace_id, session_id, attempt):
    """A no-op that measures its worker process: the process CPU time (time.process_time,
    every thread) at the first call, and at call number BENCH_EXPECT writes
    ``<calls - 1> <CPU seconds since the first call>`` to the file BENCH_CPU_FILE."""
    _cpu["calls"] += 1
    if _cpu["calls"] == 1:
        _cpu["first"] = time.process_time()
    elif _cpu["calls"] == int(os.environ["BENCH_EXPECT"]):
        spent = time.process_time() - _cpu["first"]
        # one small write at the very end of the measured span: blocking is harmless here
        with open(os.environ["BENCH_CPU_FILE"], "w") as f:  # noqa: ASYNC230
            f.write(f"{_cpu['calls'] - 1} {spent}\n")


async def stamp(entry, *, workspace_id, session_id, attempt):
    """Record the call time (s) keyed by the entry's text (which carries the accept time)."""
    await _r().rpush("bench:called", f"{entry.text} {time.time()}")


async def sleep10(entry, *, workspace_id, session_id, attempt):
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP", "10")))


async def sleep_stamp(entry, *, workspace_id, session_id, attempt):
    """Sleep BENCH_SLEEP seconds (a slow agent), then record ``<pid> <end time in s>``."""
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP", "0.02")))
    await _r().rpush("bench:done", f"{os.getpid()} {time.time()}")
