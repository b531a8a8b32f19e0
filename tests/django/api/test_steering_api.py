"""Steering the queue over REST: accept options, edit, move, cancel (docs/howto/steering.md)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission
from rest_framework.test import APIClient

from django_outbox import get_outbox
from tests.support.helpers import delivering

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
        {"ifBusy": "interrupt-now"},
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


# --- edit ---------------------------------------------------------------------------


def patch_json(client, url: str, data, **headers):
    return client.patch(url, json.dumps(data), content_type="application/json", **headers)


def test_edit_with_the_lists_etag_then_a_stale_one(staff):
    entry_id = accept(staff, "c1", "original").json()["id"]
    listed = staff.get(MESSAGES)
    etag = listed["ETag"]
    assert etag == f'"{listed.json()["version"]}"'
    response = patch_json(staff, message_url(entry_id), {"text": "edited"}, HTTP_IF_MATCH=etag)
    assert response.status_code == 200, response.content
    assert response.json()["text"] == "edited" and response["ETag"] != etag
    data = assert_error(
        patch_json(staff, message_url(entry_id), {"text": "again"}, HTTP_IF_MATCH=etag),
        412,
        "version_mismatch",
    )
    assert data and texts() == ["edited"]
    # Without If-Match the edit applies to what the message holds now.
    assert patch_json(staff, message_url(entry_id), {"model": {"id": "m"}}).status_code == 200
    # The original request, resent: still a duplicate of the same entry, never a second one.
    resent = accept(staff, "c1", "original")
    assert resent.status_code == 200 and resent.json() == {"id": entry_id, "duplicate": True}
    assert texts() == ["edited"]


def test_if_match_takes_the_etag_as_a_weak_validator_too(staff):
    """A proxy or a client library may send the list's ``ETag`` back weakened
    (``W/"<version>"``); it names the same session version (docs/howto/steering.md#edit)."""
    entry_id = accept(staff, "c1", "original").json()["id"]
    weak = "W/" + staff.get(MESSAGES)["ETag"]
    response = patch_json(staff, message_url(entry_id), {"text": "edited"}, HTTP_IF_MATCH=weak)
    assert response.status_code == 200, response.content
    stale = patch_json(staff, message_url(entry_id), {"text": "again"}, HTTP_IF_MATCH=weak)
    assert_error(stale, 412, "version_mismatch")
    assert texts() == ["edited"]


@pytest.mark.parametrize(
    ("data", "headers"),
    [
        ({}, {}),
        ({"text": ""}, {}),
        ({"text": 5}, {}),
        ({"model": []}, {}),
        ({"text": "x"}, {"HTTP_IF_MATCH": '"abc"'}),
    ],
)
def test_bad_edits_are_400(staff, data, headers):
    entry_id = accept(staff, "c1").json()["id"]
    assert_error(patch_json(staff, message_url(entry_id), data, **headers), 400, "invalid")
    assert texts() == ["c1"]


def test_edit_of_a_missing_message_is_404(staff):
    assert_error(patch_json(staff, message_url("nope"), {"text": "x"}), 404, "not_found")


def test_edit_move_and_cancel_of_the_message_in_flight_are_409(staff):
    entry_id = accept(staff, "c1").json()["id"]
    other = accept(staff, "c2").json()["id"]
    with delivering(WS, SES):
        answers = {
            "edit": patch_json(staff, message_url(entry_id), {"text": "x"}),
            "move": post_json(staff, message_url(entry_id, "move"), {"to": "last"}),
            "before": post_json(staff, message_url(other, "move"), {"before": entry_id}),
            "cancel": post_json(staff, message_url(entry_id, "cancel")),
        }
    for name in ("edit", "move", "before"):
        assert_error(answers[name], 409, "busy")
    # Cancelling the prompt in flight means cutting its turn: no aborter here.
    assert_error(answers["cancel"], 409, "not_supported")
    assert texts() == ["c2"]


# --- move and cancel ------------------------------------------------------------------


def test_move_and_cancel(staff):
    a, b, c = (accept(staff, k).json()["id"] for k in ("a", "b", "c"))
    response = post_json(staff, message_url(c, "move"), {"to": "next"})
    assert response.status_code == 200 and response.json()["id"] == c
    assert texts() == ["c", "a", "b"]
    assert post_json(staff, message_url(c, "move"), {"before": b}).status_code == 200
    assert texts() == ["a", "c", "b"]
    assert post_json(staff, message_url(a, "move"), {"to": "last"}).status_code == 200
    assert texts() == ["c", "b", "a"]
    assert_error(post_json(staff, message_url(a, "move"), {"before": "gone"}), 404, "not_found")
    for bad in ({}, {"to": "first"}, {"to": "next", "before": b}, {"before": "a b"}):
        assert_error(post_json(staff, message_url(a, "move"), bad), 400, "invalid")
    assert post_json(staff, message_url(b, "cancel")).status_code == 204
    assert_error(post_json(staff, message_url(b, "cancel")), 404, "not_found")
    assert texts() == ["c", "a"]


def test_cancel_of_the_prompt_in_flight_cuts_its_turn(staff, settings):
    """With an aborter, cancel/ of the prompt in flight cuts its turn (202), idempotently;
    its outcome is then verified (docs/howto/cutting.md)."""
    settings.OUTBOX = {**settings.OUTBOX, "ABORTER": "tests.support.agents.abort"}
    entry_id = accept(staff, "c1").json()["id"]
    outbox = get_outbox()
    kind, claimed, _ = outbox._run(outbox._claim_plan(WS, SES, "holder", []))
    assert (kind, claimed.id) == ("deliver", entry_id)  # in flight under a live lease
    response = post_json(staff, message_url(entry_id, "cancel"))
    assert (response.status_code, response.json()) == (202, {"result": "cut"})
    response = post_json(staff, message_url(entry_id, "cancel"))
    assert (response.status_code, response.json()) == (202, {"result": "already"})
    assert [e.interrupted for e in outbox.list(WS, SES)] == [True]


def test_if_match_star_any_version_and_non_ascii_digits(staff):
    """``If-Match: *`` edits whatever the version (RFC 9110: any current representation);
    a version written with digits that are not ASCII (``²``, Latin-1 superscript two) is
    400 ``invalid``, never a 500; the edit's ``ETag`` names the session version a list
    reads right after it (docs/howto/steering.md#edit)."""
    entry_id = accept(staff, "c1", "original").json()["id"]
    response = patch_json(staff, message_url(entry_id), {"text": "starred"}, HTTP_IF_MATCH="*")
    assert response.status_code == 200, response.content
    assert response["ETag"] == staff.get(MESSAGES)["ETag"]
    for weird in ("\u00b2", '"\u00b3"', 'W/"\u00b9"'):
        refused = patch_json(staff, message_url(entry_id), {"text": "x"}, HTTP_IF_MATCH=weird)
        assert_error(refused, 400, "invalid")
    moved = post_json(staff, message_url(entry_id, "move"), {"to": "last"})
    assert moved.status_code == 200 and moved["ETag"] == staff.get(MESSAGES)["ETag"]
    assert texts() == ["starred"]
