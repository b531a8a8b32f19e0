"""OUTBOX["AGENTS"] and OUTBOX["ROUTER"] (docs/howto/agents.md): the settings build the
process-wide outbox's agents, and the system checks name each unusable backend."""

import pytest
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox.conf import outbox_settings
from django_outbox.outbox import get_outbox

POLICY = "tests.support.policies.own_workspace"
AGENT = {"DELIVERER": "tests.support.agents.deliver", "VERIFIER": "tests.support.agents.verify"}


def route_by_session(workspace_id, session_id):
    return "beta" if session_id.startswith("b") else "alpha"


async def async_router(workspace_id, session_id):
    return "alpha"


def ids(**outbox):
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICY, **outbox}):
        return sorted(m.id for m in checks.run_checks(tags=["outbox"]))


def test_the_settings_build_each_agent_and_the_router(valkey):
    settings = {
        "AGENTS": {"alpha": {**AGENT, "TIMEOUT": 3}, "beta": {"DELIVERER": print}},
        "ROUTER": f"{__name__}.route_by_session",
        "ACCESS_POLICY": POLICY,
    }
    with override_settings(OUTBOX=settings):
        outbox = get_outbox()
        alpha = outbox.agent_for("w", "a1")
        assert alpha.name == "alpha" and alpha.verifier.__name__ == "verify"
        assert dict(alpha.options) == {"TIMEOUT": 3}
        assert outbox.agent_for("w", "b1").deliverer is print
        assert outbox.agent_for("w", "b1").verifier is None
        assert outbox.deliverer is None  # the single DELIVERER is not set
        assert ids(**{k: v for k, v in settings.items() if k != "ACCESS_POLICY"}) == []


def test_agents_without_a_deliverer_do_not_warn_that_nothing_delivers(valkey):
    assert ids(AGENTS={"alpha": AGENT}) == []
    assert ids() == ["django_outbox.W002"]


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ([1], "OUTBOX['AGENTS'] must be a dict"),
        ({"a b": AGENT}, "is not an agent name"),
        ({"alpha": "x"}, "OUTBOX['AGENTS']['alpha'] must be a dict"),
        ({"alpha": {"VERIFIER": "x.y"}}, "['DELIVERER'] is required"),
        ({"alpha": {"DELIVERER": 3}}, "['DELIVERER'] must be a callable or a dotted path"),
        ({"alpha": AGENT, "beta": AGENT}, "several agents and none is the default"),
    ],
)
def test_a_malformed_agents_setting_is_refused_naming_the_key(agents, message):
    with override_settings(OUTBOX={"AGENTS": agents}):
        with pytest.raises(ImproperlyConfigured, match=message.replace("[", r"\[")):
            outbox_settings()
    assert ids(AGENTS=agents) == ["django_outbox.E001"]


def test_a_default_agent_defined_twice_is_refused():
    with override_settings(OUTBOX={"DELIVERER": print, "AGENTS": {"default": AGENT}}):
        with pytest.raises(ImproperlyConfigured, match="both define the default agent"):
            outbox_settings()


@pytest.mark.parametrize(
    "entry",
    [
        {"DELIVERER": "tests.nope.deliver"},
        {"DELIVERER": print, "VERIFIER": "django_outbox.policy.ACTIONS"},
        {"DELIVERER": print, "ABORTER": "tests.nope.abort"},
    ],
)
def test_an_agent_whose_callables_do_not_import_or_call_is_e008(valkey, entry):
    assert ids(AGENTS={"alpha": entry}) == ["django_outbox.E008"]
    with override_settings(OUTBOX={"AGENTS": {"alpha": entry}}):
        with pytest.raises(ImproperlyConfigured, match=r"OUTBOX\['AGENTS'\]\['alpha'\]"):
            get_outbox()


def test_a_router_must_import_and_must_not_be_async(valkey):
    agents = {"alpha": AGENT, "beta": AGENT}
    assert ids(AGENTS=agents, ROUTER="tests.nope.route") == ["django_outbox.E002"]
    assert ids(AGENTS=agents, ROUTER=f"{__name__}.async_router") == ["django_outbox.E008"]


def test_the_http_agents_settings_are_checked_at_start_up(valkey):
    entry = {
        "DELIVERER": "django_outbox.delivery.http.deliver",
        "VERIFIER": "django_outbox.delivery.http.verify",
        "SEND_URL": "http://127.0.0.1:9/{session_id}",
    }
    assert ids(AGENTS={"web": {**entry, "VERIFY_URL": "http://127.0.0.1:9/{entry_id}"}}) == []
    assert ids(AGENTS={"web": entry}) == ["django_outbox.E008"]  # verify needs VERIFY_URL
    typo = {**entry, "VERIFY_URL": "http://127.0.0.1:9/{entry}"}
    with override_settings(OUTBOX={"AGENTS": {"web": typo}}):
        with pytest.raises(ImproperlyConfigured, match=r"\['VERIFY_URL'\] uses unknown"):
            get_outbox()


def test_an_http_aborter_without_its_url_is_e008_naming_the_key(valkey):
    """The ABORTER of an entry checks the entry's settings as its DELIVERER and VERIFIER do:
    the HTTP agent's abort needs ABORT_URL, said by ``check``, not by the first cut."""
    entry = {
        "DELIVERER": "django_outbox.delivery.http.deliver",
        "VERIFIER": "django_outbox.delivery.http.verify",
        "ABORTER": "django_outbox.delivery.http.abort",
        "SEND_URL": "http://127.0.0.1:9/{session_id}",
        "VERIFY_URL": "http://127.0.0.1:9/{entry_id}",
    }
    with_url = {**entry, "ABORT_URL": "http://127.0.0.1:9/{session_id}/abort"}
    assert ids(AGENTS={"web": with_url}) == []
    with override_settings(OUTBOX={"ACCESS_POLICY": POLICY, "AGENTS": {"web": entry}}):
        errors = [m for m in checks.run_checks(tags=["outbox"]) if m.id == "django_outbox.E008"]
    assert len(errors) == 1 and "ABORT_URL" in errors[0].msg
