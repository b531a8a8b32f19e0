"""Worker metrics (prometheus-client): counters fed by step listeners, entries by status."""

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from django_outbox import Verdict
from django_outbox.errors import AmbiguousError
from django_outbox.metrics import WorkerMetrics
from tests.support.paths import ROOT


def sample(metrics, name, labels=None):
    value = metrics.registry.get_sample_value(name, labels or {})
    return 0 if value is None else value


def test_steps_are_counted_by_outcome(make_outbox):
    calls = iter([None, RuntimeError("500"), AmbiguousError("cut")])

    async def deliver(entry, **kwargs):
        outcome = next(calls)
        if outcome is not None:
            raise outcome

    outbox = make_outbox(deliverer=deliver, retry_backoff=0, max_backoff=0.1)
    metrics = WorkerMetrics(outbox)
    outbox.step_listeners.append(metrics.on_step)
    for key in ("a", "b", "c"):
        outbox.accept("w1", f"s-{key}", user_id="u", client_message_id=key, text=key)

    async def main():
        for key in ("a", "b", "c"):
            await outbox.adeliver_once("w1", f"s-{key}")
        await outbox.aclose()

    asyncio.run(main())
    assert sample(metrics, "outbox_delivered_total") == 1
    assert sample(metrics, "outbox_failed_total", {"outcome": "failed"}) == 1
    # no verifier: an ambiguous outcome is recorded as unverifiable (an error)
    assert sample(metrics, "outbox_failed_total", {"outcome": "unverifiable"}) == 1
    assert sample(metrics, "outbox_delivery_duration_seconds_count", {"step": "deliver"}) == 3


def test_accept_to_delivery_latency(make_outbox):
    from django_outbox.signals import entry_delivered

    async def deliver(entry, **kwargs):
        await asyncio.sleep(0.06)

    outbox = make_outbox(deliverer=deliver)
    metrics = WorkerMetrics(outbox)
    entry_delivered.connect(metrics.on_delivered, weak=False, dispatch_uid="test-latency")
    try:
        outbox.accept("w1", "s1", user_id="u", client_message_id="a", text="a")

        async def main():
            await outbox.adeliver_once("w1", "s1")
            await outbox.aclose()

        asyncio.run(main())
    finally:
        entry_delivered.disconnect(dispatch_uid="test-latency")
    assert sample(metrics, "outbox_delivery_latency_seconds_count") == 1
    assert sample(metrics, "outbox_delivery_latency_seconds_bucket", {"le": "0.05"}) == 0
    assert sample(metrics, "outbox_delivery_latency_seconds_sum") >= 0.06


def test_entries_by_status(make_outbox):
    outbox = make_outbox()
    outbox.accept("w1", "s1", user_id="u", client_message_id="a", text="a")
    outbox.accept("w1", "s1", user_id="u", client_message_id="b", text="b")
    outbox.park_workspace("w1", "hold")
    outbox.accept("w2", "s1", user_id="u", client_message_id="c", text="c")
    metrics = WorkerMetrics(outbox)
    text = generate_latest(metrics.registry).decode()
    assert 'outbox_entries{status="parked"} 2.0' in text
    assert 'outbox_entries{status="pending"} 1.0' in text
    assert metrics.count_entries() == {"parked": 2, "pending": 1}


@pytest.mark.standalone
def test_counting_entries_never_reads_their_texts(make_outbox, r):
    """The gauge needs statuses only: the texts (here 3 x 90 KB) stay in Valkey."""
    outbox = make_outbox()
    for i in range(3):
        outbox.accept("w1", f"s{i}", user_id="u", client_message_id=f"k{i}", text="x" * 90_000)
    outbox.park_workspace("w1", "hold")
    outbox.accept("w2", "s1", user_id="u", client_message_id="k", text="y" * 90_000)
    metrics = WorkerMetrics(outbox)
    before = r.info("stats")["total_net_output_bytes"]
    assert metrics.count_entries() == {"parked": 3, "pending": 1}
    sent = r.info("stats")["total_net_output_bytes"] - before
    assert sent < 10_000, f"{sent} bytes sent to count 4 entries"


def test_the_grafana_dashboard_names_only_metrics_a_worker_exposes(make_outbox):
    """deploy/grafana/django-outbox.json (README "The worker") stays true to WorkerMetrics."""
    import json
    import re

    dashboard = ROOT / "deploy/grafana/django-outbox.json"
    panels = json.loads(dashboard.read_text())["panels"]
    exprs = [target["expr"] for panel in panels for target in panel["targets"]]
    named = {name for expr in exprs for name in re.findall(r"\boutbox_[a-z_]+", expr)}
    metrics = WorkerMetrics(make_outbox())
    metrics.on_step("deliver", "failed", "updated", 0.1)  # labelled series appear once used
    metrics.on_agent_step("default", "deliver", "delivered", "removed", 0.1)
    exposed = set(
        re.findall(r"^(outbox_[a-z_]+)", generate_latest(metrics.registry).decode(), re.M)
    )
    assert named and named <= exposed, named - exposed
    assert "outbox_delivery_latency_seconds_bucket" in named


def test_steps_are_counted_and_timed_by_agent(make_outbox):
    from django_outbox.core.agents import Agent
    from django_outbox.errors import HoldDeliveryError

    async def fine(entry, **kwargs):
        pass

    async def busy(entry, **kwargs):
        raise HoldDeliveryError("429", retry_after=60)

    outbox = make_outbox(
        agents={"fine": Agent("fine", fine), "busy": Agent("busy", busy)},
        router=lambda ws, ses: ses,
    )
    metrics = WorkerMetrics(outbox)
    outbox.step_listeners.append(metrics.on_step)
    outbox.agent_step_listeners.append(metrics.on_agent_step)
    for key, ses in enumerate(("fine", "fine", "busy")):
        outbox.accept("w1", ses, user_id="u", client_message_id=f"k{key}", text="t")

    async def main():
        await outbox.arun(once=True, heartbeat=False)
        await outbox.aclose()

    asyncio.run(main())
    steps = "outbox_agent_steps_total"
    assert sample(metrics, steps, {"agent": "fine", "step": "deliver", "outcome": "delivered"}) == 2
    assert sample(metrics, steps, {"agent": "busy", "step": "deliver", "outcome": "held"}) == 1
    count = "outbox_agent_step_duration_seconds_count"
    assert sample(metrics, count, {"agent": "fine", "step": "deliver"}) == 2
    # The series without the agent label go on as before.
    assert sample(metrics, "outbox_delivered_total") == 2
    assert sample(metrics, "outbox_failed_total", {"outcome": "held"}) == 1


def test_verify_steps_are_counted_apart_from_deliveries(make_outbox):
    """An ambiguous attempt is counted as ambiguous; the verifier's "could not tell" is no
    failure; its "delivered" counts as verified, not as delivered by the deliverer
    (docs/reference/commands.md, the worker metrics)."""
    verdicts = iter([Verdict.INCONCLUSIVE, Verdict.DELIVERED])

    async def deliver(entry, **kwargs):
        raise AmbiguousError("the connection dropped after the send")

    async def verify(entry, **kwargs):
        return next(verdicts)

    outbox = make_outbox(
        deliverer=deliver, verifier=verify, verify_delay=0, retry_backoff=0, max_backoff=0.05
    )
    metrics = WorkerMetrics(outbox)
    outbox.step_listeners.append(metrics.on_step)
    outbox.accept("w1", "s1", user_id="u", client_message_id="k", text="hello")

    async def main():
        deadline = time.monotonic() + 10
        while outbox.list("w1", "s1"):
            assert time.monotonic() < deadline, "the entry was never verified"
            if not await outbox.adeliver_once("w1", "s1"):
                await asyncio.sleep(0.02)
        await outbox.aclose()

    asyncio.run(main())
    assert sample(metrics, "outbox_ambiguous_total") == 1
    assert sample(metrics, "outbox_verified_total") == 1
    assert sample(metrics, "outbox_delivered_total") == 0
    assert sample(metrics, "outbox_failed_total", {"outcome": "inconclusive"}) == 0
    assert sample(metrics, "outbox_delivery_duration_seconds_count", {"step": "verify"}) == 2
