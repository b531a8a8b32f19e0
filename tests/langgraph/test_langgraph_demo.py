"""``make demo AGENT=langgraph ARGS=--smoke`` end to end: the demo stack delivering to a real
``langgraph dev`` (the echo graph of tests/support/langgraph_app), a scripted client that
resends a duplicate, vanishes mid-POST and SIGKILLs the worker while a run is going, then
reads every session's thread: each prompt there exactly once, in order
(docs/howto/langgraph.md#try-it)."""

from __future__ import annotations

import re

import pytest

from tests.support.demo import run_smoke
from tests.support.langgraph_server import ensure_installed

SMOKE_DEADLINE = 180.0  # seconds for the whole smoke subprocess (it takes ~40 s)

pytestmark = pytest.mark.slow


def test_the_smoke_run_on_langgraph(tmp_path):
    ensure_installed()  # skips, with the reason, when the server cannot be installed
    code, output, took = run_smoke(tmp_path, "--agent", "langgraph", deadline=SMOKE_DEADLINE)
    assert code is not None, f"the smoke run did not finish within {SMOKE_DEADLINE}s"
    assert code == 0, output
    assert "smoke: OK" in output
    # The SIGKILLed delivery: its run was found on the thread, not sent again.
    assert re.search(r"^A3\s.*delivered \(verified\); worker \d+ SIGKILLed", output, re.M)
    for label in ("A2", "B2", "B4"):  # the duplicate and the vanished POSTs
        assert re.search(rf"^{label}\s.*delivered", output, re.M), label
    print(f"smoke on langgraph: {took:.1f}s")
