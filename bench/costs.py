"""The work per message of ``make bench`` (issue 21): figures that do not depend on how busy the
machine is, and the bounded-concurrency scaling run.

- :func:`costs`: per accept and per delivered message, the Valkey commands executed (the sum of
  ``calls`` over ``INFO commandstats``, commands inside scripts included), Valkey CPU
  (``used_cpu_user`` + ``used_cpu_sys`` of ``INFO cpu``) and the scripts' own time (``usec`` of
  EVALSHA in commandstats), all as deltas over the run; and the worker process's CPU per
  delivered message with a no-op agent (``time.process_time`` inside the worker, from its first
  delivery to its last: bench.agents.cpu_noop), so its start-up is not counted.
- :func:`command_split`: the same accept and delivery on a smaller shape under ``MONITOR``,
  which marks every command a script runs (``[0 lua]``): commands inside scripts and outside,
  per command name. MONITOR slows the server, so no time is measured in that run.
- :func:`bounded`: the scaling run: ``workers`` processes of ``--concurrency 8`` each and an
  agent that sleeps 20 ms per delivery (bench.agents.sleep_stamp), all registered before the
  messages are accepted; messages/s from the first delivery done to the last. The processes
  mostly sleep, so CPU is not the limit: this measures coordination (wake list, scans, leases).

Every wait is bounded; every process started here is stopped (bench/common.py).
"""

from __future__ import annotations

import asyncio
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench import worker_bench
from bench.common import PAYLOAD, due_horizon_ms, reap_children
from django_outbox.testing import wait_until

SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
ACCEPT_TASKS = 64  #: accepts in flight at once in bounded()


def _outbox(url: str):
    from django_outbox.core.service import Outbox

    ob = Outbox(url=url, cap=10**6, user_max_queued=0, user_accepts_per_minute=0)
    ob.load_scripts()
    return ob


def _snapshot(client: redis.Redis) -> tuple[dict[str, dict], float]:
    """(commandstats by command name, Valkey CPU seconds: user + sys)."""
    stats = {k.removeprefix("cmdstat_"): v for k, v in client.info("commandstats").items()}
    cpu = client.info("cpu")
    return stats, cpu["used_cpu_user"] + cpu["used_cpu_sys"]


def _delta(before: dict[str, dict], after: dict[str, dict], field: str) -> Counter:
    """Per command, ``field`` (calls / usec) after minus before; our own INFO left out."""
    out: Counter = Counter()
    for name, v in after.items():
        if name == "info":
            continue
        d = v[field] - before.get(name, {}).get(field, 0)
        if d:
            out[name] = d
    return out


def _accept_all(ob, sessions: int, per: int, tag: str) -> int:
    """Accept ``per`` messages in each of ``sessions`` sessions (w1), round-robin: the count."""
    for n in range(per):
        for s in range(sessions):
            ob.accept("w1", f"s{s}", user_id="u", client_message_id=f"{tag}{n}", text=PAYLOAD)
    return sessions * per


def _drained(client: redis.Redis, sessions: int) -> bool:
    """Every session's queue and staging list are empty and no session is due within the
    hour (an emptied session stays in the due index until its dedupe window has passed, to
    be reclaimed then): one ZCOUNT and ``sessions`` EXISTS."""
    pipe = client.pipeline(transaction=False)
    pipe.zcount("outboxdue:{w1}", "-inf", due_horizon_ms())
    for s in range(sessions):
        pipe.exists(f"outboxq:{{w1}}:s{s}", f"outboxd:{{w1}}:s{s}")
    return sum(pipe.execute()) == 0


def _deliver_all(url: str, client: redis.Redis, sessions: int, total: int, cpu_file: Path) -> int:
    """Start one worker (no-op agent measuring its CPU), wait until all ``total`` messages are
    delivered and settled, stop it: how many checks (:func:`_drained`) were sent."""
    proc = worker_bench.worker(
        url,
        "--concurrency",
        "256",
        BENCH_DELIVERER="bench.agents.cpu_noop",
        BENCH_EXPECT=str(total),
        BENCH_CPU_FILE=str(cpu_file),
    )
    try:
        wait_until(lambda: cpu_file.exists() and cpu_file.read_text(), 300, 0.02, "all delivered")
        checks = 0

        def settled():
            nonlocal checks
            checks += 1
            return _drained(client, sessions)

        wait_until(settled, 60, 0.02, "all settled")
        return checks
    finally:
        worker_bench.stop(proc)
        reap_children()


def costs(url: str, sessions: int, per: int, details: dict[str, Any] | None = None) -> tuple:
    """Accept ``sessions`` x ``per`` messages one after the other, then deliver them with one
    worker (no-op agent): (valkey_cmds_per_accept, valkey_cpu_us_per_accept,
    valkey_script_us_per_accept, valkey_cmds_per_msg, valkey_cpu_us_per_msg,
    valkey_script_us_per_msg, worker_cpu_us_per_msg). ``details`` (if given) gets the
    commands per accept / per message by command name."""
    client = redis.Redis.from_url(url)
    client.flushall()
    ob = _outbox(url)
    s0, c0 = _snapshot(client)
    total = _accept_all(ob, sessions, per, "k")
    s1, c1 = _snapshot(client)
    ob.close()
    client.delete("outboxwake")  # as bench/worker_bench.py: the worker finds the backlog by scans
    s2, c2 = _snapshot(client)
    with tempfile.TemporaryDirectory() as tmp:
        cpu_file = Path(tmp) / "cpu"
        checks = _deliver_all(url, client, sessions, total, cpu_file)
        calls, spent = cpu_file.read_text().split()
    s3, c3 = _snapshot(client)
    client.close()

    accept_calls = _delta(s0, s1, "calls")
    deliver_calls = _delta(s2, s3, "calls")
    deliver_calls["exists"] -= checks * sessions
    deliver_calls["zcount"] -= checks
    deliver_calls = +deliver_calls  # drop what is left at zero

    def script_us(before, after):
        usec = _delta(before, after, "usec")
        return sum(usec[c] for c in SCRIPT_COMMANDS)

    if details is not None:
        details["commands_per_accept"] = _per(accept_calls, total)
        details["commands_per_msg"] = _per(deliver_calls, total)
    return (
        sum(accept_calls.values()) / total,
        (c1 - c0) * 1e6 / total,
        script_us(s0, s1) / total,
        sum(deliver_calls.values()) / total,
        (c3 - c2) * 1e6 / total,
        script_us(s2, s3) / total,
        float(spent) * 1e6 / int(calls),
    )


def _per(calls: Counter, n: int) -> dict[str, float]:
    """Calls per unit by command name, the largest first."""
    return {k: round(v / n, 2) for k, v in calls.most_common()}


class _Monitor:
    """A MONITOR reader in a thread: counts commands (name, inside a script or not) until it
    sees ``ECHO <mark>``; :meth:`cut` sends a mark and returns the counts since the last cut."""

    def __init__(self, url: str) -> None:
        self.client = redis.Redis.from_url(url)
        self.counts: Counter = Counter()
        self.marks: list[Counter] = []
        self.seen = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        wait_until(self.ready.is_set, 10, 0.01, "MONITOR started")

    def _run(self) -> None:
        with self.client.monitor() as m:
            self.ready.set()
            for cmd in m.listen():
                words = cmd["command"].split(" ", 2)
                name = words[0].lower()
                if name == "echo" and len(words) > 1 and words[1].startswith("bench-mark"):
                    self.marks.append(self.counts)
                    self.counts = Counter()
                    self.seen.set()
                    if words[1] == "bench-mark-end":
                        return
                    continue
                inside = cmd.get("client_type") == "lua"
                self.counts[(name, inside)] += 1

    def cut(self, sender: redis.Redis, last: bool = False) -> Counter:
        """Mark the stream and return the counts up to the mark."""
        self.seen.clear()
        sender.echo("bench-mark-end" if last else "bench-mark")
        wait_until(self.seen.is_set, 60, 0.01, "MONITOR read up to the mark")
        return self.marks[-1]


def command_split(
    url: str, sessions: int, per: int, details: dict[str, Any] | None = None
) -> tuple:
    """The accept and delivery of :func:`costs` (smaller) under MONITOR:
    (valkey_cmds_in_scripts_per_accept, valkey_cmds_outside_per_accept,
    valkey_cmds_in_scripts_per_msg, valkey_cmds_outside_per_msg). ``details`` (if given) gets
    per command name, inside scripts and outside, per accept and per message."""
    client = redis.Redis.from_url(url)
    client.flushall()
    ob = _outbox(url)
    mon = _Monitor(url)
    mon.cut(client)
    total = _accept_all(ob, sessions, per, "k")
    ob.close()
    accepts = mon.cut(client)
    client.delete("outboxwake")
    mon.cut(client)
    with tempfile.TemporaryDirectory() as tmp:
        checks = _deliver_all(url, client, sessions, total, Path(tmp) / "cpu")
    delivery = mon.cut(client, last=True)
    client.close()
    delivery[("exists", False)] -= checks * sessions
    delivery[("zcount", False)] -= checks
    delivery = +delivery

    def side(counts: Counter, inside: bool) -> Counter:
        return Counter({name: n for (name, i), n in counts.items() if i == inside})

    if details is not None:
        for label, counts in (("accept", accepts), ("msg", delivery)):
            details[f"in_scripts_per_{label}"] = _per(side(counts, True), total)
            details[f"outside_per_{label}"] = _per(side(counts, False), total)
    return (
        sum(side(accepts, True).values()) / total,
        sum(side(accepts, False).values()) / total,
        sum(side(delivery, True).values()) / total,
        sum(side(delivery, False).values()) / total,
    )


def bounded(url: str, sessions: int, per: int, workers: int, sleep: float = 0.02) -> float:
    """Start ``workers`` processes (``--concurrency 8``, an agent sleeping ``sleep`` seconds),
    wait until all are registered, accept ``per`` messages in each of ``sessions`` sessions
    (64 at once), and wait for every delivery: messages/s from the first delivery done to the
    last."""
    client = redis.Redis.from_url(url)
    client.flushall()
    procs = [
        worker_bench.worker(
            url,
            "--concurrency",
            "8",
            BENCH_DELIVERER="bench.agents.sleep_stamp",
            BENCH_SLEEP=str(sleep),
            BENCH_EVENTS="0",
        )
        for _ in range(workers)
    ]
    try:
        wait_until(lambda: client.zcard("outboxworkers") == workers, 120, 0.05, "workers up")
        ob = _outbox(url)
        total = sessions * per

        async def accept_all():
            sem = asyncio.Semaphore(ACCEPT_TASKS)

            async def one(s, n):
                async with sem:
                    await ob.aaccept(
                        "w1", f"s{s}", user_id="u", client_message_id=f"k{n}", text=PAYLOAD
                    )

            await asyncio.gather(*(one(s, n) for n in range(per) for s in range(sessions)))
            await ob.aclose()

        asyncio.run(accept_all())
        ob.close()
        wait_until(lambda: client.llen("bench:done") >= total, 300, 0.05, "all delivered")
        done = [x.decode().split() for x in client.lrange("bench:done", 0, -1)]
    finally:
        for p in procs:
            worker_bench.stop(p)
        reap_children()
        client.close()
    times = sorted(float(t) for _, t in done)
    pids = {pid for pid, _ in done}
    if len(pids) < workers:
        raise RuntimeError(f"only {len(pids)} of {workers} workers delivered anything")
    return (len(times) - 1) / (times[-1] - times[0])


def floor(url: str, calls: int = 20_000) -> tuple:
    """What any script call and any command inside one costs Valkey, whatever it does: the
    floor under ``valkey_cpu_us_per_msg``. Each figure is ``usec_per_call`` of EVALSHA in
    ``INFO commandstats`` over ``calls`` pipelined calls with a session's 17 keys and 20
    arguments, in µs: (floor_evalsha_us: ``return 1``; floor_library_us: the library files
    settle_next.lua includes (what a delivered message runs: core/lua/lib/) and ``return 1``,
    less the former; floor_script_command_us: per ``redis.call('GET', <missing key>)``
    inside a script, from a script making 20 of them). Commands outside scripts (the round
    trip itself) are not in these."""
    from django_outbox.core.scripts import load_scripts, read_source

    library = "\n".join(read_source(f"lib/{n}") for n in load_scripts()["settle_next"].includes)
    keys = [f"floor:{{w}}:{i}" for i in range(17)]
    args = ["5", "0", "s1", "w1", "strict", *("x" * 15)]
    gets = "\n".join("redis.call('GET', KEYS[1])" for _ in range(20))
    texts = {
        "bare": "#!lua\nreturn 1",
        "library": f"#!lua\n{library}\nreturn 1",
        "gets": f"#!lua\n{gets}\nreturn 1",
    }
    client = redis.Redis.from_url(url)
    per_call = {}
    try:
        for name, text in texts.items():
            sha = client.script_load(text)
            client.config_resetstat()
            for start in range(0, calls, 2_000):
                pipe = client.pipeline(transaction=False)
                for _ in range(min(2_000, calls - start)):
                    pipe.evalsha(sha, len(keys), *keys, *args)
                pipe.execute()
            per_call[name] = client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]
    finally:
        client.close()
    return (
        per_call["bare"],
        per_call["library"] - per_call["bare"],
        (per_call["gets"] - per_call["bare"]) / 20,
    )


def settle_next_profile(url: str, sessions: int = 50, per: int = 20) -> tuple:
    """Where a delivered message's script time goes inside Valkey (issue 21): settle_next.lua
    with ``os.clock()`` marks (a copy of the script, never the one the outbox runs), over
    ``sessions`` sessions of ``per`` queued messages each, every message settled with its
    session's next claim as the worker does: mean µs per call of (profile_library_us: the
    library files it includes and the glue before the settle; profile_settle_us: the
    settle; profile_claim_us: the claim that follows). The call's own setup (its keys and
    arguments made Lua values) and Lua's garbage collection after it are outside the
    marks."""
    import statistics

    from django_outbox.core.scripts import claim_argv, settle_next_argv
    from django_outbox.core.step import RECEIPT_TTL_MS

    client = redis.Redis.from_url(url)
    client.flushall()
    ob = _outbox(url)
    try:
        text = ob.scripts["settle_next"].text
        shebang, rest = text.split("\n", 1)
        marked = f"{shebang}\nlocal MARK0 = os.clock()\n{rest}"
        for old, new in (
            ("-- settle_next.lua\n", "local MARK1 = os.clock()\n-- settle_next.lua\n"),
            (
                "settle(token, id, 'delivered', ARGV[9], policy, acknowledged)\n",
                "settle(token, id, 'delivered', ARGV[9], policy, acknowledged)\n"
                "local MARK2 = os.clock()\n",
            ),
            (
                "return {'next', settled, claim(token, tonumber(ARGV[19]), acknowledge, carried)}",
                "local claimed = claim(token, tonumber(ARGV[19]), acknowledge, carried)\n"
                "local MARK3 = os.clock()\n"
                "return {tostring(MARK1 - MARK0), tostring(MARK2 - MARK1), "
                "tostring(MARK3 - MARK2), claimed[1]}",
            ),
        ):
            assert marked.count(old) == 1, f"settle_next.lua changed: {old!r}"
            marked = marked.replace(old, new)
        sha = client.script_load(marked)
        client.script_load(ob.scripts["claim"].text)
        phases: list[tuple[float, float, float]] = []
        for s in range(sessions):
            ses = f"p{s}"
            ids = [
                ob.accept("w1", ses, user_id="u", client_message_id=f"k{n}", text=PAYLOAD).id
                for n in range(per)
            ]
            ob.run_script("claim", "w1", ses, claim_argv("tok", 30_000, []))
            keys, base = ob._session_args(ob.keys.session("w1", ses), "w1", ses)
            pipe = client.pipeline(transaction=False)
            for entry_id in ids:
                argv = settle_next_argv(
                    "tok", entry_id, ob.config, RECEIPT_TTL_MS, 30_000, [entry_id]
                )
                pipe.evalsha(sha, len(keys), *keys, *base, *argv)
            for reply in pipe.execute()[:-1]:  # (the last one finds nothing left to claim)
                assert reply[3] == b"deliver", reply
                phases.append((float(reply[0]), float(reply[1]), float(reply[2])))
    finally:
        ob.close()
        client.close()
    return tuple(statistics.mean(p[i] for p in phases) * 1e6 for i in range(3))
