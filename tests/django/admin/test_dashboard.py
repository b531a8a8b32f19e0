"""The admin dashboard (README "Dashboard"): where it is, who may see it, what it
draws from a run with real deliveries, and its refresh fragment. The browser test is in
tests/browser/test_browser_dashboard.py."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.urls import reverse

from django_outbox.admin.dashboard import BOTTOM, FRAGMENT_HEADER, HEIGHT, Series, line_chart
from django_outbox.core.entry import Verdict
from django_outbox.core.worker import Worker
from tests.support.admin import ALL_PERMS, login, staff
from tests.support.helpers import NO_USER_BOUNDS, QUICK_PASSWORD_HASHERS, accept

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


DASHBOARD = "/admin/django_outbox/outboxentry/dashboard/"


def clock() -> float:
    return 1_900_000_020.0


def deliver_some(outbox, n: int = 5, fail: int = 2) -> None:
    """Accept ``n`` prompts (the first ``fail`` fail for good) and run a worker until idle."""
    for i in range(n):
        accept(outbox, f"k{i}", "fails" if i < fail else f"prompt {i}", ses=f"s{i}")

    async def agent(entry, **kwargs):
        if entry.text == "fails":
            raise RuntimeError("refused")

    async def run():
        worker = Worker(outbox, agent, concurrency=4, tick=0.05, stop=asyncio.Event(), once=True)
        await worker.run()
        await outbox.asample_history("test-sampler")
        await outbox.aclose()

    asyncio.run(run())


@pytest.fixture
def delivered(make_outbox, monkeypatch):
    # Valkey's clock as the scripts and the admin see it stands still 20 s into a
    # minute, so the run and the reading share one minute whenever the test runs.
    outbox = make_outbox(max_attempts=1, clock=clock, **NO_USER_BOUNDS)
    deliver_some(outbox)
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)
    return outbox


def test_the_url_name_and_the_links_to_it(admin_client):
    assert reverse("admin:django_outbox_outboxentry_dashboard") == DASHBOARD
    changelist = admin_client.get("/admin/django_outbox/outboxentry/").content.decode()
    assert f'href="{DASHBOARD}"' in changelist
    index = admin_client.get("/admin/").content.decode()
    assert "/admin/django_outbox/outboxdashboard/" in index and "Outbox dashboard" in index
    response = admin_client.get("/admin/django_outbox/outboxdashboard/")
    assert response.status_code == 302 and response["Location"] == DASHBOARD


def test_it_needs_the_view_permission(django_user_model):
    nobody = login(staff(django_user_model))  # staff without outbox permissions
    assert nobody.get(DASHBOARD).status_code == 403
    assert nobody.get("/admin/django_outbox/outboxdashboard/").status_code == 403
    viewer = login(staff(django_user_model, "view_outboxentry"))
    assert viewer.get(DASHBOARD).status_code == 200
    assert viewer.post(DASHBOARD).status_code == 405


def test_it_charts_a_run_with_real_deliveries(delivered, django_user_model):
    client = login(staff(django_user_model, *ALL_PERMS))
    response = client.get(DASHBOARD)
    assert response.status_code == 200
    page = response.content.decode()
    tiles = dict(response.context["tiles"])
    assert tiles["accepted"] == "5" and tiles["delivered"] == "3"
    assert tiles["failed attempts"] == "2" and tiles["moved to error"] == "2"
    assert tiles["in error now"] == "2"
    for chart in ("throughput", "latency", "depth", "overdue"):
        assert f'id="chart-{chart}"' in page
    # The current minute carries the run: the throughput lines end above the zero line;
    # latency and depth exist in that minute only (one sample, one delivery minute): a dot.
    baseline = HEIGHT - BOTTOM
    for series in ("accepted", "delivered", "failed"):
        points = re.search(rf'data-series="{series}" points="([^"]+)"', page).group(1).split()
        assert len(points) == 60
        assert float(points[-1].split(",")[1]) < baseline
        assert float(points[0].split(",")[1]) == baseline
    assert re.search(r'<circle class="s-p50"', page)
    assert re.search(r'<circle class="s-error"', page)
    assert "test-sampler" not in page  # a sampler is not a worker row
    assert "Needing attention (2)" in page  # the two sessions in error


def test_the_day_window_and_the_refresh_fragment(delivered, admin_client):
    day = admin_client.get(DASHBOARD + "?window=day")
    assert day.status_code == 200 and day.context["window"] == "day"
    assert (
        'data-refresh-url="/admin/django_outbox/outboxentry/dashboard/?window=day&amp;fragment=1"'
        in (day.content.decode())
    )
    fragment = admin_client.get(DASHBOARD + "?window=day&fragment=1").content.decode()
    assert 'id="chart-latency"' in fragment and "<html" not in fragment
    # dashboard.js swaps in only a response marked as the fragment (not a login page).
    assert admin_client.get(DASHBOARD + "?fragment=1")[FRAGMENT_HEADER] == "1"
    assert FRAGMENT_HEADER not in admin_client.get(DASHBOARD)
    odd = admin_client.get(DASHBOARD + "?window=<script>")
    assert odd.status_code == 200 and odd.context["window"] == "hour"


def test_one_workspace(delivered, admin_client):
    accept(delivered, "other", "elsewhere", ws="w2")
    whole = admin_client.get(DASHBOARD)
    assert dict(whole.context["tiles"])["accepted"] == "6"
    one = admin_client.get(DASHBOARD + "?workspace=w1&window=day")
    assert one.status_code == 200 and one.context["title"] == "Workspace w1"
    tiles = dict(one.context["tiles"])
    assert tiles["accepted"] == "5" and tiles["delivered"] == "3"
    assert tiles["in error now"] == "2" and tiles["queued now"] == "0"  # read now, not sampled
    page = one.content.decode()
    assert 'id="chart-throughput"' in page and 'id="chart-depth"' not in page
    assert {row["workspace_id"] for row in one.context["attention"]} == {"w1"}
    assert "?window=day&amp;workspace=w1&amp;fragment=1" in page  # the refresh keeps both
    other = admin_client.get(DASHBOARD + "?workspace=w2")
    assert dict(other.context["tiles"])["accepted"] == "1"
    assert other.context["attention"] == [] and "Needing attention (0)" in other.content.decode()


def test_a_bad_workspace_is_said_and_every_workspace_shown(admin_client):
    response = admin_client.get(DASHBOARD, {"workspace": "<script>alert(1)</script>"})
    assert response.status_code == 200 and response.context["workspace_id"] is None
    page = response.content.decode()
    assert "Showing every workspace." in page
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page


def test_unreachable_valkey_is_a_clear_503(admin_client, monkeypatch):
    from django_outbox import conf
    from django_outbox.outbox import reset_outbox

    monkeypatch.setenv("OUTBOX_VALKEY_URL", "redis://127.0.0.1:9/0")
    conf.reset()
    reset_outbox()
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 503
    assert "Valkey cannot be read" in response.content.decode()
    fragment = admin_client.get(DASHBOARD + "?fragment=1")
    assert fragment.status_code == 503 and "Valkey cannot be read" in fragment.content.decode()
    assert fragment[FRAGMENT_HEADER] == "1"  # swapped in: it says why there is nothing


def test_the_chart_escapes_and_breaks_lines_at_gaps():
    svg = str(
        line_chart(
            [Series("delivered", [1.0, 2.0, None, 4.0, 5.0])],
            ["00:00", "00:01", "00:02", "00:03", "00:04"],
            title='<b>"x"</b>',
        )
    )
    assert svg.count("<polyline") == 2  # the gap splits the line
    assert "<b>" not in svg and "&lt;b&gt;" in svg
    empty = str(line_chart([Series("p50", [None, None])], ["a", "b"], title="t", log=True))
    assert "<polyline" not in empty and "<svg" in empty


def test_prompts_that_expired_unsent_are_counted(make_outbox, monkeypatch, admin_client):
    now = [1_900_000_020.0]
    outbox = make_outbox(clock=lambda: now[0], **NO_USER_BOUNDS)
    outbox.accept("w1", "s1", user_id="u", client_message_id="k1", text="stale", expires_after=1)
    outbox.accept("w1", "s2", user_id="u", client_message_id="k2", text="fresh")
    now[0] += 5

    async def never(entry, **kwargs):
        raise AssertionError("an expired prompt was sent")

    async def run():
        try:
            await outbox.adeliver_once("w1", "s1", deliverer=never)  # the claim expires it
            await outbox.asample_history("test-sampler")
        finally:
            await outbox.aclose()

    asyncio.run(run())
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)
    assert dict(admin_client.get(DASHBOARD).context["tiles"])["expired now"] == "1"
    one = dict(admin_client.get(DASHBOARD + "?workspace=w1").context["tiles"])
    assert (one["expired now"], one["queued now"]) == ("1", "1")


def test_a_stop_and_a_cancellation_are_counted_apart_from_failures(
    make_outbox, monkeypatch, admin_client
):
    """A member's Stop (docs/howto/cutting.md): the turn it cut is a stopped turn, the prompt
    it proved never delivered a cancellation, and neither a failed attempt nor an unknown
    outcome, in the tiles and on the throughput chart."""
    outbox_box: list = []

    async def deliver(entry, **kwargs):  # the Stop arrives before anything is sent
        assert await outbox_box[0].acut("w1", "s1", entry.id) is not None
        raise RuntimeError("nothing sent: the turn was cut")

    async def abort(entry, **kwargs):
        return None

    async def verify(entry, **kwargs):
        return Verdict.ABSENT

    outbox = make_outbox(
        deliverer=deliver, verifier=verify, aborter=abort, clock=clock, **NO_USER_BOUNDS
    )
    outbox_box.append(outbox)
    accept(outbox, "k1", "stopped")
    queued = accept(outbox, "k2", "cancelled while queued")
    outbox.cancel("w1", "s1", queued.id)

    async def run():
        try:
            await outbox.adeliver_once("w1", "s1")
        finally:
            await outbox.aclose()

    asyncio.run(run())
    assert outbox.list("w1", "s1") == []
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)
    page = admin_client.get(DASHBOARD)
    tiles = dict(page.context["tiles"])
    assert (tiles["stopped turns"], tiles["cancelled"]) == ("1", "2")
    assert (tiles["failed attempts"], tiles["unknown outcomes"]) == ("0", "0")
    throughput = str(page.context["charts"]["throughput"])
    assert "s-cut" in throughput and "s-cancelled" in throughput
