"""The dashboard split by agent (docs/howto/observe.md#the-dashboard): with more than one
agent, the steps each agent served by outcome, from the per-minute history a real worker
wrote, a chart of one agent picked with ``?agent=``, and no error page for one agent, an
unknown name or a name in a workspace's view."""

from __future__ import annotations

import asyncio

import pytest

from django_outbox.core.agents import Agent
from django_outbox.core.entry import Verdict
from django_outbox.core.worker import Worker
from django_outbox.errors import AmbiguousError, HoldDeliveryError
from tests.support.helpers import NO_USER_BOUNDS, QUICK_PASSWORD_HASHERS, accept

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


DASHBOARD = "/admin/django_outbox/outboxentry/dashboard/"


def clock() -> float:
    return 1_900_000_020.0  # 20 s into a minute: the run and the reading share it


def route(workspace_id: str, session_id: str) -> str:
    return "north" if session_id.startswith("n") else "south"


async def north(entry, **kwargs) -> None:
    """Takes every prompt."""


async def south(entry, **kwargs) -> None:
    """Refuses "fails" for good, is busy for "busy" (held a minute), does not know for
    "maybe" (then verified absent), takes the rest."""
    if entry.text == "maybe":
        raise AmbiguousError("cut mid-flight")
    if entry.text == "fails":
        raise RuntimeError("refused")
    if entry.text == "busy":
        raise HoldDeliveryError("busy", retry_after=60)


async def absent(entry, **kwargs) -> Verdict:
    return Verdict.ABSENT


def run_worker(outbox) -> None:
    async def run():
        worker = Worker(outbox, None, concurrency=4, tick=0.05, stop=asyncio.Event(), once=True)
        await worker.run()
        await outbox.asample_history("test-sampler")
        await outbox.aclose()

    asyncio.run(run())


@pytest.fixture
def two_agents(make_outbox, monkeypatch):
    outbox = make_outbox(
        max_attempts=1,
        verify_delay=0,
        clock=clock,
        agents={"north": Agent("north", north, absent), "south": Agent("south", south, absent)},
        router=route,
        **NO_USER_BOUNDS,
    )
    accept(outbox, "k1", "one", ses="n1")
    accept(outbox, "k2", "two", ses="n2")
    accept(outbox, "k3", "fails", ses="s1")
    accept(outbox, "k4", "busy", ses="s2")
    accept(outbox, "k5", "fine", ses="s3")
    accept(outbox, "k6", "maybe", ses="s4")
    run_worker(outbox)
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)
    return outbox


def cells(response) -> dict[str, dict[str, int]]:
    columns = response.context["agent_columns"]
    return {
        row["name"]: dict(zip(columns, row["cells"], strict=True))
        for row in response.context["agents"]
    }


def test_each_agents_steps_by_outcome(two_agents, admin_client):
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200
    assert cells(response) == {
        "north": {"delivered": 2, "failed": 0, "held": 0, "unknown": 0, "lost": 0},
        "south": {"delivered": 1, "failed": 2, "held": 1, "unknown": 1, "lost": 0},
    }  # south's failed: "fails", and "maybe" verified absent (a verify step)
    assert [row["steps"] for row in response.context["agents"]] == [2, 5]
    page = response.content.decode()
    assert 'id="outbox-agents"' in page and 'id="chart-agent"' not in page
    assert f'href="{DASHBOARD}?window=hour&amp;agent=south"' in page
    # kept in the total only: a workspace's own history has no agent fields
    for minute in two_agents.history(60, "w1").minutes:
        assert not minute.agent_steps()
    assert two_agents.history(60).agent_steps()["south"] == {
        "delivered": 1,
        "failed": 1,
        "held": 1,
        "ambiguous": 1,
        "absent": 1,
    }


def test_one_agents_chart(two_agents, admin_client):
    response = admin_client.get(DASHBOARD, {"agent": "south", "window": "day"})
    assert response.status_code == 200 and response.context["agent"] == "south"
    page = response.content.decode()
    assert 'id="chart-agent"' in page and "Steps of agent south" in page
    for series in ("delivered", "failed", "held"):  # one point a ten minutes: the last
        assert f'<circle class="s-{series}"' in page or f'data-series="{series}"' in page
    assert '<tr class="selected">' in page
    assert "agent=south" in response.context["refresh_query"]  # the refresh keeps it


@pytest.mark.parametrize("name", ["nope", "<script>alert(1)</script>", "x" * 500, "north "])
def test_an_unknown_agent_is_said_and_every_agent_shown(two_agents, admin_client, name):
    response = admin_client.get(DASHBOARD, {"agent": name})
    assert response.status_code == 200
    assert response.context["agent"] in (None, "north")  # "north " is "north", stripped
    page = response.content.decode()
    if response.context["agent"] is None:
        assert "Showing every agent." in page and 'id="chart-agent"' not in page
    assert "<script>alert(1)" not in page
    assert 'id="outbox-agents"' in page


def test_a_workspaces_view_says_agents_are_over_every_workspace(two_agents, admin_client):
    response = admin_client.get(DASHBOARD, {"agent": "north", "workspace": "w1"})
    assert response.status_code == 200 and response.context["agent"] is None
    page = response.content.decode()
    assert "kept over every workspace only" in page and 'id="outbox-agents"' not in page


def test_one_agent_has_no_table_and_its_chart_on_request(make_outbox, monkeypatch, admin_client):
    outbox = make_outbox(clock=clock, deliverer=north, **NO_USER_BOUNDS)
    accept(outbox, "k1", "one")
    run_worker(outbox)
    monkeypatch.setattr("django_outbox.admin.get_outbox", lambda: outbox)
    response = admin_client.get(DASHBOARD)
    assert response.status_code == 200 and response.context["agents"] == []
    assert 'id="outbox-agents"' not in response.content.decode()
    chart = admin_client.get(DASHBOARD, {"agent": "default"})
    assert chart.status_code == 200 and chart.context["agent"] == "default"
    assert 'id="chart-agent"' in chart.content.decode()
    assert admin_client.get(DASHBOARD, {"agent": "south"}).context["agent"] is None
