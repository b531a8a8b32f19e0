"""``python -m example_project.run``: the whole demo stack under one parent (``make demo``).

    python -m example_project.run                    # fake agent, http://127.0.0.1:8000/
    python -m example_project.run --agent http       # an in-house agent behind HTTP
    python -m example_project.run --agent opencode   # the real `opencode serve`
    python -m example_project.run --agent langgraph  # a LangGraph Agent Server (langgraph dev)
    python -m example_project.run --smoke            # scripted run, a table, exit 0/1

Starts an embedded Valkey (unless ``OUTBOX_VALKEY_URL`` is set), the agent, migrates
SQLite, creates the demo users, then runs uvicorn and one ``outbox_worker`` until
Ctrl-C or SIGTERM, when it stops them all (worker first). Data lives in ``var/demo/``
(git-ignored); the smoke run uses its own fresh ``var/demo/smoke/``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .stack import AGENTS, DEFAULT_DATA_DIR, Stack, StackError, pid_alive

#: Timings for the smoke run: short leases and backoffs so a killed worker's session is
#: recovered in seconds, and verification starts soon after an ambiguous outcome.
SMOKE_OUTBOX: dict[str, Any] = {
    "LOCK_TTL": 2,
    "RETRY_BACKOFF": 0.2,
    "MAX_BACKOFF": 1,
    "VERIFY_DELAY": 0.3,
    "VERIFY_BACKOFF": 0.3,
    "MAX_VERIFY_BACKOFF": 1,
    "TICK": 0.25,
    "DELIVERY_TIMEOUT": 20,
}
#: With the real opencode (no LLM provider) every turn hangs: time out fast, then verify.
OPENCODE_OUTBOX: dict[str, Any] = {"DELIVERY_TIMEOUT": 10}
SMOKE_DEADLINE = 110.0  # seconds for the scripted client, start-up excluded


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.run", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument(
        "--agent",
        choices=AGENTS,
        default="fake",
        help="the fake opencode-compatible agent (default), an in-house agent behind HTTP "
        "(django_outbox.delivery.http), the real `opencode serve`, or a LangGraph Agent "
        "Server (`langgraph dev`, a graph that echoes)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="drive the stack with a scripted client and exit"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="web port (default 8000; --smoke: a free one)"
    )
    parser.add_argument("--data-dir", type=Path, default=None, help="default var/demo")
    parser.add_argument(
        "--latency",
        type=float,
        default=None,
        help="seconds the fake agent thinks per prompt (default 2; --smoke 0.15)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=SMOKE_DEADLINE,
        help=f"--smoke: seconds the scripted run may take (default {SMOKE_DEADLINE:.0f})",
    )
    return parser.parse_args(argv)


def _sigterm_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(stack: Stack) -> None:
    """Stop the stack; a second Ctrl-C/SIGTERM meanwhile kills the children at once."""

    def kill_now(signum: int, frame: Any) -> None:
        print("\ndemo: killing everything now", flush=True)
        for child in list(stack.children.values()):
            child.signal_group(signal.SIGKILL)

    signal.signal(signal.SIGINT, kill_now)
    signal.signal(signal.SIGTERM, kill_now)
    stack.stop()


def banner(stack: Stack) -> str:
    agent = (
        f"fake opencode agent {stack.agent_url} (fault knobs on the page)"
        if stack.agent == "fake"
        else f"in-house HTTP agent {stack.agent_url} (Idempotency-Key, verify and abort URLs; "
        "fault knobs on the page)"
        if stack.agent == "http"
        else f"langgraph dev {stack.agent_url} (graph 'echo'; a prompt 'sleep 5' thinks 5 s)"
        if stack.agent == "langgraph"
        else f"opencode serve {stack.agent_url} (no LLM provider: every turn times out after "
        f"{stack.outbox.get('DELIVERY_TIMEOUT')}s and is verified)"
    )
    return "\n".join(
        [
            "",
            "django-outbox demo is running:",
            f"  open    {stack.web_url}/    log in as demo / demo (member of workspace 'demo')",
            f"  admin   {stack.web_url}/admin/    admin / admin",
            f"  agent   {agent}",
            f"  Valkey  {stack.valkey_url}    data in {stack.data_dir}",
            "Ctrl-C stops everything.",
            "",
        ]
    )


def serve(stack: Stack) -> int:
    """Run until Ctrl-C / SIGTERM (0) or until a child dies (1)."""
    stack.start()
    print(banner(stack), flush=True)
    try:
        while True:
            dead = stack.dead_child()
            if dead is not None:
                print(
                    f"demo: {dead.name} exited unexpectedly ({dead.proc.returncode}); stopping",
                    flush=True,
                )
                return 1
            time.sleep(0.25)
    except KeyboardInterrupt:
        print("\ndemo: stopping (worker first) ...", flush=True)
        return 0
    finally:
        _stop(stack)


def smoke(stack: Stack, deadline: float) -> int:
    """Start the stack, run the scripted client, print its table; 0 if nothing went wrong."""
    from .smoke import run_smoke

    started = time.monotonic()
    stack.start()
    stack.say(f"stack up in {time.monotonic() - started:.1f}s; running the smoke script")
    try:
        ok = asyncio.run(run_smoke(stack, deadline=deadline))
    except KeyboardInterrupt:
        print("\ndemo: smoke run interrupted", flush=True)
        return 130
    finally:
        _stop(stack)
    if not ok:
        print(f"demo: logs of the run are in {stack.data_dir / 'logs'}", flush=True)
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    # Ctrl-C and SIGTERM both mean "stop everything, worker first". SIGINT is set
    # explicitly: a parent (a non-interactive shell's `&`) may have left it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    outbox: dict[str, Any] = {}
    if args.smoke:
        outbox.update(SMOKE_OUTBOX)
    if args.agent == "opencode":
        outbox.update(OPENCODE_OUTBOX)
    data_dir = args.data_dir or (DEFAULT_DATA_DIR / "smoke" if args.smoke else DEFAULT_DATA_DIR)
    if args.smoke:
        _fresh(data_dir)
    latency = args.latency
    if latency is None and args.smoke:
        latency = 0.15
    stack = Stack(
        data_dir=data_dir,
        agent=args.agent,
        port=(0 if args.smoke else 8000) if args.port is None else args.port,
        quiet=args.smoke,
        outbox=outbox,
        agent_latency=latency,
        worker_tick=outbox.get("TICK"),
    )
    try:
        return smoke(stack, args.deadline) if args.smoke else serve(stack)
    except StackError as exc:
        print(f"demo: {exc}", file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        return 130


def _fresh(data_dir: Path) -> None:
    """Empty the smoke run's data folder (refusing while another run uses it)."""
    lock = data_dir / "demo.pid"
    try:
        pid = int(lock.read_text().strip())
    except (OSError, ValueError):
        pid = 0
    if pid and pid != os.getpid() and pid_alive(pid):
        raise SystemExit(f"demo: another run (pid {pid}) uses {data_dir}")
    shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
