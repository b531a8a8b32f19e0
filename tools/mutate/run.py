"""Mutation check (``make mutate``, README "Testing"): plant each mutant of
``tools/mutate/mutants.toml`` one at a time and run the tests mapped to it.

A mutant is a file, an exact snippet of it (found exactly once, or the run stops before
anything is planted: the list cannot rot silently), its replacement, a description and
the tests that should kill it. Each mutant is planted in a private copy of the tree (a
temporary directory; the working tree is never written, so Ctrl-C leaves nothing
behind), and its tests run there with ``-x -q -p no:randomly``: a failing test kills
it, a subset that passes lets it survive, a subset that outlasts ``--timeout`` seconds
kills it too (a planted hang). Mutants marked ``equivalent`` (with the reason) are
listed but not run, and left out of the kill rate.

Every kill is confirmed afterwards: the killing tests run together on the unmutated copy,
and a mutant whose killing test fails there too is reported ``error``, not killed (a test
broken on its own kills nothing). A whole run first runs the union of the mapped tests on
the unmutated copy (the baseline) so a broken suite stops it before an hour is spent;
``--only`` skips that (the confirmation covers its kills), ``--baseline`` asks for it.
The test that killed each mutant is remembered in ``build/mutate/killers.json`` and run
first the next time (the order only: the mutant still has to pass all its tests to
survive), so a kill costs one test rather than the file up to it.

Usage: python tools/mutate/run.py [--only ID ...] [--list] [--baseline | --no-baseline]
                                  [--timeout S]
Exit status: 0 when the kill rate reaches ``--target`` percent (default 95), else 1;
2 when the list is broken or the unmutated tree fails its tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MUTANTS = Path(__file__).resolve().parent / "mutants.toml"
#: What the copy holds: the package, its tests and what they load (the docs, README and
#: Makefile too: tests that read them would otherwise fail on every mutant and "kill" it).
COPIED = (
    "django_outbox",
    "tests",
    "example_project",
    "deploy",
    "docs",
    "README.md",
    "Makefile",
    "pyproject.toml",
)
PYTEST_FLAGS = ["-x", "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
#: Each mutant's last killing test (node ID), run first next time; not in git.
KILLERS = ROOT / "build" / "mutate" / "killers.json"
#: A pytest plugin written into the copy: the test named by ``MUTATE_FIRST`` runs first.
FIRST_PLUGIN = "_mutate_first"
FIRST_PLUGIN_SOURCE = '''"""Written by tools/mutate/run.py: MUTATE_FIRST's test runs first; the node
ID of every failing test is appended to the file MUTATE_FAILED (a line each: IDs of
parametrized rows may hold spaces, which pytest's summary line cannot show unambiguously)."""
import os


def pytest_collection_modifyitems(items):
    first = os.environ.get("MUTATE_FIRST")
    if first:
        items.sort(key=lambda item: item.nodeid != first)


def pytest_runtest_logreport(report):
    path = os.environ.get("MUTATE_FAILED")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as failed:
            failed.write(report.nodeid + "\\n")


def pytest_collectreport(report):
    pytest_runtest_logreport(report)
'''


@dataclass
class Mutant:
    """One planted bug; ``tests`` are pytest node IDs (files or single tests)."""

    id: str
    file: str
    description: str
    original: str
    replacement: str
    tests: list[str]
    scenario: int | None = None
    equivalent: str = ""
    result: str = ""
    killer: str = ""
    seconds: float = 0.0
    output: str = field(default="", repr=False)


def load(path: Path = MUTANTS, only: Collection[str] | None = None) -> list[Mutant]:
    """Read the list; raise SystemExit(2) naming every mutant (of ``only``, when given) whose
    snippet is not found exactly once in its file, or whose tests do not exist."""
    data = tomllib.loads(path.read_text())
    mutants = [Mutant(**m) for m in data["mutant"]]
    problems = []
    seen = set()
    for m in mutants:
        if m.id in seen:
            problems.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        if only is not None and m.id not in only:
            continue
        source = ROOT / m.file
        if not source.is_file():
            problems.append(f"{m.id}: no file {m.file}")
            continue
        count = source.read_text().count(m.original)
        if count != 1:
            problems.append(f"{m.id}: snippet found {count} times in {m.file} (must be once)")
        if m.original == m.replacement:
            problems.append(f"{m.id}: the replacement is the original")
        if not m.tests and not m.equivalent:
            problems.append(f"{m.id}: no tests mapped")
        for test in m.tests:
            test_file = ROOT / test.split("::")[0]
            if not test_file.is_file():
                problems.append(f"{m.id}: no test file {test}")
            else:
                text = test_file.read_text()
                for name in test.split("::")[1:]:
                    name = name.split("[")[0]
                    if not re.search(rf"(?:def|class) {re.escape(name)}\b", text):
                        problems.append(f"{m.id}: no test {test}")
    if problems:
        print("mutants.toml is out of date with the code:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        raise SystemExit(2)
    return mutants


def copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "db.sqlite3", "_build")
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=ignore)
        else:
            shutil.copy2(src, dest / name)
    (dest / f"{FIRST_PLUGIN}.py").write_text(FIRST_PLUGIN_SOURCE)


def run_tests(
    tree: Path, tests: list[str], timeout: float, first: str = "", flags: list[str] | None = None
) -> tuple[str, str, str]:
    """Run ``tests`` in ``tree`` (``first``, a node ID among them, before the others);
    return (result, first failing test, output)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("OUTBOX_TEST_VALKEY_URL", None)  # every run starts its own server
    env["MUTATE_FIRST"] = first
    failed_file = tree / f"{FIRST_PLUGIN}.failed"
    failed_file.unlink(missing_ok=True)
    env["MUTATE_FAILED"] = str(failed_file)
    flags = PYTEST_FLAGS if flags is None else flags
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *tests, *flags, "-p", FIRST_PLUGIN],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: valkey-server and children too
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        return "killed", f"(timeout {timeout:.0f}s)", ""
    except BaseException:
        stop(proc)
        raise
    if proc.returncode == 0:
        return "survived", "", out
    failed = failing_nodes(failed_file)
    if proc.returncode == 1 and failed:
        return "killed", failed[0], out
    return "error", f"(pytest exit {proc.returncode})", out


def failing_nodes(path: Path) -> list[str]:
    """The node IDs the plugin recorded as failing in ``path``, first failure first."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return []
    return list(dict.fromkeys(line for line in lines if line))


def stop(proc: subprocess.Popen) -> None:
    """End a test run and everything it started (its own process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            continue


def covers(tests: list[str], node: str) -> bool:
    """Whether ``node`` (a pytest node ID) is one of ``tests`` or inside one of them."""
    return any(node == t or node.startswith(t + "::") or node.startswith(t + "[") for t in tests)


def load_killers() -> dict[str, str]:
    try:
        return json.loads(KILLERS.read_text())
    except (OSError, ValueError):
        return {}


def save_killers(mutants: list[Mutant]) -> None:
    killers = load_killers()
    for m in mutants:
        if m.result == "killed" and "::" in m.killer:
            killers[m.id] = m.killer
    KILLERS.parent.mkdir(parents=True, exist_ok=True)
    KILLERS.write_text(json.dumps(killers, indent=1, sort_keys=True) + "\n")


def confirm(tree: Path, mutants: list[Mutant], timeout: float) -> None:
    """Run every killing test on the unmutated copy (together, no ``-x``); a mutant whose
    killing test fails there too, or whose tests time out there too, becomes ``error``."""
    killed = [m for m in mutants if m.result == "killed"]
    nodes = sorted({m.killer for m in killed if "::" in m.killer})
    failing: set[str] = set()
    if nodes:
        flags = [f for f in PYTEST_FLAGS if f != "-x"]
        result, _, _ = run_tests(tree, nodes, timeout * 3, flags=flags)
        if result == "killed":
            failing = set(failing_nodes(tree / f"{FIRST_PLUGIN}.failed"))
        elif result != "survived":
            failing = set(nodes)  # could not tell: none of them is confirmed
    for m in killed:
        if m.killer in failing:
            m.result, m.killer = "error", f"(fails unmutated too: {m.killer})"
    for m in killed:
        if "::" not in m.killer and m.result == "killed":  # a timeout kill
            result, _, _ = run_tests(tree, m.tests, timeout)
            if result != "survived":
                m.result, m.killer = "error", f"(unmutated: {result})"
    print(f"confirmed {sum(m.result == 'killed' for m in killed)}/{len(killed)} kills", flush=True)


def plant(tree: Path, m: Mutant) -> str:
    """Write the mutant into the copy; return the original text to restore."""
    path = tree / m.file
    original = path.read_text()
    path.write_text(original.replace(m.original, m.replacement, 1))
    return original


def table(mutants: list[Mutant]) -> str:
    rows = [("id", "file", "description", "result", "killing test", "s")]
    for m in mutants:
        result = "equivalent" if m.equivalent else (m.result or "not run")
        killer = m.killer if not m.equivalent else m.equivalent
        rows.append(
            (
                m.id,
                m.file.removeprefix("django_outbox/"),
                m.description,
                result,
                killer,
                f"{m.seconds:.1f}",
            )
        )
    widths = [
        min(max(len(r[i]) for r in rows), cap) for i, cap in enumerate((32, 26, 70, 10, 110, 6))
    ]

    def fmt(row):
        return "  ".join(str(c)[:w].ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()

    lines = [fmt(rows[0]), fmt(tuple("-" * w for w in widths))]
    lines += [fmt(r) for r in rows[1:]]
    return "\n".join(lines)


def summary(mutants: list[Mutant]) -> tuple[float, str]:
    counted = [m for m in mutants if not m.equivalent and m.result]
    killed = [m for m in counted if m.result == "killed"]
    rate = 100.0 * len(killed) / len(counted) if counted else 0.0
    equivalent = sum(1 for m in mutants if m.equivalent)
    survivors = [m.id for m in counted if m.result != "killed"]
    text = (
        f"killed {len(killed)}/{len(counted)} = {rate:.1f} % ({equivalent} equivalent, not counted)"
    )
    if survivors:
        text += "\nnot killed: " + ", ".join(survivors)
    return rate, text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="mutant IDs to run")
    parser.add_argument("--list", action="store_true", help="print the list and exit")
    parser.add_argument(
        "--baseline", action="store_true", help="run the clean baseline even with --only"
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the clean run")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per mutant")
    parser.add_argument("--target", type=float, default=95.0, help="kill rate to reach (%%)")
    parser.add_argument("--verbose", action="store_true", help="show survivors' output")
    args = parser.parse_args(argv)
    mutants = load(only=args.only or None)
    if args.only:
        unknown = set(args.only) - {m.id for m in mutants}
        if unknown:
            parser.error(f"unknown mutant IDs: {', '.join(sorted(unknown))}")
        mutants = [m for m in mutants if m.id in args.only]
    if args.list:
        print(table(mutants))
        return 0
    runnable = [m for m in mutants if not m.equivalent]
    killers = load_killers()
    baseline = (args.baseline or not args.only) and not args.no_baseline
    with tempfile.TemporaryDirectory(prefix="outbox-mutate-") as tmp:
        tree = Path(tmp)
        copy_tree(tree)
        try:
            if baseline:
                union = sorted({t for m in runnable for t in m.tests})
                print(f"baseline: {len(union)} test targets on the unmutated tree ...", flush=True)
                started = time.monotonic()
                result, killer, out = run_tests(tree, union, args.timeout * 3)
                if result != "survived":
                    print(out[-4000:], file=sys.stderr)
                    print(f"baseline failed ({killer}): fix the suite first", file=sys.stderr)
                    return 2
                print(f"baseline green in {time.monotonic() - started:.0f}s", flush=True)
            for n, m in enumerate(runnable, 1):
                original = plant(tree, m)
                started = time.monotonic()
                first = killers.get(m.id, "")
                try:
                    m.result, m.killer, out = run_tests(
                        tree, m.tests, args.timeout, first if covers(m.tests, first) else ""
                    )
                    m.output = out[-4000:]
                finally:
                    (tree / m.file).write_text(original)
                m.seconds = time.monotonic() - started
                print(
                    f"[{n}/{len(runnable)}] {m.id}: {m.result} {m.killer} ({m.seconds:.1f}s)",
                    flush=True,
                )
                if m.result == "error" or (args.verbose and m.result == "survived"):
                    print(m.output, flush=True)
            confirm(tree, runnable, args.timeout)
        except KeyboardInterrupt:
            print("\ninterrupted: the table below is partial", file=sys.stderr)
        save_killers(runnable)
    print()
    print(table(mutants))
    rate, text = summary(mutants)
    print()
    print(text)
    return 0 if rate >= args.target else 1


if __name__ == "__main__":
    sys.exit(main())
