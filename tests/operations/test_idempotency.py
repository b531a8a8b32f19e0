"""Idempotency keys are scoped to the session and the accepting user."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox import get_outbox
from django_outbox.core.keys import dedupe_marker
from django_outbox.errors import Duplicate

WS, SES = "w1", "s1"


def accept(outbox, user, key="1", text="hello", ses=SES):
    return outbox.accept(WS, ses, user_id=user, client_message_id=key, text=text)


def test_two_users_of_one_session_with_the_same_key_send_two_prompts(outbox):
    a = accept(outbox, "alice")
    b = accept(outbox, "bob")  # the case as reported: same body, another user
    assert a.id != b.id
    assert [e.id for e in outbox.list(WS, SES)] == [a.id, b.id]
    with pytest.raises(Duplicate) as again:
        accept(outbox, "bob")
    assert again.value.accepted_id == b.id  # never alice's ID
    with pytest.raises(Duplicate) as again:
        accept(outbox, "alice")
    assert again.value.accepted_id == a.id


def test_another_users_key_with_other_text_is_a_new_prompt_not_a_conflict(outbox):
    accept(outbox, "alice", text="one")
    b = accept(outbox, "bob", text="two")
    assert [e.text for e in outbox.list(WS, SES)] == ["one", "two"]
    assert b.user_id == "bob"


@pytest.mark.parametrize(
    "first, second",
    [
        (("a:b", "c"), ("a", "b:c")),  # a separator inside the user ID
        (("1", "k"), (1, "k")),  # an int user ID is its decimal string: the same user
        (("alice", "k"), ("Alice", "k")),
        (("", "k"), (" ", "k")),
    ],
)
def test_user_ids_cannot_alias_one_another(outbox, first, second):
    a = accept(outbox, first[0], key=first[1])
    if str(first[0]) == str(second[0]) and first[1] == second[1]:
        with pytest.raises(Duplicate):
            accept(outbox, second[0], key=second[1])
        return
    b = accept(outbox, second[0], key=second[1])
    assert a.id != b.id


def test_markers_are_fixed_width_printable_and_cleanup_frees_every_users_keys(outbox, r):
    users = ["alice", "bob", "ü" * 255, "x\ny"]
    for user in users:
        accept(outbox, user)
    keys = outbox.keys.session(WS, SES)
    members = r.zrange(keys.markers, 0, -1)
    assert sorted(members) == sorted(dedupe_marker(u, "1") for u in users)
    assert all(len(m.split(":", 1)[0]) == 24 and m.isascii() and m.isprintable() for m in members)
    outbox.cleanup_workspace(WS)
    assert r.keys("*dedupe*") == []
    for user in users:  # every key is free again
        accept(outbox, user)


@pytest.mark.standalone  # get_outbox() is built from settings: a standalone client
@pytest.mark.django_db
def test_over_http_two_members_of_a_workspace_each_get_202(django_user_model):
    make = django_user_model.objects.create_user
    alice, bob = make("alice", password=None), make("bob", password=None)
    body = json.dumps({"clientMessageID": "1", "text": "hello"})
    url = f"/outbox/api/workspaces/{WS}/sessions/{SES}/messages/"
    with override_settings(OUTBOX={"ACCESS_POLICY": "tests.operations.test_idempotency.everyone"}):
        answers = []
        for user in (alice, bob, bob):
            client = APIClient()
            client.force_login(user)
            answers.append(client.post(url, body, content_type="application/json"))
        assert [a.status_code for a in answers] == [202, 202, 200]
        ids = [a.json()["id"] for a in answers]
        assert ids[0] != ids[1] and ids[2] == ids[1]
        assert [e.user_id for e in get_outbox().list(WS, SES)] == [str(alice.pk), str(bob.pk)]


def everyone(user, workspace_id, session_id, action):
    return user.is_authenticated
