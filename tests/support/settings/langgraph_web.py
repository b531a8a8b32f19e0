"""Settings for a web process (uvicorn, ``tests.support.disconnects.asgi_server``) in front of
a real LangGraph server (tests/langgraph): ``server.py`` with the built-in LangGraph backend
and its aborter on ``OUTBOX_TEST_LANGGRAPH_URL``, as a deployment's web and worker processes
share one ``OUTBOX`` (the worker side is ``langgraph_worker.py``)."""

import os

from tests.support.settings.server import *  # noqa: F403

OUTBOX = {
    **OUTBOX,  # noqa: F405
    "ACCESS_POLICY": "tests.support.policies.own_workspace_steering",
    "DELIVERER": "django_outbox.delivery.langgraph.deliver",
    "VERIFIER": "django_outbox.delivery.langgraph.verify",
    "ABORTER": "django_outbox.delivery.langgraph.abort",
    "LANGGRAPH": {
        "URL": os.environ.get("OUTBOX_TEST_LANGGRAPH_URL", "http://127.0.0.1:2024"),
        "ASSISTANT_ID": "echo",
    },
}
