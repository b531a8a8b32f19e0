"""OpenTelemetry tracing, when the ``otel`` extra is installed (docs/howto/observe.md#tracing).

An accept runs in an ``outbox.accept`` span and records the current W3C trace context
(``traceparent``) in the entry; the worker's ``outbox.deliver`` / ``outbox.verify``
span of that entry is a child of it, and links to it, so one prompt is one trace from
the HTTP request that accepted it to the deliverer call that delivered it, across
processes. Each step's ``outbox.settle`` span is the step's child. Attributes name the
workspace, session, entry, attempt and outcome, never the prompt's text.

Without ``opentelemetry-api``, or with the API but no tracer provider set (no SDK
configured), everything here is a no-op that costs a type check: the hot paths do
not pay for tracing nobody collects.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import Any

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # optional: pip install django-outbox[otel]
    trace = None  # type: ignore[assignment]

TRACER_NAME = "django_outbox"
#: The entry member that carries the accept's trace context (docs/explanation/storage.md).
TRACEPARENT = "traceparent"

_propagator = TraceContextTextMapPropagator() if trace is not None else None
_recording = False
#: A provider named by the environment is loaded by the first get_tracer_provider() call.
_PROVIDER_FROM_ENVIRONMENT = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ


def enabled() -> bool:
    """Whether spans are recorded: ``opentelemetry-api`` is importable and a tracer
    provider has been set (an SDK configured), not the API's default proxy or no-op."""
    global _recording
    if _recording or trace is None:
        return _recording
    # get_tracer_provider() reads the environment on every call until a provider is set
    # (a microsecond on the accept path); the API keeps the provider it was given here.
    if getattr(trace, "_TRACER_PROVIDER", True) is None and not _PROVIDER_FROM_ENVIRONMENT:
        return False
    provider = trace.get_tracer_provider()
    # A process sets its tracer provider once (the API refuses a second): remember it.
    _recording = not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)
    return _recording


def current_traceparent() -> str | None:
    """The W3C ``traceparent`` of the current span, or None (no tracing, no valid span)."""
    if _propagator is None or not enabled():
        return None
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    return carrier.get(TRACEPARENT)


def accept_span(workspace_id: str, session_id: str) -> Any:
    """A context manager: the ``outbox.accept`` span (a no-op without OpenTelemetry)."""
    if trace is None or not enabled():
        return _NO_SPAN
    return trace.get_tracer(TRACER_NAME).start_as_current_span(
        "outbox.accept",
        kind=trace.SpanKind.PRODUCER,
        attributes={"outbox.workspace_id": workspace_id, "outbox.session_id": session_id},
    )


#: What the span functions return when nothing is recorded: entered, it gives None.
_NO_SPAN = nullcontext()


def step_span(
    step: str,
    traceparent: str | None,
    workspace_id: str,
    session_id: str,
    entry_id: str,
    attempt: int,
) -> Any:
    """A context manager: the ``outbox.<step>`` span of one delivery or verification
    (``step``: ``"deliver"`` or ``"verify"``), a child of the accept's context
    ``traceparent`` (and linked to it) when there is one. Entered, it gives the span
    (None without OpenTelemetry); set the outcome with :func:`record`."""
    if trace is None or _propagator is None or not enabled():
        return _NO_SPAN  # (the worker's hot path: nothing made per message)
    parent = None
    links = []
    if traceparent:
        parent = _propagator.extract({TRACEPARENT: traceparent})
        accepted = trace.get_current_span(parent).get_span_context()
        if accepted.is_valid:
            links.append(trace.Link(accepted))
    return trace.get_tracer(TRACER_NAME).start_as_current_span(
        f"outbox.{step}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "outbox.workspace_id": workspace_id,
            "outbox.session_id": session_id,
            "outbox.entry_id": entry_id,
            "outbox.attempt": attempt,
        },
    )


def settle_span(outcome: str) -> Any:
    """A context manager: the ``outbox.settle`` span recording ``outcome``."""
    if trace is None or not enabled():
        return _NO_SPAN
    return trace.get_tracer(TRACER_NAME).start_as_current_span(
        "outbox.settle", attributes={"outbox.outcome": outcome}
    )


def record(span: Any, **attributes: str | int) -> None:
    """Set ``outbox.<name>`` attributes on ``span`` (None: nothing to do)."""
    if span is not None:
        for name, value in attributes.items():
            span.set_attribute(f"outbox.{name}", value)
