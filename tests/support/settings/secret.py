"""Settings for worker processes whose agent URL carries credentials (test_redaction.py).

The opencode deliverer and verifier on ``OUTBOX_TEST_OPENCODE_URL`` (credentials in the URL),
``OUTBOX_TEST_OPENCODE_PASSWORD`` as ``PASSWORD`` when set; the rest as
``tests.support.settings.worker``.
"""

import os

from tests.support.settings.worker import *  # noqa: F403

OUTBOX = {
    **OUTBOX,  # noqa: F405
    "DELIVERER": "django_outbox.delivery.opencode.deliver",
    "VERIFIER": "django_outbox.delivery.opencode.verify",
    "OPENCODE": {
        "BASE_URL": os.environ.get("OUTBOX_TEST_OPENCODE_URL", "http://127.0.0.1:4096"),
        "PASSWORD": os.environ.get("OUTBOX_TEST_OPENCODE_PASSWORD"),
        "CONNECT_TIMEOUT": 1,
    },
}
