"""Settings for worker processes that deliver to a real LangGraph server
(tests/langgraph): the built-in LangGraph backend on ``OUTBOX_TEST_LANGGRAPH_URL``,
graph ``echo`` (tests/support/langgraph_app), the rest as ``worker.py``."""

import os

from tests.support.settings.worker import *  # noqa: F403

OUTBOX = {
    **OUTBOX,  # noqa: F405
    "DELIVERER": "django_outbox.delivery.langgraph.deliver",
    "VERIFIER": "django_outbox.delivery.langgraph.verify",
    # A run creation still on its way is not yet in the run search: verify a bit later.
    "VERIFY_DELAY": 0.5,
    "LANGGRAPH": {
        "URL": os.environ.get("OUTBOX_TEST_LANGGRAPH_URL", "http://127.0.0.1:2024"),
        "ASSISTANT_ID": "echo",
    },
}
