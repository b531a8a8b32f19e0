"""Worker measurements for issue 3: wake latency, throughput, idle cost, long turns.

Usage: python bench/worker_bench.py {latency|throughput|idle|long} [--url URL]
Starts outbox_worker processes (bench.settings) against the given Valkey (persistence
off recommended) and prints one line of figures. Every loop is bounded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench import common  # noqa: E402


def worker(url: str, *args: str, **env: str) -> subprocess.Popen:
    """One ``outbox_worker`` process (bench.settings), recorded in common.CHILDREN."""
    return common.spawn(
        [sys.executable, "-m", "django", "outbox_worker", "-v", "0", *args],
        cwd=ROOT,
        env=common.child_env(url, **env),
    )


def stop(proc: subprocess.Popen) -> None:
    """Stop a worker: SIGTERM, SIGKILL after 60 s."""
    common.stop(proc, 60)


def wait(predicate, timeout, interval=0.01):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(interval)


def outbox(url):
    from django_outbox.core.service import Outbox

    return Outbox(url=url, cap=10_000, user_max_queued=0, user_accepts_per_minute=0)


def latency(url, n=500):
    r = redis.Redis.from_url(url)
    r.flushall()
    ob = outbox(url)
    ob.load_scripts()
    proc = worker(url, BENCH_DELIVERER="bench.agents.stamp")
    wait(lambda: r.zcard("outboxworkers") == 1, 30)
    time.sleep(1.0)
    for i in range(n):
        t = time.time()
        ob.accept("w1", f"s{i % 50}", user_id="u", client_message_id=f"k{i}", text=f"{t}")
        time.sleep(0.01)
    wait(lambda: r.llen("bench:called") >= n, 30)
    stop(proc)
    lat = sorted(
        (float(called) - float(accepted)) * 1000
        for accepted, called in (x.decode().split() for x in r.lrange("bench:called", 0, -1))
    )
    p50, p99 = lat[len(lat) // 2], lat[int(len(lat) * 0.99) - 1]
    print(f"wake_latency n={n} p50={p50:.2f}ms p99={p99:.2f}ms max={lat[-1]:.2f}ms")
    return p50, p99


def throughput(url, sessions=1000, per=20, workers=1, events="1", watched=False):
    r = redis.Redis.from_url(url)
    r.flushall()
    ob = outbox(url)
    ob.load_scripts()
    pipe_batch = []
    for n in range(per):
        for s in range(sessions):
            pipe_batch.append((f"s{s}", n))
    for ses, n in pipe_batch:
        ob.accept("w1", ses, user_id="u", client_message_id=f"k{n}", text="x" * 100)
    total = sessions * per
    if watched:  # every session has a WebSocket client: every event is published
        for s in range(sessions):
            r.set(f"outboxwatch:{{w1}}:s{s}", 1)
    r.delete("outboxwake")
    before = r.info("commandstats")
    procs = [worker(url, "--concurrency", "256", BENCH_EVENTS=events) for _ in range(workers)]
    started = None
    deadline = time.monotonic() + 300
    while True:
        remaining = r.zcount("outboxdue:{w1}", "-inf", common.due_horizon_ms())
        if (started is None and r.exists("outboxlock:{w1}:s0")) or (
            started is None and remaining < sessions
        ):
            started = time.monotonic()
        queued = 0
        if started is not None:
            pipe = r.pipeline(transaction=False)
            for s in range(0, sessions, 50):
                pipe.llen(f"outboxq:{{w1}}:s{s}")
            queued = sum(pipe.execute())
            if queued == 0 and remaining == 0:
                break
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    for p in procs:
        stop(p)
    after = r.info("commandstats")
    calls = sum(v["calls"] for v in after.values()) - sum(v["calls"] for v in before.values())
    rate = total / elapsed
    print(
        f"deliver workers={workers} events={events} watched={watched} messages={total} "
        f"seconds={elapsed:.2f} "
        f"rate={rate:.0f}/s valkey_cmds_per_msg={calls / total:.1f}"
    )
    return rate


def idle(url, sessions=100_000, seconds=30):
    r = redis.Redis.from_url(url)
    r.flushall()
    ob = outbox(url)
    ob.load_scripts()
    from django_outbox.core.entry import Entry, format_time, new_entry_id

    now = int(time.time() * 1_000_000)
    pipe = ob.client.pipeline(transaction=False)
    keys_ws = "w1"
    for s in range(sessions):
        status = "error" if s % 2 else "parked"
        e = Entry(
            id=new_entry_id(),
            client_message_id=f"k{s}",
            user_id="u",
            text="x",
            accepted_at=format_time(now),
            status=status,
            reason="max_attempts" if status == "error" else "hold",
            parked_from="pending" if status == "parked" else None,
        )
        call = ob._session_eval(
            "accept",
            keys_ws,
            f"s{s}",
            extra_args=[e.to_json(), e.id, "", 0, 0, "", "queue"],
            extra_keys=[ob.keys.dedupe(keys_ws, f"s{s}", "-")],
        )
        pipe.evalsha(ob.scripts["accept"].sha, len(call.keys), *call.keys, *call.args)
        if s % 1000 == 999:
            pipe.execute()
            pipe = ob.client.pipeline(transaction=False)
    pipe.execute()
    proc = worker(url, "--tick", "1")
    wait(lambda: r.zcard("outboxworkers") == 1, 30)
    # Idle is the steady state: after the worker's start-up work, whose last part is the
    # dashboard's first depth sample (it walks every session once; later minutes without
    # changes reuse it: django_outbox.core.history).
    wait(lambda: r.exists("outboxhistdepth"), 120)
    time.sleep(2)

    def cpu():
        with open(f"/proc/{proc.pid}/stat") as f:
            parts = f.read().split()
        return (int(parts[13]) + int(parts[14])) / os.sysconf("SC_CLK_TCK")

    c0, s0 = cpu(), r.info("commandstats")
    t0 = time.monotonic()
    time.sleep(seconds)
    c1, s1 = cpu(), r.info("commandstats")
    elapsed = time.monotonic() - t0
    stop(proc)
    calls = sum(v["calls"] for v in s1.values()) - sum(v["calls"] for v in s0.values())
    calls -= 1  # our own INFO
    print(
        f"idle sessions={sessions} seconds={elapsed:.1f} cpu={100 * (c1 - c0) / elapsed:.2f}% "
        f"valkey_cmds_per_s={calls / elapsed:.1f}"
    )


def long_turns(url, n=5000, sleep=10):
    r = redis.Redis.from_url(url)
    r.flushall()
    ob = outbox(url)
    ob.load_scripts()
    for i in range(n):
        ob.accept("w1", f"s{i}", user_id="u", client_message_id="k", text="x")
    t0 = time.monotonic()
    proc = worker(
        url,
        "--concurrency",
        str(n),
        BENCH_DELIVERER="bench.agents.sleep10",
        BENCH_SLEEP=str(sleep),
        BENCH_EVENTS="0",
    )
    peak = 0
    while True:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    peak = max(peak, int(line.split()[1]))
        if (
            r.zcount("outboxdue:{w1}", "-inf", common.due_horizon_ms()) == 0
            and r.zcard("outboxworkers") == 1
        ):
            pipe = r.pipeline(transaction=False)
            for i in range(0, n, 100):
                pipe.exists(f"outboxq:{{w1}}:s{i}", f"outboxd:{{w1}}:s{i}")
            if sum(pipe.execute()) == 0:
                break
        if time.monotonic() - t0 > 120:
            raise SystemExit("timed out")
        time.sleep(0.2)
    elapsed = time.monotonic() - t0
    stop(proc)
    print(f"long_turns n={n} sleep={sleep}s done_in={elapsed:.1f}s peak_rss={peak / 1024:.0f}MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["latency", "throughput", "throughput2", "idle", "long"])
    parser.add_argument("--url", default="redis://127.0.0.1:6411/0")
    parser.add_argument("--events", default="1")
    parser.add_argument("--watched", action="store_true")
    a = parser.parse_args()
    if a.what == "latency":
        latency(a.url)
    elif a.what == "throughput":
        throughput(a.url, events=a.events, watched=a.watched)
    elif a.what == "throughput2":
        throughput(a.url, workers=2, events=a.events, watched=a.watched)
    elif a.what == "idle":
        idle(a.url)
    else:
        long_turns(a.url)
