"""The dashboard's smaller figures, each read off the page a person sees: "queued now"
counts every entry still on its way (verifying ones too), a worker's steps per minute,
an hour on the latency axis, and an unknown ``?agent=`` echoed only in part
(docs/howto/observe.md#the-dashboard)."""

from __future__ import annotations

import asyncio

import pytest

from django_outbox.admin.dashboard import Series, line_chart
from django_outbox.core.heartbeats import HEARTBEAT_TTL, WorkerHeartbeat
from django_outbox.errors import AmbiguousError
from tests.support.helpers import NO_USER_BOUNDS, QUICK_PASSWORD_HASHERS, accept

pytestmark = pytest.mark.django_db

DASHBOARD = "/admin/django_outbox/outboxentry/dashboard/"


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


def test_queued_now_counts_entries_being_verified(make_outbox, monkeypatch, admin_client):
    # an answer that was lost: the entry waits to be verified (an hour away), not sent again
    async def lost(entry, **kwargs):
        raise AmbiguousError("the reply was lost")

    async def verify(entry, **kwargs):
        raise AssertionError("not verified yet: an hour away")

    outbox = make_outbox(deliverer=lost, verifier=verify, verify_delay=3600, **NO_USER_BOUNDS)
    accept(outbox, "k1", "lost reply", ses="s1")
    accept(outbox, "k2", "waiting", ses="s2")

    async def run():
        try:
            await outbox.adeliver_once("w1", "s1")
        finally:
            await outbox.aclose()

    asyncio.run(run())
    assert [str(e.status) for e in outbox.list("w1", "s1")] == ["verifying"]
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)

    tiles = dict(admin_client.get(DASHBOARD + "?workspace=w1").context["tiles"])

    assert tiles["queued now"] == "2"


def test_a_workers_steps_are_shown_per_minute(make_outbox, monkeypatch, admin_client, r):
    outbox = make_outbox()
    seconds, micros = r.time()
    started = seconds + micros / 1_000_000 - 180  # three minutes ago on Valkey's clock
    record = WorkerHeartbeat(
        "worker-1", 0.0, host="h", pid=1, started=started, in_flight=0, concurrency=1, steps=6
    )

    async def beat():
        try:
            await outbox.abeat(record, HEARTBEAT_TTL)
        finally:
            await outbox.aclose()

    asyncio.run(beat())
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)

    [worker] = admin_client.get(DASHBOARD).context["workers"]

    assert (worker["id"], worker["steps"], worker["per_minute"]) == ("worker-1", 6, "2.0")


def test_an_hour_on_the_latency_axis_reads_one_hour():
    svg = str(line_chart([Series("p99", [0.5, 3600.0])], ["00:00", "00:01"], title="t", log=True))
    assert ">1 h</text>" in svg and "60 min" not in svg
    svg = str(line_chart([Series("p99", [0.5, 60.0])], ["00:00", "00:01"], title="t", log=True))
    assert ">1 min</text>" in svg and ">60 s<" not in svg


def test_an_unknown_agent_is_echoed_cut_to_64_characters(admin_client, make_outbox, monkeypatch):
    outbox = make_outbox()
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)
    response = admin_client.get(DASHBOARD, {"agent": "é" * 63 + "xyz"})
    assert response.status_code == 200 and response.context["agent"] is None
    page = response.content.decode()
    assert "No agent named &#x27;" + "é" * 63 + "x&#x27; here." in page
    assert "é" * 63 + "xy" not in page
