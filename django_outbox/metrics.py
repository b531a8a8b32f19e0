"""Prometheus metrics of a worker process (prometheus-client), served by ``--metrics-port``."""

from __future__ import annotations

import time
from typing import Any

from django.db import connections
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import receipts, transactional
from .core.entry import Entry, Status, parse_time

SAMPLE_EVERY = 30.0  # seconds between entries-by-status samples
SAMPLE_MAX_SESSIONS = 50_000


class WorkerMetrics:
    """Counters fed by ``Outbox.step_listeners`` and an entries-by-status gauge.

    The gauge walks workspaces and sessions (pipelined), at most once per
    ``SAMPLE_EVERY`` seconds and over at most ``SAMPLE_MAX_SESSIONS`` sessions.
    """

    def __init__(self, outbox: Any, registry: CollectorRegistry | None = None) -> None:
        self.outbox = outbox
        self.registry = registry or CollectorRegistry()
        self.delivered = Counter(
            "outbox_delivered",
            "Entries confirmed delivered by the deliverer",
            registry=self.registry,
        )
        self.verified = Counter(
            "outbox_verified", "Entries confirmed delivered by the verifier", registry=self.registry
        )
        self.failed = Counter(
            "outbox_failed", "Delivery attempts that failed", ["outcome"], registry=self.registry
        )
        self.ambiguous = Counter(
            "outbox_ambiguous",
            "Delivery attempts whose outcome was unknown",
            registry=self.registry,
        )
        self.recovered = Counter(
            "outbox_recovered",
            "Staged entries recovered from a dead holder",
            registry=self.registry,
        )
        self.lease_lost = Counter(
            "outbox_lease_lost",
            "Steps whose lease was lost before they ended",
            registry=self.registry,
        )
        self.duration = Histogram(
            "outbox_delivery_duration_seconds",
            "Duration of deliver and verify steps",
            ["step"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600),
            registry=self.registry,
        )
        self.latency = Histogram(
            "outbox_delivery_latency_seconds",
            "Seconds from an entry's accept to its confirmed delivery (deliverer, verifier or "
            "ledger), as its entry_delivered receivers see it",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
            registry=self.registry,
        )
        self.agent_steps = Counter(
            "outbox_agent_steps",
            "Deliver and verify steps by agent (docs/howto/agents.md), step and outcome "
            "(delivered, failed, transient, held, ambiguous, absent, inconclusive, ...)",
            ["agent", "step", "outcome"],
            registry=self.registry,
        )
        self.agent_duration = Histogram(
            "outbox_agent_step_duration_seconds",
            "Duration of deliver and verify steps by agent",
            ["agent", "step"],
            buckets=(0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600),
            registry=self.registry,
        )
        self._sample: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        self._sampled_at = 0.0
        self.registry.register(self)

    def on_step(self, step: str, outcome: str, result: str, seconds: float) -> None:
        if step == "recover":
            self.recovered.inc(int(result))
            return
        self.duration.labels(step).observe(seconds)
        if result == "lost":
            self.lease_lost.inc()
        elif outcome == "delivered":
            (self.delivered if step == "deliver" else self.verified).inc()
        elif outcome == "ambiguous":
            self.ambiguous.inc()
        elif outcome != "inconclusive":
            self.failed.labels(outcome).inc()

    def on_agent_step(
        self, agent: str, step: str, outcome: str, result: str, seconds: float
    ) -> None:
        """An ``Outbox.agent_step_listeners`` listener: count the step by agent, step and
        outcome, and time it (a step whose lease was lost counts as outcome ``lost``)."""
        self.agent_steps.labels(agent, step, "lost" if result == "lost" else outcome).inc()
        self.agent_duration.labels(agent, step).observe(seconds)

    def on_delivered(self, sender: Any, entry: Entry, **kwargs: Any) -> None:
        """An ``entry_delivered`` receiver: observe the entry's accept → delivered latency
        (connected by ``outbox_worker --metrics-port``; a replayed signal,
        docs/reference/commands.md#outbox_worker, is observed again)."""
        if entry.delivered_at is None:
            return
        seconds = (parse_time(entry.delivered_at) - parse_time(entry.accepted_at)) / 1_000_000
        self.latency.observe(max(0.0, seconds))

    def collect(self):  # prometheus_client collector protocol
        if time.monotonic() - self._sampled_at > SAMPLE_EVERY:
            try:
                self._sample = self.count_entries()
            except Exception:
                pass
            try:
                self._pending = self.count_pending()
            except Exception:
                pass
            self._sampled_at = time.monotonic()
        family = GaugeMetricFamily("outbox_entries", "Entries by status", labels=["status"])
        for status in Status:
            family.add_metric([status.value], self._sample.get(status.value, 0))
        yield family
        pending = GaugeMetricFamily(
            "outbox_pending_accepts",
            "Prompts accepted on commit and not moved into the outbox yet, by state (failed: "
            "given up, staff decide)",
            labels=["state"],
        )
        for state, count in sorted(self._pending.items()):
            pending.add_metric([state], count)
        yield pending
        failures = CounterMetricFamily(
            "outbox_receiver_failures",
            "Calls of signal receivers that raised, by signal and receiver (a plain one's "
            "effect is lost; a once=True entry_delivered receiver's signal stays owed)",
            labels=["signal", "receiver"],
        )
        for (signal, name), count in sorted(receipts.FAILURES.items()):
            failures.add_metric([signal, name], count)
        yield failures

    def describe(self):
        return []

    def count_pending(self) -> dict[str, int]:
        """Rows of accepts on commit by state (``transactional.pending_counts``), read on
        connections of the calling thread (the metrics server's), closed afterwards unless
        a transaction holds them."""
        try:
            return transactional.pending_counts()
        finally:
            for connection in connections.all(initialized_only=True):
                if not connection.in_atomic_block:
                    connection.close()

    def count_entries(self) -> dict[str, int]:
        """Entries by status (``Outbox.entry_counts``, at most ``SAMPLE_MAX_SESSIONS``)."""
        return self.outbox.entry_counts(SAMPLE_MAX_SESSIONS)
