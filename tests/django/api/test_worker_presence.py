"""``GET .../sessions/<ses>/worker/``: whether a worker is alive, from the heartbeats a real
worker writes (docs/howto/frontend.md, "Is a worker running?"; docs/reference/rest.md)."""

from __future__ import annotations

import asyncio
import time

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from django_outbox import get_outbox
from django_outbox.core.entry import parse_time
from django_outbox.core.heartbeats import WorkerHeartbeat

pytestmark = pytest.mark.django_db

URL = "/outbox/api/workspaces/alice/sessions/s1/worker/"


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_the_worker_answer_follows_the_heartbeats_and_shows_nothing_else(django_user_model):
    viewer = django_user_model.objects.create_user("root", password=None, is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_outbox"))
    client = client_for(viewer)
    assert client.get(URL).json() == {"alive": False, "lastSeen": None}

    outbox = get_outbox()
    record = WorkerHeartbeat("w1", 0.0, host="secret-host", pid=4242, started=time.time())
    asyncio.run(_beat(outbox, record, ttl=0.5))
    answer = client.get(URL).json()
    assert answer["alive"] is True and set(answer) == {"alive", "lastSeen"}
    assert answer["lastSeen"].endswith("Z")
    assert "secret-host" not in str(answer) and "4242" not in str(answer)
    # The heartbeat expires: not alive, though it was seen lately.
    deadline = time.monotonic() + 10
    while client.get(URL).json()["alive"]:
        assert time.monotonic() < deadline, "the heartbeat never expired"
        time.sleep(0.05)
    assert client.get(URL).json()["lastSeen"] == answer["lastSeen"]


async def _beat(outbox, record, ttl):
    try:
        await outbox.abeat(record, ttl)
    finally:
        await outbox.aclose()


def test_the_worker_answer_needs_the_view_action(django_user_model):
    stranger = django_user_model.objects.create_user("bob", password=None)
    assert client_for(stranger).get(URL).status_code == 403
    assert APIClient().get(URL).status_code in (401, 403)
    bad = "/outbox/api/workspaces/al%20ice/sessions/s1/worker/"
    assert client_for(stranger).get(bad).status_code == 400


def test_the_last_seen_time_is_the_heartbeats_own_on_the_server_clock(django_user_model):
    """``lastSeen`` is when the worker beat, as RFC 3339 UTC: a beat now reads as now, not
    as a time in 1970 or in the far future (seconds, not milli- or microseconds)."""
    viewer = django_user_model.objects.create_user("root", password=None, is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_outbox"))
    before = time.time()
    record = WorkerHeartbeat("w1", 0.0, host="h", pid=1, started=before)
    asyncio.run(_beat(get_outbox(), record, ttl=30))
    seen = parse_time(client_for(viewer).get(URL).json()["lastSeen"]) / 1_000_000
    assert before - 5 <= seen <= time.time() + 5
