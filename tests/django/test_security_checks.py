"""The security system checks (README "System checks", "Security"): W007 (the access policy
does not say it checks the session's workspace), W008 (the outbox WebSocket is routed
without an origin validator), W009 (the check cannot tell) and W011 (its origin validator
admits every Origin)."""

import pytest
from django.core import checks
from django.test import override_settings

from django_outbox.policy import session_scoped

GOOD = {
    "DELIVERER": "tests.support.agents.deliver",
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
}
LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def workspace_only(user, workspace_id, session_id, action):
    """Checks the workspace only: the kind of policy W007 is about."""
    return getattr(user, "username", None) == workspace_id


@session_scoped(lambda ws, ses: ses.startswith(ws))
def scoped(user, workspace_id, session_id, action):
    return getattr(user, "username", None) == workspace_id


class CheckedByHand:
    """A class-based policy that checks the session itself and says so."""

    checks_session_in_workspace = True

    def __call__(self, user, workspace_id, session_id, action):
        return False


checked_by_hand = CheckedByHand()


def ids(**outbox):
    return sorted(m.id for m in checks.run_checks(tags=["outbox"]))


def messages(**settings):
    with override_settings(**settings):
        return {m.id: m for m in checks.run_checks(tags=["outbox"])}


def test_a_policy_that_does_not_say_it_checks_the_session_warns(valkey):
    found = messages(
        OUTBOX={**GOOD, "ACCESS_POLICY": "tests.django.test_security_checks.workspace_only"}
    )
    assert list(found) == ["django_outbox.W007"]
    assert "session_scoped" in found["django_outbox.W007"].hint


@pytest.mark.parametrize(
    "policy",
    [
        "tests.django.test_security_checks.scoped",
        "tests.django.test_security_checks.checked_by_hand",
        "example_project.demo.policy.workspace_members",
    ],
)
def test_a_policy_that_checks_the_session_passes(valkey, policy):
    assert messages(OUTBOX={**GOOD, "ACCESS_POLICY": policy}) == {}


def test_the_default_policy_gets_w001_not_w007(valkey):
    assert sorted(messages(OUTBOX={"DELIVERER": "tests.support.agents.deliver"})) == [
        "django_outbox.W001"
    ]


def test_a_policy_that_does_not_import_gets_e002_not_w007(valkey):
    found = messages(OUTBOX={**GOOD, "ACCESS_POLICY": "tests.nope.policy"})
    assert sorted(found) == ["django_outbox.E002"]


def asgi(name: str) -> list[str]:
    found = messages(OUTBOX=GOOD, ASGI_APPLICATION=name, CHANNEL_LAYERS=LAYERS)
    return sorted(found)


@pytest.mark.parametrize(
    "app",
    [
        "guarded",
        "explicit_origins",
        "hidden_but_guarded",
        "other_consumer_only",
        "no_websocket",
        "http",
    ],
)
def test_an_origin_validated_or_absent_consumer_passes(valkey, app):
    assert asgi(f"tests.support.asgi.origin.{app}") == []


@pytest.mark.parametrize(
    "app", ["unguarded", "guard_inside_auth_only_for_one_route", "behind_app_middleware"]
)
def test_a_consumer_route_without_an_origin_validator_warns(valkey, app):
    assert asgi(f"tests.support.asgi.origin.{app}") == ["django_outbox.W008"]


def test_a_layer_the_check_cannot_see_through_warns_that_it_cannot_tell(valkey):
    found = messages(
        OUTBOX=GOOD, ASGI_APPLICATION="tests.support.asgi.origin.hidden", CHANNEL_LAYERS=LAYERS
    )
    assert sorted(found) == ["django_outbox.W009"]
    assert "closure_middleware.<locals>.app" in found["django_outbox.W009"].msg


def test_an_asgi_application_that_does_not_import_warns_that_it_cannot_tell(valkey):
    assert asgi("tests.nope.application") == ["django_outbox.W009"]


def test_no_asgi_application_no_origin_message(valkey):
    assert messages(OUTBOX=GOOD) == {}


def test_the_example_project_passes(valkey):
    assert asgi("example_project.asgi.application") == []


def test_an_origin_validator_that_admits_every_origin_warns(valkey):
    found = messages(
        OUTBOX=GOOD, ASGI_APPLICATION="tests.support.asgi.origin.any_origin", CHANNEL_LAYERS=LAYERS
    )
    assert sorted(found) == ["django_outbox.W011"]
    assert "admits every Origin" in found["django_outbox.W011"].msg


def test_a_strict_validator_inside_an_open_one_still_guards(valkey):
    assert asgi("tests.support.asgi.origin.open_around_strict") == []


def test_allowed_hosts_star_under_the_allowed_hosts_validator_warns(valkey):
    found = messages(
        OUTBOX=GOOD,
        ASGI_APPLICATION="tests.support.asgi.origin.allowed_hosts_now",
        CHANNEL_LAYERS=LAYERS,
        ALLOWED_HOSTS=["*"],
    )
    assert sorted(found) == ["django_outbox.W011"]
    assert "ALLOWED_HOSTS" in found["django_outbox.W011"].hint
    listed = messages(
        OUTBOX=GOOD,
        ASGI_APPLICATION="tests.support.asgi.origin.allowed_hosts_now",
        CHANNEL_LAYERS=LAYERS,
        ALLOWED_HOSTS=["example.com"],
    )
    assert listed == {}


def test_an_open_validator_in_front_of_another_consumer_only_passes(valkey):
    assert asgi("tests.support.asgi.origin.open_for_another_consumer_only") == []
