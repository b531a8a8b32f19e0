"""Another project takes this project's key space over (``outbox claim --force``) while
this project's worker process and web process run: the worker stops delivering and
exits 1 saying why, the web process refuses accepts (503, nothing stored), each within
seconds, and nothing accepted before is lost
(docs/howto/valkey.md#taking-a-key-space-over)."""

from __future__ import annotations

import json
import time

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox import Status, get_outbox
from django_outbox.core.owner import CLAIM_RECHECK, KeySpaceOwner
from tests.support.helpers import accept
from tests.support.valkey import wait_until
from tests.support.workers import Workers

#: The bound a takeover promises: this project stops delivering and accepting within it.
WITHIN = 5.0
#: The other project, as its process would build its outbox.
OTHER = KeySpaceOwner("another-secret-key-digest", label="other.settings")
#: Accepts in a quick loop: the per-user bounds are not what these tests are about.
UNBOUNDED = {
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
    "USER_ACCEPTS_PER_MINUTE": 0,
    "USER_ACCEPTS_PER_MINUTE_ALL": 0,
    "USER_MAX_QUEUED": 0,
    "CAP": 1000,
}


def test_the_running_worker_process_stops_within_seconds_and_exits_1(
    valkey, r, tmp_path, make_outbox
):
    workers = Workers(valkey, tmp_path, OUTBOX_TEST_TURN="60")  # each turn stays in flight
    proc = workers.start("--grace", "60")
    try:
        mine = get_outbox()
        workers.wait_running(mine)
        entry = accept(mine, "in flight")
        wait_until(lambda: r.sismember("test:sent", entry.id), 10, message="delivering")

        make_outbox(key_space_owner=OTHER).claim_key_space(force=True)
        taken = time.monotonic()
        wait_until(lambda: proc.poll() is not None, WITHIN, message=workers.logs)
        stopped_after = time.monotonic() - taken
    finally:
        workers.stop_all()
    assert stopped_after <= WITHIN
    assert proc.returncode == 1
    log = workers.logs()
    assert "outbox_worker stopped: the outbox key space 'outbox'" in log
    assert "'other.settings'" in log
    # the delivery in flight was cut, not lost: its entry waits for the owner to verify it
    [held] = mine.list("w1", "s1")
    assert held.id == entry.id
    assert held.status is Status.VERIFYING


def post(client, key: str):
    return client.post(
        "/outbox/api/workspaces/alice/sessions/s1/messages/",
        json.dumps({"clientMessageID": key, "text": key}),
        content_type="application/json",
    )


@pytest.fixture
def alice(django_user_model):
    client = APIClient()
    client.force_login(django_user_model.objects.create_user("alice", password=None))
    return client


@pytest.mark.django_db
def test_the_web_process_refuses_accepts_within_seconds(valkey, alice, make_outbox):
    with override_settings(OUTBOX=UNBOUNDED):
        assert post(alice, "before").status_code == 202
        make_outbox(key_space_owner=OTHER).claim_key_space(force=True)
        taken = time.monotonic()
        accepted = ["before"]
        deadline = taken + WITHIN
        while True:
            key = f"k{len(accepted)}"
            response = post(alice, key)
            if response.status_code != 202:
                break
            accepted.append(key)
            assert time.monotonic() < deadline, "accepts still answered 202"
            time.sleep(0.2)  # the next request of a client, not a wait for a condition
        refused_after = time.monotonic() - taken
        assert refused_after <= WITHIN
        assert response.status_code == 503
        assert response.json()["code"] == "unavailable"
        assert response.json()["accepted"] is False
        assert post(alice, "again").status_code == 503
        # what was accepted before stays; what was refused was not stored
        stored = [e.client_message_id for e in get_outbox().list("alice", "s1")]
        assert stored == accepted


@pytest.mark.django_db
def test_an_accept_trusts_the_claim_for_one_recheck_then_reads_it_again(alice, make_outbox):
    """On the process's clock (injected): the claim confirmed by an accept is trusted for
    ``CLAIM_RECHECK`` seconds, then read again, so a takeover is seen by the first accept
    after that, whatever the traffic."""
    now = [1000.0]
    with override_settings(OUTBOX=UNBOUNDED):
        outbox = get_outbox()
        outbox.claim_clock = lambda: now[0]
        assert post(alice, "claims").status_code == 202
        make_outbox(key_space_owner=OTHER).claim_key_space(force=True)
        now[0] += CLAIM_RECHECK - 0.01
        assert post(alice, "trusted").status_code == 202  # within one recheck
        now[0] += 0.01
        response = post(alice, "refused")
        assert response.status_code == 503
        now[0] += 60  # refused from then on, not only once
        assert post(alice, "still refused").status_code == 503
        stored = [e.client_message_id for e in outbox.list("alice", "s1")]
        assert stored == ["claims", "trusted"]
