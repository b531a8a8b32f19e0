"""The measurements of ``make bench`` (but the peer queues, in bench/peers/runner.py): raw
EVALSHA and our accept, in process and over HTTP; delivery, wake latency, idle cost and long
turns (bench/worker_bench.py's, with its printed figures); Valkey memory per queued message.

Each one flushes the server first and returns its figure(s): a rate per second, or the tuple
its docstring names. A failure raises; bench/report.py's ``Recorder`` records it as missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio

from bench import worker_bench
from bench.common import PAYLOAD, ROOT, child_env, logger, reap_children, stop
from django_outbox.testing import free_port, wait_until

#: The reference for one accept: what our accept script writes at the least, without checks.
RAW = (
    "redis.call('RPUSH', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[2]); "
    "redis.call('EXPIRE', KEYS[3], 60); return 1"
)
TASKS = 64  #: calls in flight at once in the async measurements

log = logger("bench")


def flushall(url: str) -> None:
    """Empty the server."""
    client = redis.Redis.from_url(url)
    client.flushall()
    client.close()


# --- raw EVALSHA and our accept, in process ----------------------------------------------


def raw_sync(url: str, n: int) -> float:
    """``n`` EVALSHA calls of RAW, one after the other: calls/s."""
    client = redis.Redis.from_url(url)
    client.flushall()
    sha = client.script_load(RAW)
    t = time.perf_counter()
    for i in range(n):
        client.evalsha(sha, 3, f"q{i % 1000}", f"m{i}", f"q{i % 1000}", PAYLOAD, "v")
    rate = n / (time.perf_counter() - t)
    client.close()
    return rate


def raw_async(url: str, n: int) -> float:
    """``n`` EVALSHA calls of RAW, TASKS at once: calls/s."""

    async def run():
        client = redis.asyncio.Redis.from_url(url)
        await client.flushall()
        sha = await client.script_load(RAW)
        sem = asyncio.Semaphore(TASKS)

        async def one(i):
            async with sem:
                await client.evalsha(sha, 3, f"q{i % 1000}", f"m{i}", f"q{i % 1000}", PAYLOAD, "v")

        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        rate = n / (time.perf_counter() - t)
        await client.aclose()
        return rate

    return asyncio.run(run())


def _outbox(url: str):
    from django_outbox.core.service import Outbox

    ob = Outbox(url=url, cap=10**6, user_max_queued=0, user_accepts_per_minute=0)
    ob.load_scripts()
    return ob


def accept_sync(url: str, n: int) -> float:
    """``n`` accepts over 10 workspaces and 1000 sessions, one after the other: accepts/s."""
    flushall(url)
    ob = _outbox(url)
    t = time.perf_counter()
    for i in range(n):
        ob.accept(
            f"w{i % 10}", f"s{i % 1000}", user_id="u", client_message_id=f"k{i}", text=PAYLOAD
        )
    rate = n / (time.perf_counter() - t)
    ob.close()
    return rate


def accept_async(url: str, n: int) -> float:
    """``n`` accepts as accept_sync, TASKS at once: accepts/s."""
    flushall(url)
    ob = _outbox(url)

    async def run():
        sem = asyncio.Semaphore(TASKS)

        async def one(i):
            async with sem:
                await ob.aaccept(
                    f"w{i % 10}",
                    f"s{i % 1000}",
                    user_id="u",
                    client_message_id=f"a{i}",
                    text=PAYLOAD,
                )

        t = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        rate = n / (time.perf_counter() - t)
        await ob.aclose()
        return rate

    rate = asyncio.run(run())
    ob.close()
    return rate


def memory_per_message(url: str, n: int = 10_000, sessions: int = 100) -> tuple[float, float]:
    """Valkey used_memory and DBSIZE growth per queued 1 KiB message: (bytes, keys).

    ``n`` messages over ``sessions`` sessions in 10 workspaces: 100 sessions hold n/100
    messages each; ``sessions=n`` is one message per session.
    """
    client = redis.Redis.from_url(url)
    client.flushall()
    ob = _outbox(url)
    text = "m" * 1024
    time.sleep(0.2)
    before, keys_before = client.info("memory")["used_memory"], client.dbsize()
    for i in range(n):
        ob.accept(
            f"w{i % 10}", f"s{i % sessions}", user_id="u", client_message_id=f"k{i}", text=text
        )
    after, keys_after = client.info("memory")["used_memory"], client.dbsize()
    ob.close()
    client.flushall()
    client.close()
    return (after - before) / n, (keys_after - keys_before) / n


# --- over HTTP -----------------------------------------------------------------------------


class HttpServer:
    """uvicorn (one process) serving bench.httpproject: our accept API and a baseline view."""

    def __init__(self, url: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(  # long-lived: stopped by close(), not reap_children()
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.httpproject.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--no-access-log",
                "--log-level",
                "warning",
                "--lifespan",
                "off",
            ],
            cwd=ROOT,
            env=child_env(url, DJANGO_SETTINGS_MODULE="bench.httpproject.settings"),
        )

        def up():
            if self.proc.poll() is not None:
                raise RuntimeError("uvicorn exited")
            try:
                import httpx

                return httpx.post(f"{self.base}/baseline/", content=b"x", timeout=1).status_code
            except Exception:
                return False

        wait_until(up, 30, 0.1, "uvicorn answers")

    def close(self) -> None:
        stop(self.proc)


def http_rate(
    base: str, path_of: Callable[[int], str], body_of: Callable[[int], bytes], n: int, clients: int
) -> tuple[float, int]:
    """POST ``n`` requests (the i-th to ``path_of(i)`` with ``body_of(i)``) from ``clients``
    keep-alive connections, after one warm-up request each: (requests/s, answers >= 300)."""
    import httpx

    async def run():
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        errors = 0
        counter = iter(range(n))
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:
            # warm-up: open every connection, import every view
            await asyncio.gather(
                *(
                    client.post(
                        path_of(-1 - j),
                        content=body_of(-1 - j),
                        headers={"content-type": "application/json"},
                    )
                    for j in range(clients)
                )
            )

            async def loop():
                nonlocal errors
                for i in counter:
                    r = await client.post(
                        path_of(i), content=body_of(i), headers={"content-type": "application/json"}
                    )
                    if r.status_code >= 300:
                        errors += 1
                        if errors == 1:
                            log(f"HTTP {r.status_code}: {r.text[:300]}")

            t = time.perf_counter()
            await asyncio.gather(*(loop() for _ in range(clients)))
            return n / (time.perf_counter() - t), errors

    return asyncio.run(run())


def _post_prompts(
    url: str,
    server: HttpServer,
    path_of: Callable[[int], str],
    n: int,
    clients: int,
    tag: str,
    what: str,
) -> float:
    flushall(url)

    def body_of(i):
        return json.dumps({"clientMessageID": f"{tag}-{i}", "text": PAYLOAD}).encode()

    rate, errors = http_rate(server.base, path_of, body_of, n, clients)
    if errors:
        raise RuntimeError(f"{errors} of {n} {what} requests failed")
    return rate


def accept_http(url: str, server: HttpServer, n: int, clients: int, tag: str) -> float:
    """``n`` prompts POSTed to our accept API over 1000 sessions: requests/s."""
    return _post_prompts(
        url,
        server,
        lambda i: f"/outbox/api/workspaces/w1/sessions/s{i % 1000}/messages/",
        n,
        clients,
        tag,
        "accept",
    )


def http_baseline(url: str, server: HttpServer, n: int, clients: int, tag: str) -> float:
    """``n`` prompts POSTed to the baseline view (a bare Django view doing one SET):
    requests/s."""
    return _post_prompts(
        url, server, lambda i: f"/baseline/?k={i % 1000}", n, clients, tag, "baseline"
    )


# --- worker processes (bench/worker_bench.py) ---------------------------------------------


def captured(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[str, Any]:
    """Run a worker_bench function; echo and return what it printed, plus its result."""
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            result = fn(*args, **kw)
    except SystemExit as exc:  # worker_bench's bounded waits end with SystemExit
        raise TimeoutError(f"{fn.__name__}: {exc} ({buf.getvalue().strip()})") from None
    finally:
        reap_children()
    text = buf.getvalue().strip()
    log(f"  {text}")
    return text, result


def deliver(url: str, sessions: int, per: int, workers: int) -> float:
    """Deliver ``sessions`` x ``per`` queued messages with ``workers`` processes: messages/s."""
    _, rate = captured(worker_bench.throughput, url, sessions=sessions, per=per, workers=workers)
    return rate


def wake_latency(url: str, n: int) -> tuple[float, float]:
    """Accept to delivery call of ``n`` prompts on an idle worker: (p50, p99) in ms."""
    _, (p50, p99) = captured(worker_bench.latency, url, n=n)
    return p50, p99


def idle_cost(url: str, sessions: int, seconds: int) -> tuple[float, float]:
    """A worker over ``sessions`` parked and failed sessions, idle for ``seconds``:
    (CPU in % of a core, Valkey commands/s)."""
    text, _ = captured(worker_bench.idle, url, sessions=sessions, seconds=seconds)
    cpu = float(re.search(r"cpu=([\d.]+)%", text).group(1))
    cmds = float(re.search(r"valkey_cmds_per_s=([\d.]+)", text).group(1))
    return cpu, cmds


def long_turns(url: str, n: int, sleep: float) -> tuple[float, float]:
    """``n`` sessions whose delivery takes ``sleep`` seconds, all at once in one worker:
    (seconds until all are done, peak RSS in MB)."""
    text, _ = captured(worker_bench.long_turns, url, n=n, sleep=sleep)
    done = float(re.search(r"done_in=([\d.]+)s", text).group(1))
    rss = float(re.search(r"peak_rss=([\d.]+)MB", text).group(1))
    return done, rss
