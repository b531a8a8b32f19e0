"""Case 09: clients that go away while their POST is being accepted, under a real ASGI server."""

from __future__ import annotations

import base64
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from .valkey import free_port, wait_until

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
AUTH = "Basic " + base64.b64encode(b"alice:secret-pw").decode()


@pytest.fixture
def server(valkey, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.asgi_settings",
        "TEST_DB": str(tmp_path / "db.sqlite3"),
        "OUTBOX_VALKEY_URL": valkey,
    }
    manage = [sys.executable, "-m", "django"]
    subprocess.run([*manage, "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    subprocess.run(
        [
            *manage,
            "shell",
            "-c",
            "from django.contrib.auth.models import User; "
            "User.objects.create_user('alice', password='secret-pw')",
        ],
        cwd=ROOT,
        env=env,
        check=True,
    )
    port = free_port()
    log = open(tmp_path / "uvicorn.log", "wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.asgi_app:application",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    base = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base}/outbox/api/schema/", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 30, 0.1, message="uvicorn answers")
    yield base, env, tmp_path / "uvicorn.log"
    proc.terminate()
    proc.wait(10)


def raw_post(port: int, path: str, body: bytes) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {AUTH}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body


def test_50_clients_vanish_mid_post_and_nothing_splits(server, r, valkey):
    base, env, log = server
    port = int(base.rsplit(":", 1)[1])
    path = "/outbox/api/workspaces/alice/sessions/s1/messages/"
    rng = random.Random(9)
    keys = [f"k{i}" for i in range(50)]
    for key in keys:  # a complete request, then the client is gone 0-50 ms later
        body = json.dumps({"clientMessageID": key, "text": f"text {key}"}).encode()
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(raw_post(port, path, body))
            time.sleep(rng.uniform(0, 0.05))
    answers = Counter()
    with httpx.Client(base_url=base, headers={"Authorization": AUTH}, timeout=10) as client:
        listed = client.get(path).json()["entries"]
        stored = {e["clientMessageID"]: e["id"] for e in listed}
        for key in keys:
            reply = client.post(path, json={"clientMessageID": key, "text": f"text {key}"})
            answers[reply.status_code] += 1
            assert reply.status_code in (200, 202), reply.text
            if key in stored:
                assert reply.status_code == 200 and reply.json()["id"] == stored[key]
            else:
                assert reply.status_code == 202
        entries = client.get(path).json()["entries"]
    assert sorted(e["clientMessageID"] for e in entries) == sorted(keys)  # one entry per key
    assert b"Traceback" not in log.read_bytes()
    # the deliverer sees each text exactly once
    worker_env = {**env, "DJANGO_SETTINGS_MODULE": "tests.worker_settings"}
    done = subprocess.run(
        [sys.executable, "-m", "django", "outbox_worker", "--once"],
        cwd=ROOT,
        env=worker_env,
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    wait_until(lambda: r.llen("test:log") >= 50, 10, message="50 deliveries")
    assert sorted(r.lrange("test:log", 0, -1)) == sorted(f"s1 text {k}" for k in keys)
    print(f"second POSTs: {dict(answers)} (200 = the first one was stored)")
