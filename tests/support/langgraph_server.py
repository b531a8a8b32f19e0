"""A real LangGraph Agent Server for tests: ``langgraph dev`` (the in-memory runtime of
``langgraph-cli[inmem]``) serving tests/support/langgraph_app on a free loopback port.

It runs from ``.venv-langgraph`` (``make langgraph``; the pyproject extra
``langgraph-server``), its own environment because langgraph-api's pins clash with the
test extra's (docs/howto/langgraph.md). Built here if missing; a test is skipped, with
the installer's output, only when it cannot be built. The server needs no network and
no model: the graph echoes (see ``echo_graph.py``). Each server runs in a temporary
copy of the app (its ``.langgraph_api`` state stays out of the checkout), in its own
process group, and is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from django_outbox.testing import free_port
from tests.support.paths import ROOT

LANGGRAPH = ROOT / ".venv-langgraph" / "bin" / "langgraph"
#: Also looked for beside the running virtualenv: a copy of the tree (the mutation check's)
#: runs on the checkout's .venv and uses the checkout's .venv-langgraph too.
BESIDE_VENV = Path(sys.prefix).parent / ".venv-langgraph" / "bin" / "langgraph"
APP = Path(__file__).resolve().parent / "langgraph_app"
START_DEADLINE = 90.0  # seconds for `langgraph dev` to answer /ok
ASSISTANT = "echo"  # the graph's name in langgraph.json


def ensure_installed() -> Path:
    """The ``langgraph`` CLI of ``.venv-langgraph``, built with ``make langgraph`` if
    missing; skips the test (with the output) when it cannot be built."""
    for binary in (LANGGRAPH, BESIDE_VENV):
        if binary.exists():
            return binary
    proc = subprocess.run(
        ["make", "langgraph"], cwd=ROOT, capture_output=True, text=True, timeout=900, check=False
    )
    if proc.returncode != 0 or not LANGGRAPH.exists():
        pytest.skip(
            "the LangGraph server (make langgraph) could not be installed: "
            f"{(proc.stdout + proc.stderr)[-2000:]}"
        )
    return LANGGRAPH


class LangGraphServer:
    """One ``langgraph dev --no-browser --no-reload`` process on ``127.0.0.1:<port>``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "langgraph.log"
        self.startup_seconds = 0.0

    def start(self) -> LangGraphServer:
        binary = ensure_installed()
        app = self.root / "app"
        shutil.copytree(APP, app, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LANGSMITH_", "LANGCHAIN_")) and not k.endswith("_API_KEY")
        }
        # Nothing leaves the machine: no tracing, no analytics.
        env.update(LANGSMITH_TRACING="false", LANGGRAPH_CLI_NO_ANALYTICS="1")
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(binary),
                    "dev",
                    "--no-browser",
                    "--no-reload",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--n-jobs-per-worker",
                    "10",
                ],
                cwd=app,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._wait_ready(started)
        self.startup_seconds = time.monotonic() - started
        return self

    def _wait_ready(self, started: float) -> None:
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"langgraph dev exited {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > START_DEADLINE:
                self.stop()
                pytest.fail(f"langgraph dev did not answer /ok in {START_DEADLINE}s:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM the server's process group, then SIGKILL it after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    # -- what the tests read on the server ------------------------------------------

    def runs(self, thread_id: str) -> list[dict]:
        """Every run on ``thread_id``, oldest first ([] when the thread does not exist)."""
        response = httpx.get(f"{self.url}/threads/{thread_id}/runs", params={"limit": 1000})
        if response.status_code == 404:
            return []
        response.raise_for_status()
        return list(reversed(response.json()))

    def create_thread(self) -> str:
        """A new thread made on the server (as an app would, for a conversation); its ID."""
        response = httpx.post(f"{self.url}/threads", json={})
        response.raise_for_status()
        return response.json()["thread_id"]

    def thread(self, thread_id: str) -> dict:
        response = httpx.get(f"{self.url}/threads/{thread_id}")
        response.raise_for_status()
        return response.json()

    def messages(self, thread_id: str) -> list[tuple[str, str]]:
        """The thread's messages as ``(type, content)`` pairs (``human``/``ai``); [] when
        the thread does not exist."""
        response = httpx.get(f"{self.url}/threads/{thread_id}/state")
        if response.status_code == 404:
            return []
        response.raise_for_status()
        values = response.json().get("values") or {}
        return [(m["type"], m["content"]) for m in values.get("messages", [])]


def worker_thread(workspace_id: str, session_id: str) -> str:
    """The thread a settings-driven worker of the test settings (``langgraph_worker``, or an
    ``AGENTS`` entry of this process) uses for a session: its ID carries the project's
    key-space owner (the test settings' ``SECRET_KEY`` and ``KEY_PREFIX``, shared by the
    worker processes)."""
    from django_outbox.delivery.langgraph import thread_id_for
    from django_outbox.outbox import key_space_owner

    return thread_id_for(workspace_id, session_id, project=key_space_owner().id)
