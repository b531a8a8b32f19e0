"""Two projects, each with its own ``SECRET_KEY`` and ``KEY_PREFIX``, share one channel
layer with its default prefix: neither's sockets ever see the other's frames, since every
group name the outbox uses carries the project's tag
(django_outbox/ws/publish.py, django_outbox/ws/revoke.py;
docs/howto/valkey.md#sharing-a-channel-layer)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from channels.layers import BaseChannelLayer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.outbox import get_outbox, key_space_tag
from django_outbox.ws.publish import group_name
from django_outbox.ws.revoke import user_group
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, redis_channel_layers

ALICE = SimpleNamespace(
    is_authenticated=True, is_active=True, is_staff=False, username="alice", pk=1
)
POLICY = "tests.support.policies.own_workspace"


def project(secret: str, prefix: str, **more) -> override_settings:
    """One project's settings: its own key and key space, on the shared layer."""
    return override_settings(
        SECRET_KEY=secret, OUTBOX={"KEY_PREFIX": prefix, "ACCESS_POLICY": POLICY}, **more
    )


async def socket_of_alice():
    comm = WebsocketCommunicator(
        URLRouter(websocket_urlpatterns), "/ws/outbox/workspaces/alice/sessions/s1/"
    )
    comm.scope["user"] = ALICE
    connected, _ = await comm.connect()
    assert connected
    assert json.loads(await comm.receive_from(5))["type"] == "queue.snapshot"
    return comm


async def test_a_projects_update_never_reaches_another_projects_socket(valkey):
    """The same workspace and session IDs in both projects, both watched, one layer with
    the default ``asgi`` prefix: project two's prompt reaches project two's socket only."""
    with override_settings(CHANNEL_LAYERS=redis_channel_layers(valkey)):
        with project("first-project-key", "one"):
            first = await socket_of_alice()
            await get_outbox().aclose()
        with project("second-project-key", "two"):
            second = await socket_of_alice()
            await aaccept(get_outbox(), "confidential", ws="alice", ses="s1")
            update = json.loads(await second.receive_from(5))
            assert update["entry"]["text"] == "confidential"
            await get_outbox().aclose()
        with project("first-project-key", "one"):
            await aaccept(get_outbox(), "own", ws="alice", ses="s1")
            # project one's own update comes first: project two's was never sent its way
            update = json.loads(await first.receive_from(5))
            assert update["entry"]["text"] == "own"
            await first.disconnect()
            await get_outbox().aclose()
        with project("second-project-key", "two"):
            await second.disconnect()
            await get_outbox().aclose()


def test_every_group_name_carries_the_project_and_fits_the_layer():
    layer = BaseChannelLayer()
    with project("first-project-key", "one"):
        first = (group_name("w" * 128, "s" * 128), user_group(42), key_space_tag())
    with project("second-project-key", "one"):
        other_key = (group_name("w" * 128, "s" * 128), user_group(42), key_space_tag())
    with project("first-project-key", "two"):
        other_prefix = (group_name("w" * 128, "s" * 128), user_group(42), key_space_tag())
    for names in (first, other_key, other_prefix):
        session, user, tag = names
        assert session == f"outbox.{tag}.{session.rsplit('.', 1)[1]}"
        assert user.startswith(f"outbox.user.{tag}.")
        assert layer.require_valid_group_name(session) and len(session) < 100
        assert layer.require_valid_group_name(user) and len(user) < 100
    assert len({first[0], other_key[0], other_prefix[0]}) == 3
    assert len({first[1], other_key[1], other_prefix[1]}) == 3
    assert "first-project-key" not in first[2]


def test_processes_of_one_deployment_name_the_same_groups():
    """A web process and a worker may run other settings modules: the same ``SECRET_KEY``
    and ``KEY_PREFIX`` name the same groups, so a rolling deploy keeps its updates."""
    with project("first-project-key", "one", SETTINGS_MODULE="web.settings"):
        web = (group_name("alice", "s1"), user_group(1))
    with project("first-project-key", "one", SETTINGS_MODULE="worker.settings"):
        worker = (group_name("alice", "s1"), user_group(1))
    assert web == worker
