"""django_outbox.E004 finds the project's ASGI module without ``ASGI_APPLICATION``, and the
logging origin validators satisfy django_outbox.W008 (README "System checks")."""

import pytest
from django.core import checks
from django.test import override_settings

GOOD = {
    "DELIVERER": "tests.support.agents.deliver",
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
}
LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def ids(**overrides):
    with override_settings(OUTBOX=GOOD, **overrides):
        return sorted(m.id for m in checks.run_checks(tags=["outbox"]))


def test_e004_next_to_the_settings_module(valkey, monkeypatch):
    """uvicorn mysite.asgi:application, no ASGI_APPLICATION: still an error."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.support.mysite.settings")
    assert ids() == ["django_outbox.E004"]
    assert ids(CHANNEL_LAYERS=LAYERS) == []


def test_e004_next_to_the_wsgi_application(valkey, monkeypatch):
    """Split settings (mysite.settings.production): WSGI_APPLICATION still names the
    project package."""
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.settings_split.production")
    assert ids() == []  # tests.settings_split.asgi does not exist: nothing to look at
    wsgi = "tests.support.mysite.wsgi.application"
    assert ids(WSGI_APPLICATION=wsgi) == ["django_outbox.E004"]
    assert ids(WSGI_APPLICATION=wsgi, CHANNEL_LAYERS=LAYERS) == []


def test_no_asgi_module_no_error(valkey):
    # tests.support.settings.base has no sibling asgi module and names no ASGI_APPLICATION
    assert ids() == []


def test_the_e004_message_says_what_clients_see(valkey, monkeypatch):
    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.support.mysite.settings")
    with override_settings(OUTBOX=GOOD):
        (found,) = [m for m in checks.run_checks(tags=["outbox"]) if m.id.endswith("E004")]
    assert "4500" in found.msg and "CHANNEL_LAYERS" in found.msg


@pytest.mark.parametrize("name", ["guarded", "explicit"])
def test_the_logging_validators_satisfy_w008(valkey, name):
    from channels.routing import ProtocolTypeRouter, URLRouter

    from django_outbox import checks as outbox_checks
    from django_outbox.ws import AllowedHostsOriginValidator, OriginValidator
    from django_outbox.ws.routing import websocket_urlpatterns

    routes = URLRouter(websocket_urlpatterns)
    inner = (
        AllowedHostsOriginValidator(routes)
        if name == "guarded"
        else OriginValidator(routes, ["https://example.com"])
    )
    out = outbox_checks._Routing()
    outbox_checks._walk(ProtocolTypeRouter({"websocket": inner}), False, frozenset(), out)
    assert out.consumer_routes == [True]
    assert (
        ids(ASGI_APPLICATION="tests.support.mysite.asgi.application", CHANNEL_LAYERS=LAYERS) == []
    )
