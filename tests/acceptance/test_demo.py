"""The demo (``make demo``): its smoke run end to end, and the launcher's risky pieces.

``test_smoke_run`` runs exactly what ``make demo ARGS=--smoke`` runs (``python -m
example_project.run --smoke``) as a subprocess with a deadline: an embedded Valkey, the
fake agent, uvicorn and an ``outbox_worker`` under one parent, a scripted client that
disconnects mid-POST, resends a duplicate, has the agent cut a reply and SIGKILLs the
worker, then checks the agent's transcripts.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys

import httpx
import pytest

from example_project.fake_agent import FakeAgent
from example_project.stack import Stack, StackError, check_port
from tests.support.demo import DemoProcess, children_of, demo_env, run_smoke, running
from tests.support.paths import ROOT
from tests.support.valkey import wait_until

SMOKE_DEADLINE = 150.0  # seconds for the whole smoke subprocess (it takes ~10 s)

pytestmark = pytest.mark.slow


# -- the smoke run ------------------------------------------------------------------------


def test_smoke_run(tmp_path):
    """`make demo ARGS=--smoke`: nothing lost, duplicated or misordered; well under 2 min."""
    code, output, took = run_smoke(tmp_path, deadline=SMOKE_DEADLINE)
    assert code is not None, f"the smoke run did not finish within {SMOKE_DEADLINE}s"
    assert code == 0, output
    assert "smoke: OK" in output
    for label in ("A2", "A4", "B2", "B4", "C2"):  # duplicate, kill, disconnects, cut reply
        assert re.search(rf"^{label}\s.*delivered", output, re.M), label
    # verified, then sent: seen as "sent", or as "finished" when the smoke's own dropped
    # event was that one and a resync found the entry gone (the smoke loses events on purpose)
    assert re.search(r"^C2\s.*verifying>(sent|finished)", output, re.M)
    assert took < 120, f"the smoke run took {took:.0f}s"


def test_smoke_run_on_the_http_agent(tmp_path):
    """`make demo AGENT=http ARGS=--smoke`: the same run through django_outbox.delivery.http
    to the demo's in-house agent (example_project/http_agent.py, docs/howto/http-agent.md),
    plus a 429 with Retry-After and a Stop mid-turn through the abort URL: every prompt in
    the agent's transcript once and in order, none sent again with a stored
    Idempotency-Key."""
    code, output, took = run_smoke(tmp_path, "--agent", "http", deadline=SMOKE_DEADLINE)
    assert code is not None, f"the smoke run did not finish within {SMOKE_DEADLINE}s"
    assert code == 0, output
    assert "smoke: OK" in output
    # the SIGKILLed delivery was found by the verifier's GET, not sent again
    assert re.search(r"^A4\s.*delivered \(verified\); worker \d+ SIGKILLed", output, re.M)
    for label in ("A2", "B2", "B4"):  # the duplicate and the vanished POSTs
        assert re.search(rf"^{label}\s.*delivered", output, re.M), label
    assert re.search(r"^C2\s.*verifying>(sent|finished)", output, re.M)  # cut after store
    # held, then taken: two POSTs (verified first when a loaded worker lost its lease)
    assert re.search(r"^C3\s.*delivered.*; agent answered 429.*\s2\s", output, re.M)
    # stopped: its turn was cut through the abort URL, then verified delivered (interrupted)
    assert re.search(r"^C4\s.*delivered \(verified\); Stop mid-turn", output, re.M)
    assert took < 120, f"the smoke run took {took:.0f}s"


# -- the launcher ---------------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_launcher_stops_everything(tmp_path, signum):
    """Ctrl-C (SIGINT) or SIGTERM stops every child (worker first) and exits 0."""
    demo = DemoProcess(tmp_path, "--latency", "0.1").start()
    try:
        assert demo.proc is not None
        kids = children_of(demo.proc.pid)
        assert len(kids) == 4, demo.log()  # valkey, agent, web, worker
        r = httpx.get(f"{demo.url}/accounts/login/", timeout=10)
        assert r.status_code == 200
        demo.proc.send_signal(signum)
        assert demo.proc.wait(40) == 0, demo.log()
        assert not [k for k in kids if running(k)], demo.log()
        log = demo.log()
        order = [log.index(f"demo: {name} stopped") for name in ("worker", "web", "agent")]
        assert order == sorted(order), log
        assert log.index("demo: agent stopped") < log.index("demo: valkey stopped")
        assert not (demo.data_dir / "demo.pid").exists()
    finally:
        demo.stop()


def test_children_die_with_a_killed_parent(tmp_path):
    """A SIGKILLed launcher leaves nothing running (PR_SET_PDEATHSIG)."""
    script = (
        "import os, sys, time\n"
        "from example_project.stack import Stack\n"
        f"stack = Stack(data_dir={str(tmp_path)!r}, quiet=True)\n"
        "child = stack.spawn('sleeper', [sys.executable, '-c', 'import time; time.sleep(120)'],"
        " env=dict(os.environ))\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=demo_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert running(child)
        parent.kill()
        parent.wait(10)
        wait_until(lambda: not running(child), 10, message="the orphan is killed")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_port_in_use_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(StackError, match=rf"port {port} on 127\.0\.0\.1 is in use"):
            check_port(port)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "example_project.run",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "demo"),
            ],
            cwd=ROOT,
            env=demo_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 2
    assert f"port {port} on 127.0.0.1 is in use" in proc.stderr
    assert "--port" in proc.stderr
    assert check_port(0) > 0


def test_one_demo_per_data_folder(tmp_path):
    first = Stack(data_dir=tmp_path)
    first.acquire()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "demo.pid").write_text(str(other.pid))  # as if another launcher held it
        with pytest.raises(StackError, match=f"another demo \\(pid {other.pid}\\)"):
            Stack(data_dir=tmp_path).acquire()
    finally:
        other.kill()
        other.wait(10)
    second = Stack(data_dir=tmp_path)  # a stale pid file is taken over
    second.acquire()
    assert (tmp_path / "demo.pid").read_text() == str(os.getpid())
    second.release()
    assert not (tmp_path / "demo.pid").exists()


# -- the fake agent ----------------------------------------------------------------------------


async def _serve(agent: FakeAgent):
    server = await asyncio.start_server(agent.serve, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _close(server: asyncio.Server, agent: FakeAgent) -> None:
    server.close()
    await agent.close_connections()
    await server.wait_closed()


async def test_fake_agent_rules_and_transcript(tmp_path):
    """A cut-after-store prompt is in the transcript though the client got no answer; a
    one-shot rule is used once; the transcript survives a restart."""
    state = tmp_path / "transcript.json"
    agent = FakeAgent(state_path=state, password="pw", latency=0.01)
    server, url = await _serve(agent)
    try:
        async with httpx.AsyncClient(base_url=url, auth=("opencode", "pw"), timeout=5) as c:
            assert (await c.get("/global/health")).json()["healthy"] is True
            sid = (await c.post("/session", json={})).json()["id"]
            assert sid.startswith("ses_")
            r = await c.post(
                "/_fake/control", json={"rules": [{"match": "two", "action": "cut_after_store"}]}
            )
            assert r.json()["rules"][0]["times"] == 1
            ok = await c.post(
                f"/session/{sid}/message",
                json={"parts": [{"type": "text", "text": "one"}], "messageID": "msg_1"},
            )
            assert ok.status_code == 200 and ok.json()["info"]["role"] == "assistant"
            with pytest.raises(httpx.RemoteProtocolError):
                await c.post(
                    f"/session/{sid}/message",
                    json={"parts": [{"type": "text", "text": "two"}], "messageID": "msg_2"},
                )
            assert (await c.get(f"/session/{sid}/message/msg_2")).json()["parts"][0][
                "text"
            ] == "two"
            again = await c.post(  # the rule was one-shot; a resend appends, like opencode
                f"/session/{sid}/message",
                json={"parts": [{"type": "text", "text": "two"}], "messageID": "msg_2"},
            )
            assert again.status_code == 200
            knobs = (await c.get("/_fake/control")).json()
            assert knobs["rules"] == [] and knobs["posts"] == {"one": 1, "two": 2}
            assert (await c.get("/session/nope/message")).status_code == 500
            assert (await c.get("/session/ses_unknown/message")).status_code == 404
            assert (await c.get("/global/health", auth=("opencode", "wrong"))).status_code == 401
    finally:
        await _close(server, agent)
    reborn = FakeAgent(state_path=state, password=None, latency=0.01)
    users = [m for m in reborn.transcripts[sid] if m["info"]["role"] == "user"]
    assert [[p["text"] for p in m["parts"]] for m in users] == [["one"], ["two", "two"]]


async def test_the_http_agent_honours_the_key_verifies_and_aborts(tmp_path):
    """The demo's in-house HTTP agent (example_project/http_agent.py): a key stored once is
    answered 200 and not run again, the verify URL says 200/404, the abort URL ends the
    running turn, a "busy" rule answers 429 with Retry-After before storing."""
    from example_project.http_agent import HttpAgent

    agent = HttpAgent(state_path=tmp_path / "t.json", password="pw", latency=0.01)
    server, url = await _serve(agent)
    base = "/agent/w/demo/s/ses_1"
    try:
        async with httpx.AsyncClient(base_url=url, auth=("opencode", "pw"), timeout=5) as c:
            key = {"Idempotency-Key": "e1"}
            first = await c.post(f"{base}/prompts", json={"text": "one"}, headers=key)
            assert first.status_code == 201 and first.json() == {"id": "e1"}
            again = await c.post(f"{base}/prompts", json={"text": "one"}, headers=key)
            assert again.status_code == 200 and again.json()["duplicate"] is True
            assert (await c.get(f"{base}/prompts/e1")).status_code == 200
            assert (await c.get(f"{base}/prompts/e2")).status_code == 404
            assert (await c.post(f"{base}/prompts", json={"text": "x"})).status_code == 400
            await c.post(
                "/_fake/control",
                json={"rules": [{"match": "two", "action": "busy", "seconds": 3}]},
            )
            busy = await c.post(
                f"{base}/prompts", json={"text": "two"}, headers={"Idempotency-Key": "e2"}
            )
            assert busy.status_code == 429 and busy.headers["retry-after"] == "3"
            assert (await c.get(f"{base}/prompts/e2")).status_code == 404  # not stored
            await c.post("/_fake/control", json={"latency": 30})
            started = asyncio.get_running_loop().time()
            turn = asyncio.create_task(
                c.post(f"{base}/prompts", json={"text": "long"}, headers={"Idempotency-Key": "e3"})
            )
            await wait_for_status(c, f"{base}/prompts/e3", 200)  # stored, its turn runs
            assert (await c.post(f"{base}/abort")).status_code == 202
            assert (await turn).status_code == 201
            assert asyncio.get_running_loop().time() - started < 10  # not its 30 s
            knobs = (await c.get("/_fake/control")).json()
            assert knobs["replays"] == {"one": 1} and knobs["posts"]["two"] == 1
            users = [
                m["parts"][0]["text"]
                for m in (await c.get("/session/ses_1/message")).json()
                if m["info"]["role"] == "user"
            ]
            assert users == ["one", "long"]
    finally:
        await _close(server, agent)


async def wait_for_status(client: httpx.AsyncClient, path: str, status: int) -> None:
    async with asyncio.timeout(10):
        while (await client.get(path)).status_code != status:
            await asyncio.sleep(0.02)
