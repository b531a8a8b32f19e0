"""A prompt accepted into a parked workspace is stored parked, and every answer says so at
once: the Python return, the REST 202 and the live update (docs/explanation/lifecycle.md,
"Parking a workspace"). A reload is not needed to learn the truth."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import Permission
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox import get_outbox
from django_outbox.ws.routing import websocket_urlpatterns
from tests.support.helpers import aaccept, accept, redis_channel_layers

POLICY = "tests.support.policies.own_workspace"
ALICE = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False, username="alice")


def test_accept_into_a_parked_workspace_returns_a_parked_entry(outbox):
    before = accept(outbox, "before", ws="w")
    assert str(before.status) == "pending"
    outbox.park_workspace("w", "maintenance")
    entry = accept(outbox, "during", ws="w", ses="brand-new")
    assert (str(entry.status), entry.reason, entry.parked_from) == (
        "parked",
        "maintenance",
        "pending",
    )
    stored = outbox.list("w", "brand-new")[0]
    assert (str(stored.status), stored.reason) == (str(entry.status), entry.reason)


@pytest.mark.django_db
def test_the_202_of_a_prompt_accepted_into_a_parked_workspace_says_parked(django_user_model):
    user = django_user_model.objects.create_user("root", password=None, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_outbox"))
    client = APIClient()
    client.force_authenticate(user)
    get_outbox().park_workspace("alice", "maintenance")
    response = client.post(
        "/outbox/api/workspaces/alice/sessions/s1/messages/",
        json.dumps({"clientMessageID": "c1", "text": "hello"}),
        content_type="application/json",
    )
    assert response.status_code == 202, response.content
    data = response.json()
    assert (data["status"], data["reason"]) == ("parked", "maintenance")
    listed = client.get("/outbox/api/workspaces/alice/sessions/s1/messages/").json()
    assert [r["status"] for r in listed["entries"]] == ["parked"]


async def test_the_live_update_of_a_prompt_accepted_into_a_parked_workspace_says_parked(valkey):
    layers = redis_channel_layers(valkey, capacity=100, expiry=10)
    with override_settings(CHANNEL_LAYERS=layers, OUTBOX={"ACCESS_POLICY": POLICY}):
        comm = WebsocketCommunicator(
            URLRouter(websocket_urlpatterns), "/ws/outbox/workspaces/alice/sessions/s1/"
        )
        comm.scope["user"] = ALICE
        try:
            connected, _ = await comm.connect()
            assert connected
            snapshot = json.loads(await comm.receive_from(5))
            assert snapshot["type"] == "queue.snapshot"
            await get_outbox().apark_workspace("alice", "maintenance")
            await aaccept(get_outbox(), "during", ws="alice")
            update = json.loads(await comm.receive_from(5))
            assert update["type"] == "queue.update", update
            assert update["state"] == "parked", update
            assert (update["entry"]["status"], update["entry"]["reason"]) == (
                "parked",
                "maintenance",
            )
        finally:
            await comm.disconnect()
            await get_outbox().aclose()
            layer = get_channel_layer()
            await layer.flush()
            await layer.close_pools()
