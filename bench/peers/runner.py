"""The peer queues of ``make bench`` (dramatiq, arq, saq), measured by one runner.

For each peer: enqueue ``n`` no-op jobs from this process (jobs/s), then start the peer's own
worker CLI on the app beside this module (bench/peers/<name>_app.py) and time the drain from
the first job taken to the last one done (jobs/s). The apps read the server's URL from
BENCH_PEER_URL.

The peers live in their own virtual environment (.venv-peers, bench/peers/requirements.txt;
arq pins redis-py below 6, the project's .venv keeps the one CI runs): bench/run.py calls
:func:`run_peer_subprocess`, which runs this module under that interpreter
(``python -m bench.peers.runner NAME URL N TIMEOUT``, one JSON line on stdout).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from bench.common import PAYLOAD, ROOT, child_env, interrupt_on_sigterm, spawn, stop

BIN = Path(sys.executable).parent  #: where the peers' worker CLIs are installed
#: The peers' interpreter: BENCH_PEERS_PYTHON (the Makefile sets it), else .venv-peers's.
PEERS_PYTHON = os.environ.get("BENCH_PEERS_PYTHON") or str(ROOT / ".venv-peers" / "bin" / "python")
PEER_NAMES = ("dramatiq", "arq", "saq")


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


def run_peer_subprocess(name: str, url: str, n: int, timeout: float) -> tuple[float, float]:
    """:func:`run_peer` for peer ``name`` under the peers' interpreter (PEERS_PYTHON), in a
    child process bounded by ``timeout`` + 60 seconds: (enqueue jobs/s, end-to-end jobs/s).
    Raises RuntimeError when that interpreter is missing or the child fails."""
    if not Path(PEERS_PYTHON).exists():
        raise RuntimeError(f"no {PEERS_PYTHON}: `make bench` creates .venv-peers")
    proc = spawn(
        [PEERS_PYTHON, "-m", "bench.peers.runner", name, url, str(n), str(timeout)],
        cwd=ROOT,
        env=child_env(url),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        stop(proc)
        raise TimeoutError(f"{name} runner: no answer in {timeout + 60}s") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{name} runner exited with {proc.returncode}")
    answer = json.loads(out.strip().splitlines()[-1])
    return answer["enqueue"], answer["e2e"]


def peer_versions() -> dict[str, str | None]:
    """The peers' installed versions in their interpreter (empty when it is missing)."""
    if not Path(PEERS_PYTHON).exists():
        return {}
    code = (
        "import json\nfrom importlib import metadata as m\n"
        "def v(p):\n    try:\n        return m.version(p)\n    except Exception:\n"
        "        return None\n"
        f"print(json.dumps({{p: v(p) for p in {[*PEER_NAMES, 'redis']!r}}}))"
    )
    out = subprocess.run([PEERS_PYTHON, "-c", code], capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout) if out.returncode == 0 else {}


if __name__ == "__main__":
    interrupt_on_sigterm()  # stopped by bench/run.py: the peer's worker is stopped too
    _name, _url, _n, _timeout = sys.argv[1:5]
    _enq, _e2e = run_peer(PEERS[_name], _url, int(_n), float(_timeout))
    print(json.dumps({"enqueue": _enq, "e2e": _e2e}), flush=True)
