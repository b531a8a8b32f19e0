"""The REST API over a real Valkey: access matrix, status table, idempotency keys, bad input."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace
from urllib.parse import quote

import pytest
from django.contrib.auth.models import Permission
from django.middleware.csrf import _get_new_csrf_string
from django.test import Client, override_settings
from django.urls import reverse
from rest_framework import serializers
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.exceptions import ValidationError
from rest_framework.test import APIClient, APIRequestFactory, force_authenticate

from django_outbox import get_outbox
from django_outbox.api.errors import (
    FULL_RETRY_AFTER,
    UNAVAILABLE_RETRY_AFTER,
    outbox_exception_handler,
)
from django_outbox.api.serializers import ModelField
from django_outbox.api.views import MessagesView, WorkspaceParkView, WorkspaceUnparkView
from django_outbox.core.rules import validate_content
from django_outbox.errors import ContentTooLarge, InvalidContent
from tests.support.helpers import delivering

pytestmark = pytest.mark.django_db

OWN_WORKSPACE = "tests.django.api.test_api.own_workspace_policy"
RECORDING = "tests.django.api.test_api.recording_policy"
POLICY_CALLS: list[tuple[str, str | None, str]] = []


def own_workspace_policy(user, workspace_id, session_id, action):
    """Staff may do everything; others only their own workspace (ID == username), and
    not the workspace actions (park, cleanup)."""
    if user.is_staff:
        return True
    return workspace_id == user.get_username() and action in {"view", "accept", "retry", "dismiss"}


def recording_policy(user, workspace_id, session_id, action):
    POLICY_CALLS.append((workspace_id, session_id, action))
    return True


# --- helpers -------------------------------------------------------------------------


def q(value: str) -> str:
    return quote(value, safe="")


def messages_url(ws: str = "alice", ses: str = "s1") -> str:
    return f"/outbox/api/workspaces/{q(ws)}/sessions/{q(ses)}/messages/"


def message_url(entry_id: str, ws: str = "alice", ses: str = "s1") -> str:
    return f"{messages_url(ws, ses)}{q(entry_id)}/"


def retry_url(entry_id: str, ws: str = "alice", ses: str = "s1") -> str:
    return f"{message_url(entry_id, ws, ses)}retry/"


def workspace_url(ws: str = "alice", op: str = "") -> str:
    return f"/outbox/api/workspaces/{q(ws)}/" + (f"{op}/" if op else "")


def body(cmid: str = "c1", text: str = "hello", **extra) -> dict:
    return {"clientMessageID": cmid, "text": text, **extra}


def post_json(client, url: str, data=None):
    """POST ``data`` as JSON (ASCII-escaped, so lone surrogates travel); None: no body."""
    if data is None:
        return client.post(url)
    return client.post(url, json.dumps(data), content_type="application/json")


def entries(ws: str = "alice", ses: str = "s1"):
    return get_outbox().list(ws, ses)


def nested(depth: int) -> dict:
    """A model object whose containers nest ``depth`` levels (the object itself is 1)."""
    value: object = []
    for _ in range(depth - 2):
        value = [value]
    return {"m": value}


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"redis://127.0.0.1:{port}/0"


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    data = response.json()
    assert data["code"] == code
    assert isinstance(data["detail"], str) and data["detail"]
    return data


def with_every_outbox_permission(user):
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_outbox"))
    return user


@pytest.fixture
def users(django_user_model):
    make = django_user_model.objects.create_user
    return {
        "anonymous": None,
        "other": make("bob", password=None),
        "owner": make("alice", password=None),
        # an operator: staff holding every outbox permission (the default policy's rule)
        "staff": with_every_outbox_permission(make("root", password=None, is_staff=True)),
    }


def client_for(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.force_login(user)
    return client


@pytest.fixture
def staff(users) -> APIClient:
    return client_for(users["staff"])


@pytest.fixture
def owner_policy():
    with override_settings(OUTBOX={"ACCESS_POLICY": OWN_WORKSPACE}):
        yield


# --- every endpoint x anonymous / other user / owner / staff -----------------------------

# endpoint -> (method, url builder, json body, owner's status, staff's status)
ENDPOINTS = {
    "list": ("get", lambda e: messages_url(), None, 200, 200),
    "accept": ("post", lambda e: messages_url(), body("new"), 202, 202),
    "retry": ("post", lambda e: retry_url(e), None, 200, 200),
    "dismiss": ("delete", lambda e: message_url(e), None, 204, 204),
    "park": ("post", lambda e: workspace_url(op="park"), {"reason": "maint"}, 403, 200),
    "unpark": ("post", lambda e: workspace_url(op="unpark"), {}, 403, 200),
    "cleanup": ("delete", lambda e: workspace_url(), None, 403, 200),
}


@pytest.mark.parametrize("role", ["anonymous", "other", "owner", "staff"])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_access_matrix(users, owner_policy, role, endpoint):
    seeded = get_outbox().accept("alice", "s1", user_id="seed", client_message_id="k0", text="x")
    method, url, data, owner_status, staff_status = ENDPOINTS[endpoint]
    client = client_for(users[role])
    response = getattr(client, method)(url(seeded.id), data, format="json")
    if role == "anonymous":
        # DRF's answer with SessionAuthentication first: 403 not_authenticated
        assert_error(response, 403, "not_authenticated")
    elif role == "other":
        assert_error(response, 403, "permission_denied")
    else:
        expected = owner_status if role == "owner" else staff_status
        assert response.status_code == expected, response.content
        if expected == 403:
            assert_error(response, 403, "permission_denied")
    if response.status_code == 403:  # a refusal changes nothing
        assert [(e.id, str(e.status)) for e in entries()] == [(seeded.id, "pending")]


def test_policy_gets_workspace_session_and_action(users):
    POLICY_CALLS.clear()
    client = client_for(users["owner"])
    with override_settings(OUTBOX={"ACCESS_POLICY": RECORDING}):
        entry_id = post_json(client, messages_url("w", "s"), body()).json()["id"]
        client.get(messages_url("w", "s"))
        client.post(retry_url(entry_id, "w", "s"))
        client.delete(message_url(entry_id, "w", "s"))
        post_json(client, workspace_url("w", "park"), {"reason": "r"})
        post_json(client, workspace_url("w", "unpark"), {})
        client.delete(workspace_url("w"))
    assert POLICY_CALLS == [
        ("w", "s", "accept"),
        ("w", "s", "view"),
        ("w", "s", "retry"),
        ("w", "s", "dismiss"),
        ("w", None, "operate"),  # the pinned action of every workspace operation
        ("w", None, "operate"),
        ("w", None, "operate"),
    ]


def test_default_policy_is_model_permissions(users, django_user_model):
    # Staff without permissions get nothing (tests/django/test_authz.py has the whole matrix).
    assert_error(client_for(users["owner"]).get(messages_url()), 403, "permission_denied")
    bare = django_user_model.objects.create_user("bare", password=None, is_staff=True)
    assert_error(client_for(bare).get(messages_url()), 403, "permission_denied")
    bare.user_permissions.add(Permission.objects.get(codename="view_outboxentry"))
    bare = django_user_model.objects.get(pk=bare.pk)  # without the permission cache
    assert client_for(bare).get(messages_url()).status_code == 200
    assert_error(post_json(client_for(bare), messages_url(), body()), 403, "permission_denied")
    assert client_for(users["staff"]).get(messages_url()).status_code == 200


def test_head_is_checked_like_get(users, owner_policy):
    assert client_for(users["other"]).head(messages_url()).status_code == 403
    assert client_for(users["owner"]).head(messages_url()).status_code == 200


def test_policy_is_asked_before_valkey(users, owner_policy):
    with override_settings(
        OUTBOX={"ACCESS_POLICY": OWN_WORKSPACE, "VALKEY_URL": closed_port_url()}
    ):
        assert_error(client_for(users["other"]).get(messages_url()), 403, "permission_denied")
        assert_error(client_for(users["owner"]).get(messages_url()), 503, "unavailable")


def test_anonymous_gets_401_when_the_first_authenticator_challenges(users):
    view = MessagesView.as_view(authentication_classes=[BasicAuthentication, SessionAuthentication])
    request = APIRequestFactory().get(messages_url())
    response = view(request, workspace_id="alice", session_id="s1")
    response.render()
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Basic")
    assert json.loads(response.content)["code"] == "not_authenticated"

    request = APIRequestFactory().get(messages_url(), HTTP_AUTHORIZATION="Basic Ym9iOm5vcGU=")
    response = view(request, workspace_id="alice", session_id="s1")
    response.render()
    assert response.status_code == 401
    assert json.loads(response.content)["code"] == "authentication_failed"


def test_session_write_without_csrf_token_is_refused(users, r):
    client = Client(enforce_csrf_checks=True)
    client.force_login(users["staff"])
    response = client.post(messages_url(), json.dumps(body()), content_type="application/json")
    data = assert_error(response, 403, "permission_denied")
    assert "CSRF" in data["detail"]
    assert r.dbsize() == 0

    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    response = client.post(
        messages_url(), json.dumps(body()), content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert response.status_code == 202


# --- the status table ------------------------------------------------------------------


def test_urls_are_named_in_the_app_namespace():
    assert reverse("django_outbox:api-messages", args=["a", "b"]) == messages_url("a", "b")
    assert reverse("django_outbox:api-schema") == "/outbox/api/schema/"


def test_accept_202_records_the_user(users, staff):
    response = post_json(staff, messages_url(), body(model={"id": "m", "n": [1, 2.5, []]}))
    assert response.status_code == 202
    entry = response.json()
    assert entry["status"] == "pending"
    assert entry["clientMessageID"] == "c1"
    assert entry["text"] == "hello"
    assert entry["model"] == {"id": "m", "n": [1, 2.5, []]}
    assert entry["userID"] == str(users["staff"].pk)
    assert entry["attempts"] == 0
    assert entry["acceptedAt"].endswith("Z")
    [stored] = entries()
    assert stored.id == entry["id"] and stored.user_id == str(users["staff"].pk)


def test_list_200_version_and_entries(staff):
    empty = staff.get(messages_url()).json()
    assert empty["entries"] == [] and empty["version"] > 0  # versions only grow
    first = post_json(staff, messages_url(), body("a", "one")).json()
    second = post_json(staff, messages_url(), body("b", "two")).json()
    listed = staff.get(messages_url()).json()
    assert listed["version"] >= empty["version"] + 2
    assert [e["id"] for e in listed["entries"]] == [first["id"], second["id"]]
    assert listed["entries"][0] == first


def test_duplicate_200_with_the_original_id(staff):
    first = post_json(staff, messages_url(), body()).json()
    response = post_json(staff, messages_url(), body())
    assert response.status_code == 200
    assert response.json() == {"id": first["id"], "duplicate": True}
    assert len(entries()) == 1


@pytest.mark.parametrize(
    "second", [body(text="b"), body(text="a", model={"id": "x"})], ids=["text", "model"]
)
def test_same_key_other_content_422_keeps_the_stored_message(staff, second):
    first = post_json(staff, messages_url(), body(text="a")).json()
    assert_error(post_json(staff, messages_url(), second), 422, "idempotency_conflict")
    [stored] = entries()
    assert (stored.id, stored.text, stored.model) == (first["id"], "a", None)


def test_full_429_with_retry_after_stores_nothing(staff):
    with override_settings(OUTBOX={"CAP": 2}):
        post_json(staff, messages_url(), body("a"))
        post_json(staff, messages_url(), body("b"))
        response = post_json(staff, messages_url(), body("c"))
        assert_error(response, 429, "outbox_full")
        assert response["Retry-After"] == str(FULL_RETRY_AFTER)
        assert [e.client_message_id for e in entries()] == ["a", "b"]
        # the refusal left no marker: once there is room the same key is accepted
        staff.delete(message_url(entries()[0].id))
        assert post_json(staff, messages_url(), body("c")).status_code == 202


def test_valkey_down_503_then_back_202(staff):
    with override_settings(OUTBOX={"VALKEY_URL": closed_port_url()}):
        response = post_json(staff, messages_url(), body("k3"))
        data = assert_error(response, 503, "unavailable")
        assert data["accepted"] is False
        assert response["Retry-After"] == str(UNAVAILABLE_RETRY_AFTER)
        assert "127.0.0.1" not in data["detail"]  # no connection details leak
        for method, url in [
            ("get", messages_url()),
            ("post", retry_url("e1")),
            ("delete", message_url("e1")),
            ("delete", workspace_url()),
        ]:
            data = assert_error(getattr(staff, method)(url), 503, "unavailable")
            # only a write is told about retrying an accept
            assert ("clientMessageID" in data["detail"]) == (method != "get"), data
    assert post_json(staff, messages_url(), body("k3")).status_code == 202
    assert len(entries()) == 1


def test_durability_wait_timeout_503_says_accepted(staff):
    # a standalone Valkey has no replica to acknowledge the write
    with override_settings(OUTBOX={"WAIT_REPLICAS": 1, "WAIT_TIMEOUT": 0.05}):
        response = post_json(staff, messages_url(), body("k"))
    data = assert_error(response, 503, "unavailable")
    assert data["accepted"] is True
    [stored] = entries()
    assert post_json(staff, messages_url(), body("k")).json() == {
        "id": stored.id,
        "duplicate": True,
    }


def test_retry_200_returns_the_rearmed_entry(staff):
    raw = {
        "id": "0000000000aaErrorEntry01",
        "status": "error",
        "reason": "max_attempts",
        "attempts": 5,
        "acceptedAt": "2026-01-01T00:00:00.000000Z",
        "lastError": "boom",
        "clientMessageID": "k",
        "userID": "u",
        "text": "t",
    }
    get_outbox().seed_entry_for_test("alice", "s1", json.dumps(raw))
    response = staff.post(retry_url(raw["id"]))
    assert response.status_code == 200
    entry = response.json()
    assert entry["id"] == raw["id"]
    assert entry["status"] == "pending"
    assert "reason" not in entry


def test_retry_and_dismiss_404(staff):
    post_json(staff, messages_url(), body())
    assert_error(staff.post(retry_url("nope")), 404, "not_found")
    assert_error(staff.delete(message_url("nope")), 404, "not_found")


def test_dismiss_204_then_404(staff):
    entry = post_json(staff, messages_url(), body()).json()
    response = staff.delete(message_url(entry["id"]))
    assert response.status_code == 204
    assert response.content == b""
    assert entries() == []
    assert_error(staff.delete(message_url(entry["id"])), 404, "not_found")


def test_retry_of_a_parked_entry_409(staff):
    entry = post_json(staff, messages_url(), body()).json()
    post_json(staff, workspace_url(op="park"), {"reason": "maint"})
    assert_error(staff.post(retry_url(entry["id"])), 409, "busy")
    assert str(entries()[0].status) == "parked"


def test_busy_409_while_being_delivered(staff):
    entry = post_json(staff, messages_url(), body()).json()
    with delivering("alice", "s1"):
        assert_error(staff.delete(message_url(entry["id"])), 409, "busy")
        assert_error(staff.post(retry_url(entry["id"])), 409, "busy")
        [listed] = staff.get(messages_url()).json()["entries"]
        assert listed["status"] == "delivering"
    assert entries() == []
    assert_error(staff.delete(message_url(entry["id"])), 404, "not_found")


def test_park_and_unpark(staff):
    post_json(staff, messages_url(ses="s1"), body("a"))
    post_json(staff, messages_url(ses="s2"), body("b"))
    response = post_json(staff, workspace_url(op="park"), {"reason": "mode_transition"})
    assert (response.status_code, response.json()) == (200, {"parked": 2})
    assert [(str(e.status), e.reason) for e in entries(ses="s2")] == [("parked", "mode_transition")]
    response = post_json(staff, workspace_url(op="unpark"), {"reason": "other"})
    assert response.json() == {"unparked": 0}
    response = staff.post(workspace_url(op="unpark"))  # no body at all
    assert (response.status_code, response.json()) == (200, {"unparked": 2})
    assert [str(e.status) for e in entries(ses="s1")] == ["pending"]


@pytest.mark.parametrize(
    "payload",
    [{}, {"reason": ""}, {"reason": "  "}, {"reason": 5}, {"reason": "x" * 201}, {"reason": None}],
)
def test_park_needs_a_reason_400(staff, payload):
    post_json(staff, messages_url(), body())
    data = assert_error(post_json(staff, workspace_url(op="park"), payload), 400, "invalid")
    assert list(data["fieldErrors"]) == ["reason"]
    assert str(entries()[0].status) == "pending"


UNPRINTABLE_REASONS = {
    "right-to-left-override": "maint\u202enuf",
    "nul": "maint\x00",
    "zero-width-space": "main\u200bt",
    "newline": "maint\nmore",
}


@pytest.mark.parametrize("reason", UNPRINTABLE_REASONS.values(), ids=UNPRINTABLE_REASONS.keys())
def test_a_park_reason_with_control_or_format_characters_is_refused_400(staff, reason):
    """The reason is shown to operators as is: a right-to-left override would make it read
    as something else, so the REST API refuses it as the admin form does."""
    post_json(staff, messages_url(), body())
    data = assert_error(
        post_json(staff, workspace_url(op="park"), {"reason": reason}), 400, "invalid"
    )
    assert data["fieldErrors"] == {
        "reason": ["Reason must not contain control or format characters."]
    }
    assert str(entries()[0].status) == "pending"


def test_a_park_reason_with_non_ascii_letters_is_kept(staff):
    post_json(staff, messages_url(), body())
    response = post_json(staff, workspace_url(op="park"), {"reason": "Wartung für 🎉"})
    assert (response.status_code, response.json()) == (200, {"parked": 1})
    assert entries()[0].reason == "Wartung für 🎉"


def test_unpark_reason_shape_400(staff):
    data = assert_error(post_json(staff, workspace_url(op="unpark"), {"reason": 1}), 400, "invalid")
    assert list(data["fieldErrors"]) == ["reason"]


def test_cleanup_200_frees_the_keys(staff, r):
    first = post_json(staff, messages_url(), body("k1")).json()
    staff.delete(message_url(first["id"]))
    response = staff.delete(workspace_url())
    assert response.status_code == 200
    assert response.json()["removed"] > 0
    assert staff.delete(workspace_url()).json() == {"removed": 0}
    # after cleanup the key is free again
    again = post_json(staff, messages_url(), body("k1"))
    assert again.status_code == 202
    assert again.json()["id"] != first["id"]


def test_other_methods_405(staff):
    assert_error(staff.put(messages_url(), body(), format="json"), 405, "method_not_allowed")
    assert_error(staff.get(workspace_url()), 405, "method_not_allowed")
    assert_error(staff.options(messages_url()), 405, "method_not_allowed")


def test_accept_header_without_json_406(staff):
    assert_error(staff.get(messages_url(), HTTP_ACCEPT="text/html"), 406, "not_acceptable")


# --- idempotency keys over HTTP ------------------------------------------------------------


def test_dismissed_then_reposted_200_with_the_original_id(staff):
    first = post_json(staff, messages_url(), body("m1")).json()
    assert staff.delete(message_url(first["id"])).status_code == 204
    response = post_json(staff, messages_url(), body("m1"))
    assert response.json() == {"id": first["id"], "duplicate": True}
    assert entries() == []


def test_too_large_then_valid_202(staff, r):
    assert_error(post_json(staff, messages_url(), body("k2", "x" * 102_401)), 413, "too_large")
    assert r.dbsize() == 0
    assert post_json(staff, messages_url(), body("k2", "x")).status_code == 202


def test_same_key_in_other_sessions_and_workspaces_is_separate(staff):
    ids = {
        post_json(staff, messages_url(ws, ses), body("k4")).json()["id"]
        for ws, ses in [("ws1", "s1"), ("ws1", "s2"), ("ws2", "s1")]
    }
    assert len(ids) == 3
    assert len(entries("ws1", "s1")) == len(entries("ws1", "s2")) == len(entries("ws2", "s1")) == 1


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["a" * 102_400, "é" * 51_200, "😀" * 25_600, "\x00 nul and\ttabs\n  "],
    ids=["ascii", "2-byte", "4-byte", "control"],
)
def test_text_up_to_the_limit_202_untouched(staff, text):
    response = post_json(staff, messages_url(), body(text=text))
    assert response.status_code == 202
    assert entries()[0].text == text


@pytest.mark.parametrize(
    "text", ["a" * 102_401, "é" * 51_201, "😀" * 30_000], ids=["ascii", "2-byte", "emoji"]
)
def test_text_over_the_limit_413(staff, r, text):
    data = assert_error(post_json(staff, messages_url(), body(text=text)), 413, "too_large")
    assert "102400" in data["detail"]
    assert r.dbsize() == 0


def test_text_limit_follows_max_text_bytes(staff, r):
    with override_settings(OUTBOX={"MAX_TEXT_BYTES": 10}):
        assert_error(post_json(staff, messages_url(), body(text="x" * 11)), 413, "too_large")
        assert post_json(staff, messages_url(), body(text="x" * 10)).status_code == 202


def test_body_over_data_upload_max_memory_size_413(staff, r):
    text = "x" * 2_700_000  # > Django's default DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB)
    assert_error(post_json(staff, messages_url(), body(text=text)), 413, "too_large")
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        response = post_json(staff, messages_url(), body(text="x" * 2000))
        assert_error(response, 413, "too_large")
    assert r.dbsize() == 0


BAD_IDS = ["a}:{b", "a:b", "b}:{c", "s1\n", "x" * 300, "*", "[x]", "é", " s", ".a", "-"]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_identifiers_400_before_valkey(staff, r, bad):
    cases = [
        ("post", messages_url(bad, "c"), body()),
        ("post", messages_url("a", bad), body()),
        ("get", messages_url(bad, "c"), None),
        ("get", messages_url("a", bad), None),
        ("post", retry_url(bad), None),
        ("delete", message_url(bad), None),
        ("post", workspace_url(bad, "park"), {"reason": "r"}),
        ("post", workspace_url(bad, "unpark"), {}),
        ("delete", workspace_url(bad), None),
    ]
    for method, url, data in cases:
        response = getattr(staff, method)(url, data, format="json")
        assert_error(response, 400, "invalid_identifier")
    assert r.dbsize() == 0


def test_empty_identifier_404_from_the_router(staff, r):
    assert (
        post_json(staff, "/outbox/api/workspaces//sessions/c/messages/", body()).status_code == 404
    )
    assert (
        post_json(staff, "/outbox/api/workspaces/a/sessions//messages/", body()).status_code == 404
    )
    assert r.dbsize() == 0


def test_cleanup_of_star_is_not_a_pattern(staff):
    post_json(staff, messages_url("a", "s"), body())
    assert_error(staff.delete(workspace_url("*")), 400, "invalid_identifier")
    assert len(entries("a", "s")) == 1


@pytest.mark.parametrize(
    ("payload", "fields"),
    [
        ({}, {"clientMessageID", "text"}),
        ({"clientMessageID": "c"}, {"text"}),
        (body(text=None), {"text"}),
        (body(text=123), {"text"}),
        (body(text=["x"]), {"text"}),
        (body(text=""), {"text"}),
        (body(text={"a": 1}), {"text"}),
        (body(text=True), {"text"}),
        (body(text="\ud800 lone surrogate"), {"text"}),
        ({"text": "x"}, {"clientMessageID"}),
        (body(cmid=7), {"clientMessageID"}),
        (body(cmid=None), {"clientMessageID"}),
        (body(cmid=""), {"clientMessageID"}),
        (body(cmid="x" * 129), {"clientMessageID"}),
        (body(cmid="é"), {"clientMessageID"}),
        (body(cmid="a\n"), {"clientMessageID"}),
        (body(cmid="\x7f"), {"clientMessageID"}),
        (body(model="gpt-5"), {"model"}),
        (body(model=["x"]), {"model"}),
        (body(model=3), {"model"}),
        (body(model={"k": "\udc00"}), {"model"}),
        (body(model=nested(33)), {"model"}),
    ],
)
def test_bad_shapes_400_with_field_errors(staff, r, payload, fields):
    data = assert_error(post_json(staff, messages_url(), payload), 400, "invalid")
    assert set(data["fieldErrors"]) == fields
    assert all(isinstance(m, str) for ms in data["fieldErrors"].values() for m in ms)
    assert r.dbsize() == 0


def test_model_nested_up_to_the_limit_202(staff):
    response = post_json(staff, messages_url(), body(model=nested(32)))
    assert response.status_code == 202
    assert response.json()["model"] == nested(32)


@pytest.mark.parametrize(
    ("model", "code", "message"),
    [
        ("gpt-5", "invalid", "Must be a JSON object."),
        (nested(33), "too_deep", "Must be nested at most 32 levels deep."),
        (
            {"n": float("inf")},
            "not_json",
            "Must be plain JSON with finite numbers and valid Unicode.",
        ),
        ({"k": "\udc00"}, "not_json", "Must be plain JSON with finite numbers and valid Unicode."),
    ],
    ids=["not-object", "too-deep", "infinity", "lone-surrogate"],
)
def test_model_field_answers_the_core_model_rule_with_its_own_messages(model, code, message):
    with pytest.raises(ValidationError) as info:
        ModelField().run_validation(model)
    assert (info.value.get_codes(), info.value.detail) == ([code], [message])


def test_model_field_depth_check_survives_100k_levels():
    """The parser stops near 1,000 levels, but the field's own walk is bounded too."""
    deep: object = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValidationError) as info:
        ModelField().run_validation({"m": deep})
    assert info.value.get_codes() == ["too_deep"]


@pytest.mark.parametrize(
    ("depth", "code"), [(500, "invalid"), (100_000, "parse_error")], ids=["parsed", "unparsable"]
)
def test_deeply_nested_model_body_is_400_never_500(staff, r, depth, code):
    raw = b'{"clientMessageID":"c","text":"x","model":{"m":' + b"[" * depth + b"]" * depth + b"}}"
    data = assert_error(staff.post(messages_url(), raw, content_type="application/json"), 400, code)
    if code == "invalid":
        assert data["fieldErrors"] == {"model": ["Must be nested at most 32 levels deep."]}
    assert r.dbsize() == 0


# --- the core's content rules, answered by the error contract ------------------------------


def test_text_over_the_limit_is_the_cores_content_too_large_answered_413(staff, r):
    """No view re-checks the size: the core refuses the text and the handler answers 413."""
    response = post_json(staff, messages_url(), body(text="é" * 51_201))
    assert response.status_code == 413
    assert response.json() == {
        "detail": "text is 102402 UTF-8 bytes; the limit is 102400. Nothing was stored.",
        "code": "too_large",
    }
    assert r.dbsize() == 0


def test_a_model_over_16_kib_is_413_too_large_like_a_text_over_its_limit(staff, r):
    """A size, not a shape: the REST answer agrees with the docs and the Python API."""
    response = post_json(staff, messages_url(), body(model={"k": "v" * 16_384}))
    assert response.status_code == 413
    assert response.json() == {
        "detail": "model is 16392 UTF-8 bytes; the limit is 16384. Nothing was stored.",
        "code": "too_large",
    }
    assert r.dbsize() == 0


def test_content_too_large_from_the_core_is_413_too_large():
    with pytest.raises(ContentTooLarge) as info:
        validate_content("x", {"m": "y" * 17_000}, "k", max_text_bytes=10)
    size = info.value.size
    response = outbox_exception_handler(info.value, {})
    assert response is not None and response.status_code == 413
    assert response.data == {
        "detail": f"model is {size} UTF-8 bytes; the limit is 16384. Nothing was stored.",
        "code": "too_large",
    }


def test_invalid_content_from_the_core_is_400_invalid_without_field_errors(r):
    """A rule only the core checks (a user ID over 255 characters) answers 400 ``invalid``."""
    user = SimpleNamespace(
        pk="u" * 256,
        is_authenticated=True,
        is_active=True,
        is_staff=True,
        has_perm=lambda perm: True,  # an operator holding every outbox permission
    )
    request = APIRequestFactory().post(messages_url(), body(), format="json")
    force_authenticate(request, user=user)
    response = MessagesView.as_view()(request, workspace_id="alice", session_id="s1")
    response.render()
    assert response.status_code == 400
    assert json.loads(response.content) == {
        "detail": "user_id must be a string of at most 255 characters",
        "code": "invalid",
    }
    assert r.dbsize() == 0


class AnyReasonSerializer(serializers.Serializer):
    """A park body serializer that lets every string through, so the core's rule decides."""

    reason = serializers.CharField(trim_whitespace=False)


@pytest.mark.parametrize("view_class", [WorkspaceParkView, WorkspaceUnparkView])
@pytest.mark.parametrize("reason", ["x" * 201, "  "], ids=["too-long", "blank"])
def test_park_reason_the_core_refuses_is_400_invalid(users, view_class, reason):
    post_json(client_for(users["staff"]), messages_url(), body())
    view = view_class.as_view(request_serializer=AnyReasonSerializer)
    request = APIRequestFactory().post(workspace_url(op="park"), {"reason": reason}, format="json")
    force_authenticate(request, user=users["staff"])
    response = view(request, workspace_id="alice")
    response.render()
    assert response.status_code == 400
    assert json.loads(response.content) == {
        "detail": "reason must be a non-empty string of at most 200 characters",
        "code": "invalid",
    }
    assert str(entries()[0].status) == "pending"


def test_a_validation_error_that_names_no_field_is_a_non_field_error():
    """A ``ValidationError`` raised with a message or a list, not a dict of fields (a
    project's serializer or view code), answers 400 ``invalid`` with the messages under
    ``non_field_errors``, as DRF names them (docs/reference/rest.md)."""
    for raised in (ValidationError("Pick one."), ValidationError(["Pick one.", "Or two."])):
        response = outbox_exception_handler(raised, {})
        assert response is not None and response.status_code == 400
        assert response.data["code"] == "invalid"
        assert response.data["fieldErrors"] == {"non_field_errors": [str(m) for m in raised.detail]}


def test_a_plain_value_error_is_not_mapped_so_it_stays_a_server_error():
    """Only the core's typed errors are client errors; a bare ValueError is a bug (500)."""
    assert outbox_exception_handler(ValueError("a server bug"), {}) is None
    response = outbox_exception_handler(InvalidContent("a rule"), {})
    assert response is not None and response.status_code == 400


def test_printable_ascii_client_message_ids_are_accepted(staff):
    for cmid in [" ", "~", "x" * 128, "a b!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}"]:
        assert post_json(staff, messages_url(), body(cmid=cmid)).status_code == 202


def test_model_null_means_no_model(staff):
    response = post_json(staff, messages_url(), body(model=None))
    assert response.status_code == 202
    assert "model" not in response.json()


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"{", "parse_error"),
        (b"not json", "parse_error"),
        (b'{"clientMessageID": "c", "text": NaN}', "parse_error"),
        (b"[" * 100_000 + b"]" * 100_000, "parse_error"),
        (b'{"clientMessageID": "c", "text": "\xff"}', "parse_error"),
        (b'{"clientMessageID": "c", "text": "x", "model": {"n": 1e400}}', "invalid"),
        (b"[]", "invalid"),
        (b'"text"', "invalid"),
        (b"null", "invalid"),
        (b"", "invalid"),
    ],
    ids=[
        "truncated",
        "garbage",
        "nan",
        "deep",
        "not-utf8",
        "inf",
        "array",
        "string",
        "null",
        "empty",
    ],
)
def test_malformed_json_400(staff, r, raw, code):
    response = staff.post(messages_url(), raw, content_type="application/json")
    assert_error(response, 400, code)
    assert r.dbsize() == 0


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_other_content_types_415(staff, r, content_type):
    raw = json.dumps(body()).encode()
    response = staff.post(messages_url(), raw, content_type=content_type)
    assert_error(response, 415, "unsupported_media_type")
    assert r.dbsize() == 0


# --- the model allow-list (docs/reference/settings.md#models) ----------------------------------

ALLOWED_MODELS = ["anthropic/claude-sonnet-4", "openai/gpt-5*"]


@pytest.mark.parametrize(
    "model",
    [
        {"providerID": "evil", "modelID": "expensive-model"},
        {"providerID": "anthropic", "modelID": "claude-opus-4"},  # not the allowed one
        {"providerID": "OpenAI", "modelID": "gpt-5"},  # case matters
        {"id": "m"},  # names no provider and model
        {"providerID": "anthropic", "modelID": ["claude-sonnet-4"]},
    ],
)
def test_a_model_outside_the_allow_list_is_400_and_stores_nothing(staff, model):
    with override_settings(OUTBOX={"MODELS": ALLOWED_MODELS}):
        response = post_json(staff, messages_url(), body(model=model))
        assert_error(response, 400, "model_not_allowed")
        assert entries() == []


def test_allowed_models_and_no_model_are_accepted(staff):
    with override_settings(OUTBOX={"MODELS": ALLOWED_MODELS}):
        for i, model in enumerate(
            [
                {"providerID": "anthropic", "modelID": "claude-sonnet-4"},
                {"providerID": "openai", "modelID": "gpt-5-mini", "variant": "fast"},
                None,
            ]
        ):
            response = post_json(staff, messages_url(), body(cmid=f"c{i}", model=model))
            assert response.status_code == 202, response.content
    assert len(entries()) == 3


# --- one user's accepts over every workspace (docs/explanation/idempotency.md) ---------------


def test_one_user_over_many_workspaces_is_throttled_in_total(users, staff):
    """The per-workspace bounds allow 30 a minute in each workspace; over 16 workspaces that
    was 480 a minute. ``USER_ACCEPTS_PER_MINUTE_ALL`` bounds the user's sum: the accept over
    it answers 429 ``throttled`` with Retry-After and stores nothing, while another user
    still gets in."""
    from django.core.cache import cache

    cache.clear()
    with override_settings(OUTBOX={"USER_ACCEPTS_PER_MINUTE_ALL": 6}):
        for i in range(6):
            response = post_json(staff, messages_url(ws=f"ws{i}"), body(cmid=f"c{i}"))
            assert response.status_code == 202, response.content
        over = post_json(staff, messages_url(ws="ws-extra"), body(cmid="c-extra"))
        data = assert_error(over, 429, "throttled")
        assert int(over["Retry-After"]) > 0 and data["detail"]
        assert entries(ws="ws-extra") == []
        assert staff.get(messages_url(ws="ws0")).status_code == 200  # reads are not counted
        other = client_for(
            with_every_outbox_permission(
                type(users["staff"]).objects.create_user("carol", password=None, is_staff=True)
            )
        )
        assert post_json(other, messages_url(ws="ws-extra"), body()).status_code == 202
    cache.clear()


def test_the_throttle_is_on_by_default_and_can_be_turned_off(staff):
    from django.core.cache import cache

    from django_outbox.conf import outbox_settings

    assert outbox_settings().user_accepts_per_minute_all == 60
    cache.clear()
    with override_settings(OUTBOX={"USER_ACCEPTS_PER_MINUTE_ALL": None}):
        for i in range(70):
            assert post_json(staff, messages_url(ws=f"w{i}"), body()).status_code == 202
    cache.clear()
