"""Settings for worker processes that deliver to two HTTP agents and the recording agent
(docs/howto/agents.md): the servers' URLs come from ``OUTBOX_TEST_NORTH`` and
``OUTBOX_TEST_SOUTH``; sessions whose ID starts with ``n`` go north, ``s`` south, others to
the default agent, ``tests/support/agents.py`` (``tests.support.http_agent.route``).
``entry_delivered`` is recorded in Valkey (``tests.support.recorder``)."""

import os

from tests.support.settings.base import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.recorder"]  # noqa: F405
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}


def _agent(url: str) -> dict:
    return {
        "DELIVERER": "django_outbox.delivery.http.deliver",
        "VERIFIER": "django_outbox.delivery.http.verify",
        "SEND_URL": url + "/w/{workspace_id}/s/{session_id}/prompts",
        "VERIFY_URL": url + "/prompts/{idempotency_key}",
        "TIMEOUT": 60,
    }


OUTBOX = {
    "DELIVERER": "tests.support.agents.deliver",
    "VERIFIER": "tests.support.agents.verify",
    "AGENTS": {
        "north": _agent(os.environ.get("OUTBOX_TEST_NORTH", "http://127.0.0.1:9")),
        "south": _agent(os.environ.get("OUTBOX_TEST_SOUTH", "http://127.0.0.1:9")),
    },
    "ROUTER": "tests.support.http_agent.route",
    "LOCK_TTL": float(os.environ.get("OUTBOX_TEST_LOCK_TTL", "30")),
    "RETRY_BACKOFF": 0.05,
    "MAX_BACKOFF": 0.2,
    "VERIFY_DELAY": 0,
    "VERIFY_BACKOFF": 0.05,
    "MAX_VERIFY_BACKOFF": 0.2,
    "MAX_ATTEMPTS": 50,
    "MAX_TRANSIENT_FAILURES": 50,
}

if os.environ.get("OUTBOX_TEST_LANGGRAPH_URL"):
    OUTBOX["AGENTS"]["graph"] = {
        "DELIVERER": "django_outbox.delivery.langgraph.deliver",
        "VERIFIER": "django_outbox.delivery.langgraph.verify",
        "ABORTER": "django_outbox.delivery.langgraph.abort",
        "URL": os.environ["OUTBOX_TEST_LANGGRAPH_URL"],
        "ASSISTANT_ID": "echo",
    }
    # A run creation still on its way is not yet in the run search: verify a bit later
    # (docs/howto/langgraph.md#outcomes).
    OUTBOX["VERIFY_DELAY"] = 0.5
