"""The peer queues of ``make bench`` (dramatiq, arq, saq), measured by one runner.

For each peer: enqueue ``n`` no-op jobs from this process (jobs/s), then start the peer's own
worker CLI on the app beside this module (bench/peers/<name>_app.py) and time the drain from
the first job taken to the last one done (jobs/s). The apps read the server's URL from
BENCH_PEER_URL.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import PAYLOAD, ROOT, child_env, spawn, stop

BIN = Path(sys.executable).parent  #: where the peers' worker CLIs are installed


def _enqueue_dramatiq(url: str, n: int) -> float:
    os.environ["BENCH_PEER_URL"] = url  # read when the app is first imported
    from bench.peers import dramatiq_app

    dramatiq_app.broker.client.flushall()
    t = time.perf_counter()
    for _ in range(n):
        dramatiq_app.noop.send(PAYLOAD)
    return n / (time.perf_counter() - t)


def _enqueue_arq(url: str, n: int) -> float:
    from arq import create_pool
    from arq.connections import RedisSettings

    async def enqueue_all():
        pool = await create_pool(RedisSettings.from_dsn(url))
        t = time.perf_counter()
        for _ in range(n):
            await pool.enqueue_job("noop", PAYLOAD)
        rate = n / (time.perf_counter() - t)
        await pool.aclose()
        return rate

    return asyncio.run(enqueue_all())


def _enqueue_saq(url: str, n: int) -> float:
    from saq import Queue

    async def enqueue_all():
        queue = Queue.from_url(url)
        if hasattr(queue, "connect"):
            await queue.connect()
        t = time.perf_counter()
        for _ in range(n):
            await queue.enqueue("noop", payload=PAYLOAD)
        rate = n / (time.perf_counter() - t)
        await queue.disconnect()
        return rate

    return asyncio.run(enqueue_all())


@dataclass(frozen=True)
class Peer:
    """One peer queue: how to enqueue, how its worker runs, how many jobs are not done."""

    name: str  #: also the name of its worker CLI, and the figures' prefix
    enqueue: Callable[[str, int], float]  #: (url, n) -> jobs/s
    worker_args: tuple[str, ...]  #: the worker CLI's arguments
    backlog: Callable[[redis.Redis], int]  #: jobs not done yet


PEERS = {
    peer.name: peer
    for peer in (
        Peer(
            "dramatiq",
            _enqueue_dramatiq,
            ("bench.peers.dramatiq_app", "--processes", "1", "--threads", "8"),
            lambda client: client.hlen("dramatiq:default.msgs"),
        ),
        Peer(
            "arq",
            _enqueue_arq,
            ("bench.peers.arq_app.WorkerSettings",),
            lambda client: client.zcard("arq:queue"),
        ),
        Peer(
            "saq",
            _enqueue_saq,
            ("bench.peers.saq_app.settings",),
            lambda client: client.zcard("saq:default:incomplete"),
        ),
    )
}


def _drain(proc: subprocess.Popen, remaining: Callable[[], int], n: int, timeout: float) -> float:
    """Seconds from the first job taken to the last one done (remaining() counts not-done)."""
    started = None
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited with {proc.returncode}")
        left = remaining()
        now = time.monotonic()
        if started is None and left < n:
            started = now
        if started is not None and left == 0:
            return now - started
        if now > deadline:
            raise TimeoutError(f"{left} of {n} jobs left after {timeout}s")
        time.sleep(0.01)


def run_peer(peer: Peer, url: str, n: int, timeout: float) -> tuple[float, float]:
    """Enqueue ``n`` jobs, then drain them with one worker process (bounded by ``timeout``
    seconds): (enqueue jobs/s, end-to-end jobs/s). Raises TimeoutError or RuntimeError."""
    client = redis.Redis.from_url(url)
    client.flushall()
    try:
        enqueue = peer.enqueue(url, n)
        proc = spawn(
            [str(BIN / peer.name), *peer.worker_args],
            cwd=ROOT,
            env=child_env(url),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            secs = _drain(proc, lambda: peer.backlog(client), n, timeout)
        finally:
            stop(proc)
        return enqueue, n / secs
    finally:
        client.close()
