"""Worker settings that export OpenTelemetry spans, one JSON object per line, to the file
named by ``OUTBOX_TEST_SPANS`` (tests/django/test_tracing.py reads them back)."""

import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

from tests.support.settings.worker import *  # noqa: F403

_provider = TracerProvider()
_provider.add_span_processor(
    SimpleSpanProcessor(
        ConsoleSpanExporter(
            out=open(os.environ["OUTBOX_TEST_SPANS"], "a"),
            formatter=lambda span: span.to_json(indent=None) + "\n",
        )
    )
)
trace.set_tracer_provider(_provider)
