"""OpenTelemetry (README "Tracing"): one prompt is one trace, from the request that accepted
it to the deliverer call that delivered it, across processes; no prompt text in spans."""

import json
import os
import subprocess
import sys

import pytest
from django.urls import reverse
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from django_outbox import Verdict
from django_outbox.core import tracing
from django_outbox.core.entry import Entry
from django_outbox.errors import AmbiguousError
from tests.support.helpers import SES, WS, accept
from tests.support.paths import ROOT

SECRET_TEXT = "the prompt's text must never reach a span"


@pytest.fixture(scope="module")
def spans():
    """This process's finished spans (the global provider can be set once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    # Later test modules run untraced, as without an SDK (entries carry no traceparent).
    # The API sets a provider once per process; its own tests reset it the same way.
    trace._TRACER_PROVIDER = None
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    tracing._recording = False


@pytest.fixture(autouse=True)
def _fresh(spans):
    spans.clear()


def test_accept_records_the_trace_context_in_the_entry(outbox, r, spans):
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("POST /messages/") as request_span:
        entry = accept(outbox, "k1", SECRET_TEXT)
    (accept_span,) = [s for s in spans.get_finished_spans() if s.name == "outbox.accept"]
    assert accept_span.parent.span_id == request_span.get_span_context().span_id
    assert accept_span.attributes["outbox.entry_id"] == entry.id
    trace_id = f"{request_span.get_span_context().trace_id:032x}"
    span_id = f"{accept_span.context.span_id:016x}"
    assert entry.traceparent.startswith(f"00-{trace_id}-{span_id}-")  # then the flags
    (stored,) = r.lrange(outbox.keys.session(WS, SES).queue, 0, -1)
    assert Entry.from_json(stored).traceparent == entry.traceparent  # it is stored
    assert outbox.list(WS, SES)[0].traceparent == entry.traceparent


def test_an_accept_outside_any_trace_starts_one(outbox, spans):
    entry = accept(outbox)
    (accept_span,) = spans.get_finished_spans()
    assert accept_span.parent is None
    assert entry.traceparent.split("-")[1] == f"{accept_span.context.trace_id:032x}"


async def test_the_delivery_continues_the_trace(make_outbox, spans):
    seen = {}

    async def deliver(entry, *, workspace_id, session_id, attempt):
        seen["span"] = trace.get_current_span().get_span_context()

    outbox = make_outbox(deliverer=deliver)
    with trace.get_tracer("test").start_as_current_span("request") as request_span:
        entry = await outbox.aaccept(WS, SES, user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once(WS, SES)
    finished = {s.name: s for s in spans.get_finished_spans()}
    step, settle = finished["outbox.deliver"], finished["outbox.settle"]
    trace_id = request_span.get_span_context().trace_id
    assert step.context.trace_id == trace_id == settle.context.trace_id
    assert step.parent.span_id == finished["outbox.accept"].context.span_id
    assert [link.context.span_id for link in step.links] == [step.parent.span_id]
    assert settle.parent.span_id == step.context.span_id
    assert seen["span"].span_id == step.context.span_id  # the deliverer runs inside it
    assert step.attributes["outbox.entry_id"] == entry.id
    assert step.attributes["outbox.attempt"] == 1
    assert step.attributes["outbox.outcome"] == "delivered"
    assert settle.attributes["outbox.outcome"] == "delivered"
    await outbox.aclose()


@pytest.mark.slow
def test_one_trace_from_the_request_to_the_worker_process(admin_client, valkey, spans, tmp_path):
    """The accept over HTTP here, the delivery by ``outbox_worker`` in another process."""
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("HTTP POST") as request_span:
        response = admin_client.post(
            reverse("django_outbox:api-messages", args=[WS, SES]),
            {"clientMessageID": "c1", "text": SECRET_TEXT},
            content_type="application/json",
        )
    assert response.status_code == 202, response.content
    exported = tmp_path / "spans.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUTBOX_VALKEY_URL": valkey,
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.otel_worker",
        "OUTBOX_TEST_SPANS": str(exported),
    }
    done = subprocess.run(
        [sys.executable, "-m", "django", "outbox_worker", "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    worker_spans = [json.loads(line) for line in exported.read_text().splitlines()]
    (step,) = [s for s in worker_spans if s["name"] == "outbox.deliver"]
    trace_id = f"0x{request_span.get_span_context().trace_id:032x}"
    assert step["context"]["trace_id"] == trace_id
    assert step["attributes"]["outbox.outcome"] == "delivered"
    (accept_span,) = [s for s in spans.get_finished_spans() if s.name == "outbox.accept"]
    assert step["parent_id"] == f"0x{accept_span.context.span_id:016x}"
    everything = json.dumps(worker_spans) + json.dumps(
        [dict(s.attributes) for s in spans.get_finished_spans()]
    )
    assert SECRET_TEXT not in everything


async def test_a_verification_is_its_own_span_naming_the_session(make_outbox, spans):
    """An answer lost mid-delivery is verified later: the ``outbox.verify`` span, a
    consumer like the delivery's, carries the same names (docs/howto/observe.md#tracing)."""

    async def deliver(entry, **kwargs):
        raise AmbiguousError("the reply was lost")

    async def verify(entry, *, workspace_id, session_id):
        return Verdict.DELIVERED

    outbox = make_outbox(deliverer=deliver, verifier=verify, verify_delay=0)
    entry = await outbox.aaccept("ws-a", "ses-b", user_id="u", client_message_id="k", text="t")
    assert await outbox.adeliver_once("ws-a", "ses-b")
    assert await outbox.adeliver_once("ws-a", "ses-b")
    finished = {s.name: s for s in spans.get_finished_spans()}
    accepted, step, verified = (finished[f"outbox.{n}"] for n in ("accept", "deliver", "verify"))
    assert accepted.kind is trace.SpanKind.PRODUCER
    assert step.kind is verified.kind is trace.SpanKind.CONSUMER
    names = {"outbox.workspace_id": "ws-a", "outbox.session_id": "ses-b"}
    for span in (accepted, step, verified):
        assert {k: span.attributes[k] for k in names} == names
    assert verified.attributes["outbox.entry_id"] == entry.id
    assert verified.parent.span_id == accepted.context.span_id
    assert verified.attributes["outbox.outcome"] == "delivered"
    await outbox.aclose()
