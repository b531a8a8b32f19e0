"""A real ``opencode serve`` for tests (tests/opencode, the agent conformance suite).

The pinned npm package ``opencode-ai@1.18.33`` is installed into the repo's git-ignored
``.opencode/`` by ``scripts/install-opencode.sh`` (run here if missing; skipped with a
reason when ``npm`` is not on PATH). Each server runs from a git-initialised temp work dir
with HOME (and XDG dirs) in a temp dir, on a free loopback port, in its own process group
(killed at teardown). No LLM provider is configured, so a prompt's turn never ends.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.paths import ROOT as REPO
from tests.support.valkey import free_port

OPENCODE = REPO / ".opencode" / "node_modules" / ".bin" / "opencode"
INSTALL = REPO / "scripts" / "install-opencode.sh"
START_DEADLINE = 45.0  # seconds for `opencode serve` to answer /global/health


def _ensure_installed() -> Path:
    if OPENCODE.exists():
        return OPENCODE
    if shutil.which("npm") is None:
        pytest.skip("npm is not on PATH, so opencode-ai cannot be installed (needs Node.js)")
    print(f"installing opencode with {INSTALL} ...")
    proc = subprocess.run([str(INSTALL)], capture_output=True, text=True, timeout=600, check=False)
    print(proc.stdout, proc.stderr)
    if proc.returncode != 0 or not OPENCODE.exists():
        pytest.fail(f"{INSTALL} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return OPENCODE


class OpencodeServer:
    """One ``opencode serve`` process in its own process group."""

    def __init__(self, root: Path, password: str | None = None) -> None:
        self.root = root
        self.password = password
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.auth = None if password is None else ("opencode", password)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / "opencode.log"
        self.startup_seconds = 0.0
        self._started = 0.0

    def spawn(self) -> OpencodeServer:
        """Start ``opencode serve`` without waiting for it (:meth:`ready` waits), so two
        servers can start side by side."""
        binary = _ensure_installed()
        if shutil.which("git") is None:
            pytest.skip("git is not on PATH (opencode wants a git work dir)")
        home, work = self.root / "home", self.root / "work"
        home.mkdir()
        work.mkdir()
        subprocess.run(["git", "init", "-q", str(work)], check=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("OPENCODE_", "XDG_")) and not k.endswith("_API_KEY")
        }
        env.update(
            HOME=str(home),
            XDG_CONFIG_HOME=str(home / ".config"),
            XDG_DATA_HOME=str(home / ".local" / "share"),
            XDG_STATE_HOME=str(home / ".local" / "state"),
            XDG_CACHE_HOME=str(home / ".cache"),
        )
        if self.password is not None:
            env["OPENCODE_SERVER_PASSWORD"] = self.password
        self._started = time.monotonic()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(binary), "serve", "--port", str(self.port), "--hostname", "127.0.0.1"],
                cwd=work,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def ready(self) -> OpencodeServer:
        """Wait (``START_DEADLINE``) until the spawned server is healthy, then warm it up."""
        self._wait_healthy(self._started)
        self.startup_seconds = time.monotonic() - self._started
        print(f"opencode serve up on {self.base_url} in {self.startup_seconds:.2f}s")
        self.warm_up()
        return self

    def _wait_healthy(self, started: float) -> None:
        # Short per-request timeouts: a request that arrives while opencode is still
        # starting can be accepted and then never answered (seen on 1.18.33).
        limits = httpx.Timeout(1.0, connect=0.5)
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                pytest.fail(f"opencode serve exited {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(f"{self.base_url}/global/health", auth=self.auth, timeout=limits)
                if r.status_code == 200 and r.json().get("healthy") is True:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() - started > START_DEADLINE:
                self.stop()
                pytest.fail(f"opencode serve not healthy after {START_DEADLINE}s:\n{self.log()}")
            time.sleep(0.1)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        except ProcessLookupError:
            self.proc.wait(timeout=5)

    def warm_up(self) -> None:
        """Send one prompt and wait until it is stored: the first prompt after a start is
        slow to persist (0.8 to 1.3 s measured, later ones about 0.1 s)."""
        sid = httpx.post(f"{self.base_url}/session", json={}, auth=self.auth, timeout=10).json()
        started = time.monotonic()
        try:
            httpx.post(
                f"{self.base_url}/session/{sid['id']}/message",
                json={"parts": [{"type": "text", "text": "warm up"}]},
                auth=self.auth,
                timeout=0.2,
            )
        except httpx.ReadTimeout:
            pass  # expected: the turn never ends
        while time.monotonic() - started < START_DEADLINE:
            listed = httpx.get(
                f"{self.base_url}/session/{sid['id']}/message", auth=self.auth, timeout=10
            ).json()
            if any(m["info"]["role"] == "user" for m in listed):
                print(f"first prompt stored after {time.monotonic() - started:.2f}s")
                return
            time.sleep(0.02)
        pytest.fail("opencode did not store the warm-up prompt")

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, auth=self.auth, timeout=10)

    async def new_session(self) -> str:
        async with self._client() as c:
            r = await c.post("/session", json={})
        r.raise_for_status()
        sid = r.json()["id"]
        assert sid.startswith("ses_")
        return sid

    async def transcript(self, sid: str) -> list[dict]:
        async with self._client() as c:
            r = await c.get(f"/session/{sid}/message")
        r.raise_for_status()
        return r.json()

    async def user_messages(self, sid: str) -> list[tuple[str, list[str]]]:
        return [
            (m["info"]["id"], [p["text"] for p in m["parts"] if p["type"] == "text"])
            for m in await self.transcript(sid)
            if m["info"]["role"] == "user"
        ]

    async def wait_for_parts(self, sid: str, count: int) -> None:
        """Wait (deadline 10 s) until the user messages hold ``count`` text parts in all."""
        deadline = time.monotonic() + 10
        while sum(len(texts) for _, texts in await self.user_messages(sid)) < count:
            assert time.monotonic() < deadline, await self.user_messages(sid)
            await asyncio.sleep(0.02)
