"""Which changes push a revocation to a user's sockets, and when
(docs/explanation/security.md#live-connections): Django's own signals, on the test
database, to a real channels-redis layer, read from the user's group as a socket would.
Through two real servers: tests/django/ws/test_revocation_on_servers.py."""

from __future__ import annotations

import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import Group, Permission, User
from django.db import transaction
from django.test import override_settings

from django_outbox.ws.revoke import (
    SEND_TIMEOUT,
    revoke_message,
    revoke_sockets,
    session_digest,
    user_group,
)
from tests.support.helpers import QUICK_PASSWORD_HASHERS, redis_channel_layers
from tests.support.valkey import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


def layer_config(url):
    return redis_channel_layers(url, expiry=10)


class Inbox:
    """Channels in the groups of some users: what reached each of them."""

    def __init__(self, *users) -> None:
        self.layer = get_channel_layer()
        self.channels = {}
        for user in users:
            self.channels[user.username] = async_to_sync(self._join)(user.pk)

    async def _join(self, pk):
        # A plain channel name: read with one receive per call, whatever the event loop
        # (a process-specific channel's buffer belongs to the loop that first read it).
        channel = f"test-revoke-{pk}"
        await self.layer.group_add(user_group(pk), channel)
        return channel

    async def _drain(self, channel, wait):
        import asyncio

        got = []
        try:
            while True:
                try:
                    got.append(await asyncio.wait_for(self.layer.receive(channel), wait))
                except TimeoutError:
                    return got
        finally:
            # A receive given up still blocks in the server (BZPOPMIN) on its connection,
            # and would take the next message with it: close it.
            await self.layer.close_pools()

    def received(self, user, wait=0.3) -> list[dict]:
        """What reached ``user``'s group since the last call (``wait``: seconds of silence
        that end it)."""
        return async_to_sync(self._drain)(self.channels[user.username], wait)

    def close(self) -> None:
        async_to_sync(self.layer.flush)()
        async_to_sync(self.layer.close_pools)()


@pytest.fixture
def inbox(valkey):
    with override_settings(CHANNEL_LAYERS=layer_config(valkey)):
        boxes = []

        def make(*users):
            box = Inbox(*users)
            boxes.append(box)
            return box

        yield make
        for box in boxes:
            box.close()


@pytest.fixture
def users():
    alice = User.objects.create_user("alice", password="secret-pw")
    bob = User.objects.create_user("bob", password="secret-pw")
    perm = Permission.objects.get(codename="view_outboxentry")
    group = Group.objects.create(name="watchers")
    group.permissions.add(perm)
    return alice, bob, group, perm


REVOKE = revoke_message()


def test_the_users_group_names_no_user_and_fits_the_layer():
    name = user_group(42)
    assert name.startswith("outbox.user.") and len(name) < 100
    assert user_group(42) == user_group("42") != user_group(43)
    assert session_digest(None) is None and session_digest("abc") != "abc"


def test_a_password_change_and_a_deactivation_push_one(inbox, users):
    alice, bob, *_ = users
    box = inbox(alice, bob)
    alice.set_password("another")
    alice.save()
    assert box.received(alice) == [REVOKE]
    alice.is_active = False
    alice.save(update_fields=["is_active"])
    assert box.received(alice) == [REVOKE]
    assert box.received(bob) == []


def test_a_login_and_a_creation_push_nothing(inbox, users):
    alice, *_ = users
    box = inbox(alice)
    from django.contrib.auth.models import update_last_login

    update_last_login(None, alice)
    User.objects.create_user("carol")
    assert box.received(alice) == []


def test_a_save_of_last_login_with_another_field_pushes_one(inbox, users):
    """Only a save of ``last_login`` alone is harmless: one that deactivates the user in the
    same save (a login hook that locks an account, say) is a revocation."""
    from django.utils import timezone

    alice, bob, *_ = users
    box = inbox(alice, bob)
    alice.last_login = timezone.now()
    alice.is_active = False
    alice.save(update_fields=["last_login", "is_active"])
    assert box.received(alice) == [REVOKE]
    assert box.received(bob) == []


def test_a_change_rolled_back_pushes_nothing_and_a_committed_one_after_commit(inbox, users):
    alice, *_ = users
    box = inbox(alice)
    with pytest.raises(RuntimeError), transaction.atomic():
        alice.is_active = False
        alice.save()
        raise RuntimeError("rolled back")
    assert box.received(alice) == []
    with transaction.atomic():
        alice.is_active = False
        alice.save()
        assert box.received(alice, wait=0.2) == []  # not before the commit
    assert box.received(alice) == [REVOKE]


def test_a_logout_names_the_ended_session(inbox, users, client):
    alice, *_ = users
    box = inbox(alice)
    client.force_login(alice)
    key = client.session.session_key
    _logout(client)
    assert box.received(alice) == [{**REVOKE, "session": session_digest(key)}]


def _logout(client):
    """What the logout view does: ``django.contrib.auth.logout`` on a request of the
    client's session."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import logout
    from django.http import HttpRequest

    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(
        client.session.session_key
    )
    request.user = User.objects.get(pk=request.session["_auth_user_id"])
    logout(request)


@pytest.mark.parametrize(
    "change",
    [
        "user.user_permissions.remove(perm)",
        "perm.user_set.remove(user)",
        "perm.user_set.clear()",
        "user.groups.remove(group)",
        "group.user_set.remove(user)",
        "group.user_set.clear()",
        "user.groups.clear()",
        "group.permissions.remove(perm)",
        "group.permissions.clear()",
        "perm.group_set.remove(group)",
        "perm.group_set.clear()",
        "group.delete()",
        "user.delete()",
    ],
)
def test_every_side_of_a_permission_or_group_change_pushes_one(inbox, users, change):
    alice, bob, group, perm = users
    alice.user_permissions.add(perm)
    alice.groups.add(group)
    box = inbox(alice, bob)
    box.received(alice)  # what the setup itself pushed
    exec(change, {"user": alice, "perm": perm, "group": group})
    assert REVOKE in box.received(alice)
    assert box.received(bob) == []  # in no group, holding nothing: not asked


def test_a_channel_layer_that_is_down_holds_no_save(users, caplog):
    alice, *_ = users
    with override_settings(CHANNEL_LAYERS=layer_config(f"redis://127.0.0.1:{free_port()}/0")):
        started = time.monotonic()
        alice.is_active = False
        alice.save()
        took = time.monotonic() - started
        async_to_sync(get_channel_layer().close_pools)()
    assert took < SEND_TIMEOUT + 1.0
    assert "could not push a revocation" in caplog.text


def test_no_channel_layer_pushes_nothing_and_raises_nothing(users):
    alice, *_ = users
    with override_settings(CHANNEL_LAYERS={}):
        revoke_sockets([alice.pk])
        alice.is_active = False
        alice.save()


def test_a_user_named_twice_is_sent_one_revocation(users, inbox):
    """``arevoke_sockets`` counts users, not names: a primary key given twice (as an int
    and as text too) is sent one revocation and counted once."""
    from django_outbox.ws.revoke import arevoke_sockets

    alice, bob, *_ = users
    box = inbox(alice, bob)
    sent = async_to_sync(arevoke_sockets)([alice.pk, str(alice.pk), alice.pk, None])
    assert sent == 1
    assert box.received(alice) == [revoke_message()]
    assert box.received(bob) == []


def test_clearing_a_permissions_groups_pushes_to_the_groups_members_only(inbox, users):
    """``perm.group_set.clear()`` takes the permission from every group holding it: their
    members are asked to re-check, and a user holding the permission only directly (not
    through a group, so nothing changed for them) is not."""
    alice, bob, group, perm = users
    alice.groups.add(group)  # holds it through the group only
    bob.user_permissions.add(perm)  # holds it directly only
    box = inbox(alice, bob)
    box.received(alice), box.received(bob)  # what the setup itself pushed
    perm.group_set.clear()
    assert box.received(alice) == [REVOKE]
    assert box.received(bob) == []
