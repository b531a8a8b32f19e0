"""`make bench-cluster`: delivery on a local Valkey Cluster next to one valkey-server (issue 8).

Usage: python -m bench.cluster_bench [--quick] [--repeats N] [--workers 1,2,4]
                                     [--workspaces W] [--sessions S] [--per P]
                                     [--concurrency C] [--timeout SECONDS]

Starts, in a temporary directory, a Valkey Cluster of 3 masters with one replica each
(tests/support/cluster.py; appendonly no, save "") and one standalone valkey-server
(django_outbox.testing),
both on loopback. One small fill and drain on each store first is a warm-up (not kept). Then,
for every round and worker count, on each store in turn (the order flips every time so machine
drift cancels): FLUSHALL; accept W x S x P messages of 100 bytes (W workspaces, S sessions
each, P messages per session; async, 64 at once); read Valkey memory and keys per queued
message (summed over the masters); delete the wake lists (as bench/worker_bench.py does: the
workers find the backlog by scanning); start N ``outbox_worker`` processes (bench.settings;
BENCH_CLUSTER=1 on the cluster; BENCH_EVENTS=0 on both stores, since channels-redis does not
support Valkey Cluster; --concurrency 64 each, the product default) and measure messages/s
from the first claim to the last entry delivered.

The first claim is taken as the moment the first worker registers (its heartbeat is written
right before its first scan); the end is the first poll (every 50 ms) that finds every session's
queue and staging list empty. The workers start at slightly different times, so "all up" also
gives the rate from the moment the last of them registered, over what was left then.

Prints one line per measurement and writes bench/results/cluster-latest.json and .md. Every
wait is bounded; every process started here is stopped on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench.common import (  # noqa: E402
    PAYLOAD,
    RESULTS,
    child_env,
    fmt,
    interrupt_on_sigterm,
    logger,
    reap_children,
    run_meta,
    server_version,
    spawn,
    stop,
    write_results,
)
from django_outbox.testing import ValkeyServer, wait_until  # noqa: E402
from tests.support.cluster import ValkeyCluster  # noqa: E402

ACCEPT_TASKS = 64
# Sessions delivered at once per worker process: the product default (CONCURRENCY = 64).
# Not bench/worker_bench.py's 256: on a cluster, the worker's async RedisCluster client
# (max_connections 128 per node) raises MaxConnectionsError once more commands than that are
# in flight on one node, and 256 sessions at once get there (--concurrency 256 shows it).
CONCURRENCY = 64
POLL = 0.05  # seconds between completion polls
SAMPLE_EVERY = 20  # the cheap poll reads the queues of every 20th workspace

log = logger("cluster-bench")


def start_worker(url: str, concurrency: int, **env: str) -> subprocess.Popen:
    """One ``outbox_worker`` process (bench.settings); its stdout (the final stats) is dropped,
    its stderr (warnings, errors) is not."""
    args = ["outbox_worker", "-v", "0", "--concurrency", str(concurrency)]
    return spawn(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env=child_env(url, **env),
        stdout=subprocess.DEVNULL,
    )


class Store:
    """One Valkey deployment under test: a standalone server or a cluster."""

    def __init__(self, name: str, url: str, master_ports: list[int], cluster: bool) -> None:
        self.name = name
        self.url = url
        self.cluster = cluster
        self.masters = [
            redis.Redis(host="127.0.0.1", port=p, socket_timeout=10) for p in master_ports
        ]

    def client(self):
        if self.cluster:
            return RedisCluster.from_url(self.url, socket_timeout=10)
        return redis.Redis.from_url(self.url, socket_timeout=10)

    def flush(self) -> None:
        for m in self.masters:
            m.flushall()

    def dbsize(self) -> int:
        return sum(m.dbsize() for m in self.masters)

    def memory(self) -> tuple[int, int]:
        """(used_memory, used_memory less replication buffers), summed over the masters.

        On a cluster the replication buffer grows with the write stream up to the backlog
        size: a fixed cost per master, not a cost per queued message.
        """
        raw = data = 0
        for m in self.masters:
            info = m.info("memory")
            repl = info.get("mem_total_replication_buffers")
            if repl is None:
                repl = info.get("mem_replication_backlog", 0) + info.get("mem_clients_slaves", 0)
            raw += info["used_memory"]
            data += info["used_memory"] - repl
        return raw, data

    def calls(self) -> int:
        """Commands executed so far, summed over the masters (INFO commandstats)."""
        return sum(sum(v["calls"] for v in m.info("commandstats").values()) for m in self.masters)

    def close(self) -> None:
        for m in self.masters:
            m.close()


def accept_all(store: Store, shape: tuple[int, int, int], timeout: float) -> float:
    """Accept every message of the shape; return accepts/s."""
    from django_outbox.core.service import Outbox

    workspaces, sessions, per = shape
    ob = Outbox(
        url=store.url,
        cluster=store.cluster,
        cap=10**6,
        user_max_queued=0,  # one synthetic user sends the whole load
        user_accepts_per_minute=0,
    )
    ob.load_scripts()

    async def run():
        sem = asyncio.Semaphore(ACCEPT_TASKS)

        async def one(w, s, n):
            async with sem:
                await ob.aaccept(
                    f"w{w}", f"s{s}", user_id="u", client_message_id=f"k{n}", text=PAYLOAD
                )

        t = time.perf_counter()
        await asyncio.wait_for(
            asyncio.gather(
                *(
                    one(w, s, n)
                    for n in range(per)
                    for w in range(workspaces)
                    for s in range(sessions)
                )
            ),
            timeout,
        )
        rate = workspaces * sessions * per / (time.perf_counter() - t)
        await ob.aclose()
        return rate

    try:
        return asyncio.run(run())
    finally:
        ob.close()


def wake_keys(store: Store) -> list[str]:
    from django_outbox.core.service import Outbox

    return Outbox(url=store.url, cluster=store.cluster).keys.index_keys("wake")


class Counter:
    """Reads queue + staging lengths; counts the commands it sends (to leave them out)."""

    def __init__(self, client, shape: tuple[int, int, int]) -> None:
        self.client = client
        workspaces, sessions, _ = shape
        every = [(w, s) for w in range(workspaces) for s in range(sessions)]
        self.full_keys = [
            k for w, s in every for k in (f"outboxq:{{w{w}}}:s{s}", f"outboxd:{{w{w}}}:s{s}")
        ]
        self.sample_keys = [f"outboxq:{{w{w}}}:s{s}" for w, s in every if w % SAMPLE_EVERY == 0]
        self.sent = 0

    def _count(self, keys: list[str]) -> int:
        pipe = self.client.pipeline(transaction=False)
        for k in keys:
            pipe.llen(k)
        self.sent += len(keys)
        return sum(pipe.execute())

    def full(self) -> int:
        return self._count(self.full_keys)

    def sample(self) -> int:
        return self._count(self.sample_keys)

    def workers(self) -> int:
        self.sent += 1
        return self.client.zcard("outboxworkers")


def deliver(
    store: Store, shape: tuple[int, int, int], workers: int, concurrency: int, timeout: float
) -> dict:
    """One measurement: fill, then drain with ``workers`` processes. Returns its figures."""
    workspaces, sessions, per = shape
    total = workspaces * sessions * per
    store.flush()
    time.sleep(0.2)
    client = store.client()
    keys0, (mem0, data0) = store.dbsize(), store.memory()
    accept_rate = accept_all(store, shape, timeout)
    time.sleep(0.3)  # let replication buffers and lazy frees settle
    keys1, (mem1, data1) = store.dbsize(), store.memory()
    for key in wake_keys(store):
        client.delete(key)
    counter = Counter(client, shape)
    if counter.full() != total:
        raise RuntimeError(f"expected {total} queued entries, found {counter.full()}")
    calls0 = store.calls()
    counter.sent = 0
    env = {"BENCH_EVENTS": "0", "BENCH_CLUSTER": "1" if store.cluster else "0"}
    procs = []
    for _ in range(workers):
        procs.append(start_worker(store.url, concurrency, **env))
    deadline = time.monotonic() + timeout
    first = all_up = None
    left_all_up = total
    try:
        while True:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a worker exited: " + str([p.returncode for p in procs]))
            if time.monotonic() > deadline:
                raise TimeoutError(f"not drained within {timeout}s ({counter.full()} left)")
            if all_up is None:
                up = counter.workers()
                now = time.monotonic()
                if first is None and up:
                    first = now
                if up >= workers and workers == 1:
                    all_up = first
                elif up >= workers:  # what was left when the last one registered
                    left_all_up = counter.full()
                    all_up = (now + time.monotonic()) / 2
                if first is None or all_up is None:
                    time.sleep(0.005)
                    continue
            time.sleep(POLL)
            if counter.sample() == 0 and counter.full() == 0:
                end = time.monotonic()
                break
    finally:
        for p in procs:
            stop(p)
    calls1 = store.calls()
    client.close()
    store.flush()
    # our own commands: the polls, and the INFO per master that read calls0
    own = counter.sent + len(store.masters)
    seconds = end - first
    return {
        "messages": total,
        "accept_rate": accept_rate,
        "rate": total / seconds,
        "seconds": seconds,
        "rate_all_up": left_all_up / (end - all_up) if end > all_up else None,
        "stagger": all_up - first,
        "cmds_per_message": (calls1 - calls0 - own) / total,
        "bytes_per_message": (data1 - data0) / total,
        "raw_bytes_per_message": (mem1 - mem0) / total,
        "keys_per_message": (keys1 - keys0) / total,
    }


def line(store: str, workers: int, r: dict) -> str:
    up = "—" if r["rate_all_up"] is None else f"{r['rate_all_up']:,.0f}/s"
    return (
        f"{store} workers={workers} messages={r['messages']} accept={r['accept_rate']:,.0f}/s "
        f"deliver={r['rate']:,.0f}/s seconds={r['seconds']:.2f} all_up={up} "
        f"stagger={r['stagger']:.2f}s cmds/msg={r['cmds_per_message']:.1f} "
        f"bytes/msg={r['bytes_per_message']:,.0f} (raw {r['raw_bytes_per_message']:,.0f}) "
        f"keys/msg={r['keys_per_message']:.2f}"
    )


FIGURES = (
    "rate",
    "rate_all_up",
    "accept_rate",
    "cmds_per_message",
    "bytes_per_message",
    "raw_bytes_per_message",
    "keys_per_message",
    "stagger",
)


def med(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def bounded(
    store: Store, shape: tuple[int, int, int], workers: int, timeout: float, sleep: float = 0.02
) -> float:
    """Issue 21's scaling run on ``store``: ``workers`` processes of ``--concurrency 8`` with an
    agent that sleeps ``sleep`` s per delivery (bench.agents.sleep_stamp), all registered
    before the messages of ``shape`` are accepted; messages/s from the first delivery done to
    the last. The processes mostly sleep, so this measures coordination, not CPU."""
    store.flush()
    client = store.client()
    env = {
        "BENCH_EVENTS": "0",
        "BENCH_CLUSTER": "1" if store.cluster else "0",
        "BENCH_DELIVERER": "bench.agents.sleep_stamp",
        "BENCH_SLEEP": str(sleep),
    }
    procs = [start_worker(store.url, 8, **env) for _ in range(workers)]
    total = shape[0] * shape[1] * shape[2]
    try:
        wait_until(lambda: client.zcard("outboxworkers") == workers, 120, 0.05, "workers up")
        accept_all(store, shape, timeout)
        wait_until(lambda: client.llen("bench:done") >= total, timeout, 0.05, "all delivered")
        done = [x.decode().split() for x in client.lrange("bench:done", 0, -1)]
    finally:
        for p in procs:
            stop(p)
        client.close()
        store.flush()
    times = sorted(float(t) for _, t in done)
    if len({pid for pid, _ in done}) < workers:
        raise RuntimeError(f"not every one of {workers} workers delivered")
    return (len(times) - 1) / (times[-1] - times[0])


def summarize_bounded(runs: dict[str, dict[int, list[float]]], worker_counts: list[int]) -> dict:
    """Medians of the bounded run per store and worker count, and each count's ratio to the
    first (``deliver_bounded_<n>w_vs_<base>w``, paired per round as in bench/run.py)."""
    out: dict = {}
    base = worker_counts[0]
    for store, by_n in runs.items():
        entry: dict = {f"{n}w": round(statistics.median(v), 1) for n, v in by_n.items() if v}
        for n in worker_counts[1:]:
            pairs = [x / y for x, y in zip(by_n.get(n, []), by_n.get(base, []), strict=False)]
            if pairs:
                entry[f"deliver_bounded_{n}w_vs_{base}w"] = round(statistics.median(pairs), 3)
        out[store] = entry
    return out


def summarize(runs: dict[str, dict[int, list[dict]]], worker_counts: list[int]) -> dict:
    out: dict = {"stores": {}, "ratios": {}}
    for store, by_n in runs.items():
        out["stores"][store] = {}
        for n, results in by_n.items():
            entry = {}
            for key in FIGURES:
                vals = [r[key] for r in results if r.get(key) is not None]
                if vals:
                    entry[key] = {
                        "median": round(statistics.median(vals), 3),
                        "min": round(min(vals), 3),
                        "max": round(max(vals), 3),
                    }
            entry["runs"] = results
            out["stores"][store][str(n)] = entry

    def paired(a: list[dict], b: list[dict]) -> dict | None:
        pairs = [x["rate"] / y["rate"] for x, y in zip(a, b, strict=False)]
        if not pairs:
            return None
        return {
            "value": round(statistics.median(pairs), 3),
            "min": round(min(pairs), 3),
            "max": round(max(pairs), 3),
        }

    base = worker_counts[0]
    for store, by_n in runs.items():
        for n in worker_counts[1:]:
            r = paired(by_n.get(n, []), by_n.get(base, []))
            if r:
                out["ratios"][f"{store}_{n}w_vs_{base}w"] = r
    for n in worker_counts:
        r = paired(runs.get("cluster", {}).get(n, []), runs.get("standalone", {}).get(n, []))
        if r:
            out["ratios"][f"cluster_vs_standalone_{n}w"] = r
    return out


def markdown(result: dict, meta: dict) -> str:
    w, s, p = meta["shape"]
    lines = [
        f"# django-outbox cluster benchmark — {meta['date']}",
        "",
        f"`python -m bench.cluster_bench {' '.join(meta['argv'])}` · {meta['cpus']} CPUs "
        f"(shared by every valkey-server and worker) · Python {meta['python']} · "
        f"valkey {meta['valkey']} · {meta['repeats']} round(s) · {meta['seconds']:.0f} s total",
        "",
        f"Shape: {w} workspaces x {s} sessions x {p} messages = {w * s * p:,} messages of "
        f"{len(PAYLOAD)} bytes. Cluster: 3 masters + 3 replicas, CLUSTER_SHARDS "
        f"{meta['cluster_shards']}, BENCH_CLUSTER=1. Both stores: persistence off, events off "
        f"(BENCH_EVENTS=0), noop deliverer, --concurrency {meta['concurrency']} per worker.",
        "",
        "| store | workers | deliver msg/s (median) | min | max | msg/s, all up | "
        "accepts/s | Valkey commands/msg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for store, by_n in result["stores"].items():
        for n, e in by_n.items():
            rate = e.get("rate", {})
            lines.append(
                f"| {store} | {n} | {fmt(rate.get('median'))} | {fmt(rate.get('min'))} | "
                f"{fmt(rate.get('max'))} | {fmt(e.get('rate_all_up', {}).get('median'))} | "
                f"{fmt(e.get('accept_rate', {}).get('median'))} | "
                f"{fmt(e.get('cmds_per_message', {}).get('median'))} |"
            )
    lines += [
        "",
        "msg/s, all up: from the moment the last worker registered, over what was left then. "
        "Valkey commands/msg: INFO commandstats on the masters during the drain, commands run "
        "inside scripts included, the benchmark's own polls left out.",
        "",
        "Valkey per queued message (medians over every fill, summed over the masters; bytes "
        "leave out the replication buffers, raw is plain used_memory):",
        "",
        "| store | bytes/msg | raw bytes/msg | keys/msg |",
        "|---|---:|---:|---:|",
    ]
    for store, by_n in result["stores"].items():
        fills = [r for e in by_n.values() for r in e["runs"]]
        lines.append(
            f"| {store} | {fmt(med([r['bytes_per_message'] for r in fills]))} | "
            f"{fmt(med([r['raw_bytes_per_message'] for r in fills]))} | "
            f"{fmt(med([r['keys_per_message'] for r in fills]))} |"
        )
    lines += ["", "| ratio (deliver msg/s, paired per round) | median | min | max |"]
    lines += ["|---|---:|---:|---:|"]
    for name, r in result["ratios"].items():
        lines.append(f"| {name} | {r['value']:.2f} | {r['min']:.2f} | {r['max']:.2f} |")
    if result.get("bounded"):
        lines += [
            "",
            "Bounded run (issue 21: --concurrency 8 per worker, an agent sleeping 20 ms, "
            "messages/s from the first delivery done to the last; coordination, not CPU):",
            "",
            "| store | figures |",
            "|---|---|",
        ]
        for store, entry in result["bounded"].items():
            figures = ", ".join(f"{k} {v}" for k, v in entry.items())
            lines.append(f"| {store} | {figures} |")
    if result["missing"]:
        lines += ["", "Missing:", ""]
        lines += [f"- {k}: {v}" for k, v in result["missing"].items()]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="50 workspaces, one round (~1 minute)")
    p.add_argument("--repeats", type=int, help="rounds (default 3; 1 with --quick)")
    p.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    p.add_argument("--workspaces", type=int, help="default 200 (50 with --quick)")
    p.add_argument("--sessions", type=int, default=5, help="sessions per workspace (default 5)")
    p.add_argument("--per", type=int, default=20, help="messages per session (default 20)")
    p.add_argument(
        "--concurrency",
        type=int,
        default=CONCURRENCY,
        help=f"sessions at once per worker process (default {CONCURRENCY})",
    )
    p.add_argument("--timeout", type=float, default=300, help="bound of each fill and drain (s)")
    p.add_argument(
        "--bounded",
        default="100,20,2",
        help="the bounded run's shape, workspaces,sessions,per (default 100,20,2; 0: skip it)",
    )
    a = p.parse_args(argv)
    repeats = a.repeats or (1 if a.quick else 3)
    shape = (a.workspaces or (50 if a.quick else 200), a.sessions, a.per)
    worker_counts = [int(x) for x in a.workers.split(",")]

    from django_outbox.core.config import Config

    started = time.monotonic()
    runs: dict[str, dict[int, list[dict]]] = {"cluster": {}, "standalone": {}}
    bounded_runs: dict[str, dict[int, list[float]]] = {}
    missing: dict[str, str] = {}
    interrupt_on_sigterm()
    valkey_version = None
    with tempfile.TemporaryDirectory(prefix="outbox-cluster-bench-") as tmp:
        cluster = ValkeyCluster(Path(tmp) / "cluster", appendonly="no", save="")
        single = ValkeyServer(Path(tmp) / "standalone", appendonly="no", save="")
        stores: list[Store] = []
        try:
            t = time.monotonic()
            cluster.start()
            single.start()
            log(f"cluster up in {time.monotonic() - t:.1f} s: {cluster.startup_url}")
            stores = [
                Store("cluster", cluster.startup_url, cluster.masters(), True),
                Store("standalone", single.url, [single.port], False),
            ]
            valkey_version = server_version(stores[1].masters[0].info("server"))
            log(
                f"valkey {valkey_version}; shape {shape}; workers {worker_counts} "
                f"x {a.concurrency}; {repeats} rounds"
            )
            for store in stores:  # a first fill and drain on a fresh store runs slow: not kept
                t = time.monotonic()
                try:
                    deliver(store, (20, shape[1], shape[2]), 1, a.concurrency, a.timeout)
                finally:
                    reap_children(log)
                log(f"{store.name}: warm-up fill and drain in {time.monotonic() - t:.1f} s")

            def measured(label: str, key: str, measure: Callable[[], Any]) -> Any:
                """``measure()``, or None (the failure logged and kept in ``missing``)."""
                try:
                    return measure()
                except Exception as exc:
                    reason = f"{type(exc).__name__}: {exc}"
                    log(f"{label}: FAILED {reason}")
                    missing[key] = reason
                    return None
                finally:
                    reap_children(log)

            i = 0
            for rnd in range(repeats):
                for n in worker_counts:
                    order = stores if i % 2 == 0 else stores[::-1]
                    i += 1
                    for store in order:
                        r = measured(
                            f"round {rnd + 1} {store.name} workers={n}",
                            f"{store.name} {n}w round {rnd + 1}",
                            partial(deliver, store, shape, n, a.concurrency, a.timeout),
                        )
                        if r is None:
                            continue
                        runs[store.name].setdefault(n, []).append(r)
                        print(f"round {rnd + 1} {line(store.name, n, r)}", flush=True)
            bounded_shape = tuple(int(x) for x in a.bounded.split(","))
            for rnd in range(repeats if len(bounded_shape) == 3 else 0):
                for n in worker_counts:
                    for store in stores if rnd % 2 == 0 else stores[::-1]:
                        rate = measured(
                            f"bounded {rnd + 1} {store.name} workers={n}",
                            f"bounded {store.name} {n}w round {rnd + 1}",
                            partial(bounded, store, bounded_shape, n, a.timeout),
                        )
                        if rate is None:
                            continue
                        bounded_runs.setdefault(store.name, {}).setdefault(n, []).append(rate)
                        log(f"bounded {rnd + 1} {store.name} workers={n}: {rate:,.0f} msg/s")
        except KeyboardInterrupt:
            log("interrupted; writing what was measured")
        finally:
            reap_children(log)
            for store in stores:
                store.close()
            cluster.stop()
            single.stop()

    if not any(runs.values()):
        log(f"nothing measured; {RESULTS / 'cluster-latest.*'} left as it was")
        return 1
    result = summarize(runs, worker_counts)
    result["missing"] = missing
    result["bounded"] = summarize_bounded(bounded_runs, worker_counts)
    meta = run_meta(
        argv,
        started,
        valkey_version,
        repeats=repeats,
        shape=shape,
        workers=worker_counts,
        concurrency=a.concurrency,
        cluster_shards=Config().cluster_shards,
    )
    write_results("cluster-latest", result, meta, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
