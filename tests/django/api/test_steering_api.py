"""Steering the queue over REST: accept options, edit, move, cancel (docs/howto/steering.md)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from django_outbox import get_outbox

pytestmark = pytest.mark.django_db

WS, SES = "alice", "s1"
MESSAGES = f"/outbox/api/workspaces/{WS}/sessions/{SES}/messages/"


def message_url(entry_id: str, op: str = "") -> str:
    return f"{MESSAGES}{entry_id}/" + (f"{op}/" if op else "")


def post_json(client, url: str, data=None, **headers):
    return client.post(url, json.dumps(data or {}), content_type="application/json", **headers)


def assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    data = response.json()
    assert data["code"] == code and data["detail"]
    return data


@pytest.fixture
def staff(django_user_model) -> APIClient:
    user = django_user_model.objects.create_user("root", password=None, is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_outbox"))
    client = APIClient()
    client.force_login(user)
    return client


def accept(client, cmid: str, text: str | None = None, **extra):
    return post_json(client, MESSAGES, {"clientMessageID": cmid, "text": text or cmid, **extra})


def texts() -> list[str]:
    return [e.text for e in get_outbox().list(WS, SES)]


# --- accept options ----------------------------------------------------------------


def test_accept_with_expiry_and_mode_answers_them(staff):
    response = accept(staff, "c1", expiresAfter=60, ifBusy="reject")
    assert response.status_code == 202, response.content
    data = response.json()
    assert data["mode"] == "reject" and data["expiresAt"] > data["acceptedAt"]
    assert "mode" not in accept(staff, "c2").json()


def test_reject_while_busy_is_409_session_busy_and_stores_nothing(staff):
    accept(staff, "c1")
    assert_error(accept(staff, "c2", ifBusy="reject"), 409, "session_busy")
    assert texts() == ["c1"]
    get_outbox().dismiss(WS, SES, get_outbox().list(WS, SES)[0].id)
    assert accept(staff, "c2", ifBusy="reject").status_code == 202  # no marker was left


@pytest.mark.parametrize(
    "extra",
    [
        {"ifBusy": "later"},
        {"ifBusy": "interrupt"},
        {"ifBusy": 1},
        {"expiresAfter": "10"},
        {"expiresAfter": True},
        {"expiresAfter": 0},
        {"expiresAfter": -5},
        {"expiresAfter": 10**9},
    ],
)
def test_bad_accept_options_are_400(staff, extra):
    data = assert_error(accept(staff, "c1", **extra), 400, "invalid")
    assert set(data["fieldErrors"]) == set(extra)
    assert texts() == []
