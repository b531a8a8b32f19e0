"""Clients that go away while their POST is being accepted, under a real ASGI server."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter

import httpx
import pytest

from tests.support.disconnects import AUTH, asgi_server, check_resend, cut_post, settled
from tests.support.paths import ROOT
from tests.support.valkey import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def server(valkey, tmp_path):
    with asgi_server(valkey, tmp_path) as running:
        yield running


def test_50_clients_vanish_mid_post_and_nothing_splits(server, r, valkey):
    base, env, log, port = server.base, server.env, server.log, server.port
    path = "/outbox/api/workspaces/alice/sessions/s1/messages/"
    rng = random.Random(9)
    keys = [f"k{i}" for i in range(50)]
    # A complete request, then the client is gone 0-50 ms later: Basic auth's password hash
    # (~0.2 s) keeps each of these accepts running after its client left.
    for key in keys:
        body = json.dumps({"clientMessageID": key, "text": f"text {key}"}).encode()
        cut_post(port, path, body, rng.uniform(0, 0.05))
    answers = Counter()
    with httpx.Client(base_url=base, headers={"Authorization": AUTH}, timeout=10) as reader:
        # Accepts of clients that are already gone may still be running: wait for them (these
        # reads hash the password too, so they queue behind the accepts still hashing).
        stored = settled(
            lambda: {e["clientMessageID"]: e["id"] for e in reader.get(path).json()["entries"]}
        )
    # The resends log in through a session: a hash per resend would add nothing but time.
    with httpx.Client(base_url=base, headers=server.session, timeout=10) as client:
        for key in keys:
            reply = client.post(path, json={"clientMessageID": key, "text": f"text {key}"})
            answers[reply.status_code] += 1
            problem = check_resend(reply, stored.get(key))
            assert problem is None, f"{key}: {problem}"
        entries = client.get(path).json()["entries"]
    assert sorted(e["clientMessageID"] for e in entries) == sorted(keys)  # one entry per key
    assert b"Traceback" not in log.read_bytes()
    # the deliverer sees each text exactly once
    worker_env = {**env, "DJANGO_SETTINGS_MODULE": "tests.support.settings.worker"}
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
