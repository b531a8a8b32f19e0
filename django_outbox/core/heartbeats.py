"""Worker heartbeats: the record a worker publishes, its write, and the reads of who is live.

A worker beats every :data:`HEARTBEAT_INTERVAL` seconds (``core.worker.Worker.beat``
calls :meth:`Heartbeats.abeat`): its :class:`WorkerHeartbeat` record is written to its
heartbeat key (``KeySpace.heartbeat``, expiring after :data:`HEARTBEAT_TTL`), and the
``KeySpace.workers`` ZSET remembers when each worker was last seen, on Valkey's clock.
A worker is live while its heartbeat key exists. The admin's page, the system checks,
``manage.py outbox status``, ``outbox_worker --check`` and the history's depth sample read
them (:meth:`Heartbeats.workers`, or :func:`workers_plan` beside other reads).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from .keys import KeySpace
from .paging import ReadPlan, read_side_by_side, score_pairs
from .paging import as_text as _text
from .transport import Transport

HEARTBEAT_INTERVAL = 5.0  # seconds between a worker's heartbeats
HEARTBEAT_TTL = 3 * HEARTBEAT_INTERVAL  # a worker is live while its heartbeat key exists


@dataclass(frozen=True, slots=True)
class WorkerHeartbeat:
    """A worker as its heartbeats show it.

    ``id``; ``last_seen``: epoch seconds of its last beat; ``live``: its heartbeat key
    still exists (a beat less than :data:`HEARTBEAT_TTL` ago). What that beat
    published: ``host``, ``pid``, ``started`` (epoch seconds), ``in_flight`` (sessions
    being delivered), ``concurrency`` and ``steps`` (delivery steps taken since it
    started); all None once the key has expired.
    """

    id: str
    last_seen: float
    live: bool = True
    host: str | None = None
    pid: int | None = None
    started: float | None = None
    in_flight: int | None = None
    concurrency: int | None = None
    steps: int | None = None

    def to_json(self) -> str:
        """The stored record: a JSON object of ``id``, ``host``, ``pid``, ``started``,
        ``last_seen``, ``in_flight``, ``concurrency`` and ``steps``."""
        return json.dumps(
            {
                "id": self.id,
                "host": self.host,
                "pid": self.pid,
                "started": self.started,
                "last_seen": self.last_seen,
                "in_flight": self.in_flight,
                "concurrency": self.concurrency,
                "steps": self.steps,
            }
        )

    @classmethod
    def from_json(cls, worker_id: str, last_seen: float, raw: Any) -> WorkerHeartbeat:
        """A worker from its ZSET member and score (``last_seen``, seconds) and its stored
        record ``raw`` (None once expired: not live; unreadable JSON: live, no fields)."""
        if raw is None:
            return cls(worker_id, last_seen, live=False)
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            return cls(worker_id, last_seen)
        return cls(
            worker_id,
            last_seen,
            host=record.get("host"),
            pid=record.get("pid"),
            started=record.get("started"),
            in_flight=record.get("in_flight"),
            concurrency=record.get("concurrency"),
            steps=record.get("steps"),
        )


@dataclass(frozen=True, slots=True)
class WorkerPresence:
    """Whether any worker is alive, as an end user's page may see it (no host, PID or
    count: docs/howto/frontend.md, "Is a worker running?").

    ``alive``: some worker's heartbeat key exists (it beat less than
    :data:`HEARTBEAT_TTL` seconds ago); ``last_seen``: epoch seconds of the most recent
    beat of any worker seen lately, None when none was seen in ``10 * HEARTBEAT_TTL``.
    """

    alive: bool
    last_seen: float | None = None


def presence_of(workers: list[WorkerHeartbeat]) -> WorkerPresence:
    """The :class:`WorkerPresence` that ``workers`` (as :func:`workers_plan` reads them)
    add up to."""
    return WorkerPresence(
        alive=any(w.live for w in workers),
        last_seen=max((w.last_seen for w in workers), default=None),
    )


def workers_plan(keys: KeySpace) -> ReadPlan:
    """A read plan of every worker seen lately, live ones first, then most recently seen
    first (``list[WorkerHeartbeat]``, two round trips: the ZSET, then the records)."""
    (members,) = yield [("ZRANGE", keys.workers, 0, -1, "WITHSCORES")]
    seen = [(_text(m), float(s) / 1000) for m, s in score_pairs(members)]
    if not seen:
        return []
    # One GET each: the heartbeat keys are in different slots on a cluster.
    records = yield [("GET", keys.heartbeat(wid)) for wid, _ in seen]
    workers = [
        WorkerHeartbeat.from_json(wid, last_seen, raw)
        for (wid, last_seen), raw in zip(seen, records, strict=True)
    ]
    return sorted(workers, key=lambda w: (not w.live, -w.last_seen))


class Heartbeats(Transport):
    """Writing and reading the worker heartbeats (mixed into the core ``Outbox``).

    Every method raises :class:`~django_outbox.core.errors.OutboxUnavailable` when
    Valkey cannot be reached.
    """

    def workers(self) -> list[WorkerHeartbeat]:
        """Every worker seen lately (the last ``10 * HEARTBEAT_TTL`` seconds), live ones
        first, then most recently seen first (two round trips)."""
        workers: list[WorkerHeartbeat]
        (workers,) = read_side_by_side(self.execute_many, workers_plan(self.keys))
        return workers

    def worker_presence(self) -> WorkerPresence:
        """Whether any worker is alive and when one last beat (two round trips, as
        :meth:`workers`); what the REST API's ``worker/`` answers."""
        return presence_of(self.workers())

    def live_workers(self) -> list[WorkerHeartbeat]:
        """The workers whose heartbeat key exists, most recently seen first."""
        return [w for w in self.workers() if w.live]

    async def abeat(self, record: WorkerHeartbeat, ttl: float) -> None:
        """Publish a worker's heartbeat ``record`` for ``ttl`` seconds, index it by
        ``record.last_seen``, and forget workers silent for ``10 * ttl`` (the writer
        of what :meth:`workers` reads)."""
        keys = self.keys
        client = await self._aclient_ready()
        # Seen at Valkey's time, so a worker with a wrong clock is neither shown as
        # long gone nor able to forget the others (docs/explanation/ordering.md#clocks).
        seconds, micros = await client.time()
        now = seconds + micros / 1_000_000
        record = dataclasses.replace(record, last_seen=now)
        # The record before its index entry: on a cluster they live on different nodes,
        # and a pipeline's commands to two nodes may land in either order.
        await client.set(keys.heartbeat(record.id), record.to_json(), px=int(ttl * 1000))
        pipe = client.pipeline(transaction=False)
        pipe.zadd(keys.workers, {record.id: int(now * 1000)})
        pipe.zremrangebyscore(keys.workers, "-inf", int((now - 10 * ttl) * 1000))
        await pipe.execute()

    async def aforget_worker(self, worker_id: str) -> None:
        """Remove a worker's heartbeat (a clean stop)."""
        client = await self._aclient_ready()
        await client.delete(self.keys.heartbeat(worker_id))
        await client.zrem(self.keys.workers, worker_id)
