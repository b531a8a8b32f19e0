"""``make demo AGENT=langgraph ARGS=--smoke`` end to end: the demo stack delivering to a real
``langgraph dev`` (the echo graph of tests/support/langgraph_app), a scripted client that
resends a duplicate, vanishes mid-POST and SIGKILLs the worker while a run is going, then
reads every session's thread: each prompt there exactly once, in order
(docs/howto/langgraph.md#try-it)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.demo import demo_env, run_smoke
from tests.support.langgraph_server import ensure_installed
from tests.support.paths import ROOT

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


def test_the_demo_on_langgraph_cuts_turns_with_the_langgraph_aborter():
    """``make demo AGENT=langgraph``: Stop and Send now on the queue page call the LangGraph
    aborter, which cancels the run (docs/howto/langgraph.md#stop-and-interrupt); the
    opencode one would ask the LangGraph server for an opencode session and cut nothing."""
    code = (
        "import django; django.setup()\n"
        "from django_outbox import get_outbox\n"
        "aborter = get_outbox().aborter_for('w', 's')\n"
        "print(aborter.__module__ + '.' + aborter.__name__)\n"
    )
    env = {
        **demo_env(),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DEMO_AGENT_KIND": "langgraph",
        "DEMO_AGENT_URL": "http://127.0.0.1:9",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["django_outbox.delivery.langgraph.abort"]


@pytest.mark.parametrize(
    ("kind", "says", "not_said"),
    [
        ("langgraph", "LangGraph Agent Server", "opencode serve"),
        ("opencode", "opencode serve", "LangGraph"),
        ("http", "In-house HTTP agent", "opencode serve"),
    ],
)
def test_the_demo_page_describes_the_agent_actually_running(kind, says, not_said):
    """The queue page's agent panel names the agent the demo delivers to: with
    ``AGENT=langgraph`` it said "the real opencode serve"."""
    code = (
        "import django; django.setup()\n"
        "from django.template.loader import render_to_string\n"
        "from example_project.demo.agent import kind\n"
        "page = {'agentKind': kind(), 'controlsAgent': False}\n"
        "print(render_to_string('demo/queue.html', {'page': page, 'session': 's1'}))\n"
    )
    env = {
        **demo_env(),
        "DJANGO_SETTINGS_MODULE": "example_project.settings",
        "DEMO_AGENT_KIND": kind,
        "DEMO_AGENT_URL": "http://127.0.0.1:9",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    panel = proc.stdout.split('id="agent-panel"', 1)[1].split("</section>", 1)[0]
    assert says in panel and not_said not in panel
