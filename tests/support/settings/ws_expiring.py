"""Settings of the WebSocket server of the fault suite's row 7 (tests/support/chaos.py):
``tests.support.settings.ws`` with channels-redis forgetting group members after
``OUTBOX_TEST_GROUP_EXPIRY`` seconds (standing in for a day) and short live-update
intervals, so day-old watchers and resync floods fit in the row's window."""

import os

from tests.support.settings.ws import *  # noqa: F403
from tests.support.settings.ws import CHANNEL_LAYERS, OUTBOX

CHANNEL_LAYERS["default"]["CONFIG"]["group_expiry"] = int(
    os.environ.get("OUTBOX_TEST_GROUP_EXPIRY", "86400")
)
OUTBOX = {**OUTBOX, "WS_CHECK_INTERVAL": 0.5, "WS_RESYNC_INTERVAL": 0.5, "WS_RESYNC_BUDGET": 30}
