"""Deliveries made with ``adeliver_once`` (a script or a test of the project's own, no
worker running) are counted in the history that ``manage.py outbox status`` reads, in a
separate ``manage.py`` process (docs/howto/observe.md; docs/reference/commands.md)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from tests.support.helpers import SES, WS, accept
from tests.support.paths import ROOT


def test_status_counts_deliveries_made_with_adeliver_once(outbox, valkey):
    accept(outbox, "a")
    accept(outbox, "b")

    async def deliver_both():
        try:
            for _ in range(2):
                assert await outbox.adeliver_once(WS, SES, deliverer=lambda entry, **kw: None)
        finally:
            await outbox.aclose()

    asyncio.run(deliver_both())  # no flush of our own, no worker: nothing else writes
    status = subprocess.run(
        [sys.executable, "-m", "django", "outbox", "status", "--json"],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
            "OUTBOX_VALKEY_URL": valkey,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    recent = json.loads(status.stdout)["recent"]
    assert (recent["accepted"], recent["delivered"]) == (2, 2), recent
