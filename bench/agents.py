"""Deliverers for benchmarks: record when they were called, do nothing else (or sleep)."""

import asyncio
import os
import time

import redis.asyncio

_client = None


def _r():
    global _client
    if _client is None:
        _client = redis.asyncio.Redis.from_url(os.environ["OUTBOX_VALKEY_URL"])
    return _client


async def noop(entry, *, workspace_id, session_id, attempt):
    return None


async def stamp(entry, *, workspace_id, session_id, attempt):
    """Record the call time (s) keyed by the entry's text (which carries the accept time)."""
    await _r().rpush("bench:called", f"{entry.text} {time.time()}")


async def sleep10(entry, *, workspace_id, session_id, attempt):
    await asyncio.sleep(float(os.environ.get("BENCH_SLEEP", "10")))
