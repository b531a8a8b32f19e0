"""Every answer of the REST API, one row each: what the core raises or returns for each
endpoint, and every malformed field, as the exact ``(status, code)`` the client reads
(docs/reference/rest.md, "Errors"; the table in :mod:`django_outbox.api.errors`).

Each row seeds one pending prompt in a real Valkey, sends one request and checks the
answer; a refusal (any 4xx or 5xx) must leave the session exactly as it was — its
version and its entries, read before and after. The 503 rows talk to a Valkey server
that was started and then stopped, not to a mock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import pytest
from django.contrib.auth.models import AnonymousUser
from django.test import override_settings
from rest_framework.test import APIClient

from django_outbox import get_outbox
from django_outbox.core.rules import MAX_EXPIRES_AFTER, MAX_MODEL_DEPTH, MAX_REASON_CHARS
from django_outbox.errors import RateLimited
from tests.support.helpers import delivering
from tests.support.valkey import ValkeyProcess

pytestmark = pytest.mark.django_db

WS, SES = "wt", "st"
BASE = f"/outbox/api/workspaces/{WS}/"
MESSAGES = f"{BASE}sessions/{SES}/messages/"
MISSING = "no-such-entry"


def entry_url(entry_id: str, op: str = "") -> str:
    return f"{MESSAGES}{entry_id}/" + (f"{op}/" if op else "")


def state() -> tuple[int, list[tuple[Any, ...]]]:
    """The session as a refusal must leave it: its version and every entry's fields."""
    snap = get_outbox().snapshot(WS, SES)
    return snap.version, [
        (e.id, str(e.status), e.text, json.dumps(e.model), e.reason) for e in snap.entries
    ]


def in_flight(entry_id: str):
    """While inside: the seeded prompt is being delivered (``delivering``)."""
    return delivering(WS, SES)


@dataclass(frozen=True)
class Row:
    """One request and its answer. ``path`` gets the seeded entry's ID; ``setup`` runs
    (with the client and the seeded entry) under ``settings`` before the request."""

    method: str
    path: Callable[[str], str]
    expect: tuple[int, str | None]
    body: Any = None
    raw: str | None = None  # a body sent as is (with content_type)
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    django: dict[str, Any] = field(default_factory=dict)
    setup: Callable[[APIClient, Any], None] | None = None
    during: Callable[[str], Any] | None = None  # a context manager around the request
    field_error: str | None = None  # the fieldErrors member a 400 must name
    retry_after: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # more members of the body


def messages(_: str) -> str:
    return MESSAGES


def entry(op: str = "") -> Callable[[str], str]:
    return lambda entry_id: entry_url(entry_id, op)


def missing(op: str = "") -> Callable[[str], str]:
    return lambda entry_id: entry_url(MISSING, op)


def workspace(op: str = "") -> Callable[[str], str]:
    return lambda entry_id: BASE + (f"{op}/" if op else "")


def accept_body(cmid: str = "new", text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {"clientMessageID": cmid, "text": text, **extra}


def without(key: str) -> dict[str, Any]:
    body = accept_body()
    del body[key]
    return body


def nested(depth: int) -> dict[str, Any]:
    """A model whose containers nest ``depth`` levels (the object itself is 1)."""
    value: Any = []
    for _ in range(depth - 2):
        value = [value]
    return {"m": value}


def park(client: APIClient, seeded: Any) -> None:
    assert client.post(f"{BASE}park/", {"reason": "maint"}, format="json").status_code == 200


def rate_used_up(client: APIClient, seeded: Any) -> None:
    """The requesting user's per-minute accepts in the workspace are all taken."""
    outbox = get_outbox()
    for n in range(1, 50):
        try:
            outbox.accept(WS, SES, user_id=seeded.user_id, client_message_id=f"r{n}", text="r")
        except RateLimited:
            return
    raise AssertionError("never rate limited")


def throttle_used_up(client: APIClient, seeded: Any) -> None:
    """The user's REST accepts over every workspace are all taken (other workspaces)."""
    for n in range(7):
        url = f"/outbox/api/workspaces/other{n}/sessions/{SES}/messages/"
        assert client.post(url, accept_body(f"t{n}"), format="json").status_code == 202


TOO_LONG_TEXT = {"MAX_TEXT_BYTES": 1000}
ABORTER = {"ABORTER": "tests.support.agents.abort"}


def interrupt(_: str) -> str:
    return f"{BASE}sessions/{SES}/interrupt/"


ROWS: dict[str, Row] = {
    # --- accept -------------------------------------------------------------------------
    "accept-new-202": Row("post", messages, (202, None), accept_body()),
    "accept-same-key-same-text-200": Row("post", messages, (200, None), accept_body("k0", "x")),
    "accept-same-key-other-text-422": Row(
        "post", messages, (422, "idempotency_conflict"), accept_body("k0", "y")
    ),
    "accept-same-key-other-model-422": Row(
        "post", messages, (422, "idempotency_conflict"), accept_body("k0", "x", model={"id": "m"})
    ),
    "accept-session-full-429": Row(
        "post",
        messages,
        (429, "outbox_full"),
        accept_body(),
        settings={"CAP": 1},
        retry_after="30",
        extra={"scope": "session"},
    ),
    "accept-user-full-429": Row(
        "post",
        messages,
        (429, "outbox_full"),
        accept_body(),
        settings={"USER_MAX_QUEUED": 1},
        retry_after="30",
        extra={"scope": "user"},
    ),
    # 7 a minute: one accept every 8.57 s, so the wait is 9 s rounded up, never 8.
    "accept-rate-limited-seven-a-minute-429-retry-after-9": Row(
        "post",
        messages,
        (429, "rate_limited"),
        accept_body(),
        settings={"USER_ACCEPTS_PER_MINUTE": 7},
        setup=rate_used_up,
        retry_after="9",
    ),
    "accept-throttled-over-every-workspace-429": Row(
        "post",
        messages,
        (429, "throttled"),
        accept_body(),
        settings={"USER_ACCEPTS_PER_MINUTE_ALL": 7},
        setup=throttle_used_up,
        retry_after="60",
    ),
    "accept-reject-while-busy-409": Row(
        "post", messages, (409, "session_busy"), accept_body(ifBusy="reject")
    ),
    "accept-interrupt-without-aborter-409": Row(
        "post", messages, (409, "not_supported"), accept_body(ifBusy="interrupt")
    ),
    "accept-merge-to-an-agent-without-parts-409": Row(
        "post",
        messages,
        (409, "not_supported"),
        accept_body(ifBusy="merge"),
        settings={"DELIVERER": "tests.support.agents.deliver_text_only"},
    ),
    "accept-text-over-max-bytes-413": Row(
        "post", messages, (413, "too_large"), accept_body(text="x" * 1001), settings=TOO_LONG_TEXT
    ),
    "accept-non-ascii-text-over-max-bytes-413": Row(
        "post", messages, (413, "too_large"), accept_body(text="é" * 501), settings=TOO_LONG_TEXT
    ),
    "accept-model-over-16-kib-413": Row(
        "post", messages, (413, "too_large"), accept_body(model={"a": "x" * 17000})
    ),
    "accept-body-over-upload-max-413": Row(
        "post",
        messages,
        (413, "too_large"),
        accept_body(text="x" * 3000),
        django={"DATA_UPLOAD_MAX_MEMORY_SIZE": 2000},
    ),
    "accept-not-json-400": Row("post", messages, (400, "parse_error"), raw="{"),
    "accept-form-encoded-415": Row(
        "post", messages, (415, "unsupported_media_type"), raw="a=b", content_type="text/plain"
    ),
    "accept-body-a-list-400": Row(
        "post", messages, (400, "invalid"), [], field_error="non_field_errors"
    ),
    "accept-put-405": Row("put", messages, (405, "method_not_allowed"), accept_body()),
    "accept-bad-workspace-id-400": Row(
        "post",
        lambda e: "/outbox/api/workspaces/-bad/sessions/s/messages/",
        (400, "invalid_identifier"),
        accept_body(),
    ),
    "accept-bad-session-id-400": Row(
        "post",
        lambda e: f"{BASE}sessions/{'s' * 129}/messages/",
        (400, "invalid_identifier"),
        accept_body(),
    ),
    "list-bad-session-id-400": Row(
        "get", lambda e: f"{BASE}sessions/a~b/messages/", (400, "invalid_identifier")
    ),
    # --- each malformed accept field ----------------------------------------------------
    **{
        f"accept-{name}-400": Row(
            "post", messages, (400, "invalid"), body, field_error=name.split("-")[0]
        )
        for name, body in {
            "clientMessageID-missing": without("clientMessageID"),
            "clientMessageID-number": accept_body(7),
            "clientMessageID-empty": accept_body(""),
            "clientMessageID-129-chars": accept_body("k" * 129),
            "clientMessageID-non-ascii": accept_body("ké"),
            "clientMessageID-newline": accept_body("k\n"),
            "clientMessageID-null": accept_body(None),
            "text-missing": without("text"),
            "text-number": accept_body(text=5),
            "text-empty": accept_body(text=""),
            "text-null": accept_body(text=None),
            "text-list": accept_body(text=["a"]),
            "model-list": accept_body(model=["m"]),
            "model-string": accept_body(model="gpt"),
            "model-too-deep": accept_body(model=nested(MAX_MODEL_DEPTH + 1)),
            "ifBusy-unknown": accept_body(ifBusy="later"),
            "ifBusy-number": accept_body(ifBusy=1),
            "expiresAfter-string": accept_body(expiresAfter="10"),
            "expiresAfter-true": accept_body(expiresAfter=True),
            "expiresAfter-zero": accept_body(expiresAfter=0),
            "expiresAfter-negative": accept_body(expiresAfter=-1),
            "expiresAfter-over-30-days": accept_body(expiresAfter=MAX_EXPIRES_AFTER + 1),
        }.items()
    },
    # JSON that Python reads but that is not UTF-8 or not a finite number
    "accept-text-lone-surrogate-400": Row(
        "post", messages, (400, "invalid"), raw='{"clientMessageID": "n", "text": "a\\ud800"}'
    ),
    "accept-model-lone-surrogate-400": Row(
        "post",
        messages,
        (400, "invalid"),
        raw='{"clientMessageID": "n", "text": "a", "model": {"k": "\\udfff"}}',
    ),
    "accept-model-number-overflowing-to-infinity-400": Row(
        "post",
        messages,
        (400, "invalid"),
        raw='{"clientMessageID": "n", "text": "a", "model": {"t": 1e400}}',
    ),
    "accept-expiresAfter-overflowing-to-infinity-400": Row(
        "post",
        messages,
        (400, "invalid"),
        raw='{"clientMessageID": "n", "text": "a", "expiresAfter": 1e400}',
    ),
    "accept-expiresAfter-huge-integer-400": Row(
        "post",
        messages,
        (400, "invalid"),
        raw='{"clientMessageID": "n", "text": "a", "expiresAfter": 1' + "0" * 400 + "}",
    ),
    "accept-NaN-literal-400": Row(
        "post",
        messages,
        (400, "parse_error"),
        raw='{"clientMessageID": "n", "text": "a", "expiresAfter": NaN}',
    ),
    "accept-nested-too-deep-for-python-400": Row(
        "post", messages, (400, "parse_error"), raw="[" * 100000 + "]" * 100000
    ),
    "edit-text-lone-surrogate-400": Row(
        "patch", entry(), (400, "invalid"), raw='{"text": "\\ud800"}'
    ),
    "park-reason-lone-surrogate-400": Row(
        "post", workspace("park"), (400, "invalid"), raw='{"reason": "\\ud800"}'
    ),
    "unpark-reason-lone-surrogate-400": Row(
        "post", workspace("unpark"), (400, "invalid"), raw='{"reason": "\\ud800"}'
    ),
    "move-before-lone-surrogate-400": Row(
        "post", entry("move"), (400, "invalid"), raw='{"before": "\\ud800"}'
    ),
    "accept-model-at-depth-limit-202": Row(
        "post", messages, (202, None), accept_body(model=nested(MAX_MODEL_DEPTH))
    ),
    "accept-expiresAfter-30-days-202": Row(
        "post", messages, (202, None), accept_body(expiresAfter=MAX_EXPIRES_AFTER)
    ),
    "accept-clientMessageID-128-chars-202": Row(
        "post", messages, (202, None), accept_body("k" * 128)
    ),
    # --- dismiss ------------------------------------------------------------------------
    "dismiss-pending-204": Row("delete", entry(), (204, None)),
    "dismiss-missing-404": Row("delete", missing(), (404, "not_found")),
    "dismiss-in-flight-409": Row("delete", entry(), (409, "busy"), during=in_flight),
    "dismiss-bad-entry-id-400": Row(
        "delete", lambda e: entry_url("bad!id"), (400, "invalid_identifier")
    ),
    # --- retry --------------------------------------------------------------------------
    "retry-pending-200": Row("post", entry("retry"), (200, None)),
    "retry-missing-404": Row("post", missing("retry"), (404, "not_found")),
    "retry-parked-409": Row("post", entry("retry"), (409, "busy"), setup=park),
    "retry-in-flight-409": Row("post", entry("retry"), (409, "busy"), during=in_flight),
    # --- edit ---------------------------------------------------------------------------
    "edit-text-200": Row("patch", entry(), (200, None), {"text": "new"}),
    "edit-nothing-given-400": Row(
        "patch", entry(), (400, "invalid"), {}, field_error="non_field_errors"
    ),
    "edit-text-number-400": Row(
        "patch", entry(), (400, "invalid"), {"text": 1}, field_error="text"
    ),
    "edit-text-empty-400": Row(
        "patch", entry(), (400, "invalid"), {"text": ""}, field_error="text"
    ),
    "edit-model-list-400": Row(
        "patch", entry(), (400, "invalid"), {"model": []}, field_error="model"
    ),
    "edit-text-over-max-bytes-413": Row(
        "patch", entry(), (413, "too_large"), {"text": "x" * 1001}, settings=TOO_LONG_TEXT
    ),
    "edit-if-match-not-a-version-400": Row(
        "patch", entry(), (400, "invalid"), {"text": "new"}, headers={"If-Match": '"v1"'}
    ),
    "edit-if-match-5000-digits-400": Row(
        "patch", entry(), (400, "invalid"), {"text": "new"}, headers={"If-Match": "9" * 5000}
    ),
    "edit-if-match-20-digits-400": Row(
        "patch", entry(), (400, "invalid"), {"text": "new"}, headers={"If-Match": "1" * 20}
    ),
    "edit-if-match-19-digits-412": Row(
        "patch", entry(), (412, "version_mismatch"), {"text": "new"}, headers={"If-Match": "9" * 19}
    ),
    "edit-if-match-old-version-412": Row(
        "patch", entry(), (412, "version_mismatch"), {"text": "new"}, headers={"If-Match": '"0"'}
    ),
    "edit-missing-404": Row("patch", missing(), (404, "not_found"), {"text": "new"}),
    "edit-in-flight-409": Row("patch", entry(), (409, "busy"), {"text": "new"}, during=in_flight),
    # --- move ---------------------------------------------------------------------------
    "move-to-last-200": Row("post", entry("move"), (200, None), {"to": "last"}),
    "move-both-400": Row(
        "post",
        entry("move"),
        (400, "invalid"),
        {"to": "last", "before": "x"},
        field_error="non_field_errors",
    ),
    "move-neither-400": Row(
        "post", entry("move"), (400, "invalid"), {}, field_error="non_field_errors"
    ),
    "move-before-not-an-id-400": Row(
        "post", entry("move"), (400, "invalid"), {"before": "a b"}, field_error="before"
    ),
    "move-to-unknown-400": Row(
        "post", entry("move"), (400, "invalid"), {"to": "first"}, field_error="to"
    ),
    "move-missing-404": Row("post", missing("move"), (404, "not_found"), {"to": "last"}),
    "move-before-missing-404": Row("post", entry("move"), (404, "not_found"), {"before": MISSING}),
    "move-in-flight-409": Row(
        "post", entry("move"), (409, "busy"), {"to": "last"}, during=in_flight
    ),
    # --- cancel, send-now, interrupt (no aborter is configured) ------------------------
    "cancel-queued-204": Row("post", entry("cancel"), (204, None)),
    "cancel-missing-404": Row("post", missing("cancel"), (404, "not_found")),
    "cancel-in-flight-without-aborter-409": Row(
        "post", entry("cancel"), (409, "not_supported"), during=in_flight
    ),
    "send-now-without-aborter-409": Row("post", entry("send-now"), (409, "not_supported")),
    "interrupt-without-aborter-409": Row(
        "post", lambda e: f"{BASE}sessions/{SES}/interrupt/", (409, "not_supported")
    ),
    "interrupt-naming-an-entry-without-aborter-409": Row(
        "post", interrupt, (409, "not_supported"), {"entryID": MISSING}
    ),
    # A Stop names the entry it stops: one not in flight is cut nowhere (an aborter is set)
    "interrupt-naming-an-entry-not-in-flight-409": Row(
        "post", interrupt, (409, "not_in_flight"), {"entryID": MISSING}, settings=ABORTER
    ),
    "interrupt-naming-another-entry-than-the-one-in-flight-409": Row(
        "post",
        interrupt,
        (409, "not_in_flight"),
        {"entryID": MISSING},
        settings=ABORTER,
        during=in_flight,
    ),
    **{
        f"interrupt-entryID-{name}-400": Row(
            "post", interrupt, (400, "invalid"), body, settings=ABORTER, field_error="entryID"
        )
        for name, body in {
            "dot-dot": {"entryID": ".."},
            "slash": {"entryID": "a/b"},
            "empty": {"entryID": ""},
            "129-chars": {"entryID": "e" * 129},
            "number": {"entryID": 7},
            "null": {"entryID": None},
        }.items()
    },
    # --- park, unpark, cleanup, worker ------------------------------------------------
    "park-200": Row("post", workspace("park"), (200, None), {"reason": "maint"}),
    "park-reason-missing-400": Row(
        "post", workspace("park"), (400, "invalid"), {}, field_error="reason"
    ),
    "park-reason-blank-400": Row(
        "post", workspace("park"), (400, "invalid"), {"reason": "  "}, field_error="reason"
    ),
    "park-reason-number-400": Row(
        "post", workspace("park"), (400, "invalid"), {"reason": 3}, field_error="reason"
    ),
    "park-reason-too-long-400": Row(
        "post",
        workspace("park"),
        (400, "invalid"),
        {"reason": "r" * (MAX_REASON_CHARS + 1)},
        field_error="reason",
    ),
    "park-reason-right-to-left-override-400": Row(
        "post", workspace("park"), (400, "invalid"), {"reason": "a\u202eb"}, field_error="reason"
    ),
    "park-reason-control-character-400": Row(
        "post", workspace("park"), (400, "invalid"), {"reason": "a\x07b"}, field_error="reason"
    ),
    "park-reason-at-max-200": Row(
        "post", workspace("park"), (200, None), {"reason": "r" * MAX_REASON_CHARS}
    ),
    "park-bad-workspace-id-400": Row(
        "post", lambda e: "/outbox/api/workspaces/.x/park/", (400, "invalid_identifier"), {}
    ),
    "unpark-empty-200": Row("post", workspace("unpark"), (200, None), {}),
    "unpark-reason-blank-400": Row(
        "post", workspace("unpark"), (400, "invalid"), {"reason": " "}, field_error="reason"
    ),
    "unpark-reason-too-long-400": Row(
        "post",
        workspace("unpark"),
        (400, "invalid"),
        {"reason": "r" * (MAX_REASON_CHARS + 1)},
        field_error="reason",
    ),
    "cleanup-200": Row("delete", workspace(), (200, None)),
    "cleanup-get-405": Row("get", workspace(), (405, "method_not_allowed")),
    "worker-200": Row("get", lambda e: f"{BASE}sessions/{SES}/worker/", (200, None)),
}


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", password=None)


def send(client: APIClient, row: Row, seeded_id: str):
    url = row.path(seeded_id)
    kwargs: dict[str, Any] = {}
    if row.headers:
        kwargs["headers"] = row.headers
    if row.raw is not None:
        return getattr(client, row.method)(url, row.raw, content_type=row.content_type, **kwargs)
    if row.body is None:
        return getattr(client, row.method)(url, **kwargs)
    return getattr(client, row.method)(
        url, json.dumps(row.body), content_type=row.content_type, **kwargs
    )


def check_answer(response, row: Row) -> None:
    status, code = row.expect
    assert response.status_code == status, response.content
    if code is None:
        return
    data = response.json()
    assert data["code"] == code, data
    assert isinstance(data["detail"], str) and data["detail"]
    if row.field_error is not None:
        assert row.field_error in data["fieldErrors"], data
    if row.retry_after is not None:
        assert response["Retry-After"] == row.retry_after
    for key, value in row.extra.items():
        assert data[key] == value, data


@pytest.mark.parametrize("name", list(ROWS))
def test_every_answer(root, name):
    row = ROWS[name]
    client = APIClient()
    client.force_login(root)
    with override_settings(OUTBOX=row.settings, **row.django):
        seeded = get_outbox().accept(
            WS, SES, user_id=str(root.pk), client_message_id="k0", text="x"
        )
        if row.setup is not None:
            row.setup(client, seeded)
        with row.during(seeded.id) if row.during is not None else nullcontext():
            before = state()
            response = send(client, row, seeded.id)
            after = state()
        check_answer(response, row)
        if row.expect[0] >= 400:
            assert after == before, "a refusal changed the session"


# --- what a refusal tells a user without access ----------------------------------------


@pytest.fixture
def viewer(django_user_model):
    from django.contrib.auth.models import Permission

    user = django_user_model.objects.create_user("viewer", password=None, is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_outboxentry"))
    return user


#: row -> (path, method): requests a viewer (view only) may not make
FORBIDDEN = {
    "dismiss": ("delete", lambda e: entry_url(e)),
    "retry": ("post", lambda e: entry_url(e, "retry")),
    "cancel": ("post", lambda e: entry_url(e, "cancel")),
    "edit": ("patch", lambda e: entry_url(e)),
}


@pytest.mark.parametrize("name", list(FORBIDDEN))
def test_a_refused_user_cannot_tell_an_existing_entry_from_a_missing_one(viewer, name):
    """403 before 404: the access policy is asked before Valkey, so the answer for an
    entry that exists and for one that never did is the same, and nothing changes."""
    seeded = get_outbox().accept(WS, SES, user_id="u", client_message_id="k0", text="x")
    client = APIClient()
    client.force_login(viewer)
    method, path = FORBIDDEN[name]
    before = state()
    existing = getattr(client, method)(path(seeded.id), {"text": "y"}, format="json")
    absent = getattr(client, method)(path(MISSING), {"text": "y"}, format="json")
    assert existing.status_code == absent.status_code == 403
    assert existing.json() == absent.json()
    assert existing.json()["code"] == "permission_denied"
    assert state() == before


@pytest.mark.parametrize(
    ("who", "expect"),
    [("anonymous", (403, "not_authenticated")), ("viewer", (400, "invalid_identifier"))],
    ids=["anonymous-not-authenticated-first", "signed-in-bad-id-before-the-policy"],
)
def test_a_malformed_id_is_answered_before_the_policy_and_after_authentication(viewer, who, expect):
    client = APIClient()
    if who == "viewer":
        client.force_login(viewer)
    response = client.delete(entry_url("bad!id"))
    assert (response.status_code, response.json()["code"]) == expect


def test_an_anonymous_user_is_not_told_whether_an_entry_exists():
    seeded = get_outbox().accept(WS, SES, user_id="u", client_message_id="k0", text="x")
    client = APIClient()
    client.force_authenticate(AnonymousUser())
    existing, absent = client.delete(entry_url(seeded.id)), client.delete(entry_url(MISSING))
    assert existing.status_code == absent.status_code == 403
    assert existing.json() == absent.json()


# --- 503 from a Valkey server that is stopped ------------------------------------------


@pytest.fixture(scope="module")
def stopped_valkey(tmp_path_factory):
    """The URL of a real Valkey server that ran and was stopped."""
    server = ValkeyProcess(tmp_path_factory.mktemp("stopped")).start()
    url = server.url
    server.stop()
    return url


UNAVAILABLE = {
    "list": ("get", lambda e: MESSAGES, None, "Retry shortly."),
    "accept": ("post", lambda e: MESSAGES, accept_body(), "clientMessageID"),
    "dismiss": ("delete", lambda e: entry_url(e), None, "nothing was changed"),
    "retry": ("post", lambda e: entry_url(e, "retry"), None, "nothing was changed"),
    "edit": ("patch", lambda e: entry_url(e), {"text": "n"}, "nothing was changed"),
    "move": ("post", lambda e: entry_url(e, "move"), {"to": "last"}, "nothing was changed"),
    "cancel": ("post", lambda e: entry_url(e, "cancel"), None, "nothing was changed"),
    "park": ("post", lambda e: BASE + "park/", {"reason": "m"}, "nothing was changed"),
    "unpark": ("post", lambda e: BASE + "unpark/", {}, "nothing was changed"),
    "cleanup": ("delete", lambda e: BASE, None, "nothing was changed"),
    "worker": ("get", lambda e: f"{BASE}sessions/{SES}/worker/", None, "Retry shortly."),
}


@pytest.mark.parametrize("name", list(UNAVAILABLE))
def test_a_stopped_valkey_answers_503_with_retry_after_5(root, stopped_valkey, name):
    seeded = get_outbox().accept(WS, SES, user_id="u", client_message_id="k0", text="x")
    before = state()
    method, path, body, says = UNAVAILABLE[name]
    client = APIClient()
    client.force_login(root)
    with override_settings(OUTBOX={"VALKEY_URL": stopped_valkey}):
        if body is None:
            response = getattr(client, method)(path(seeded.id))
        else:
            response = getattr(client, method)(path(seeded.id), body, format="json")
    assert response.status_code == 503, response.content
    data = response.json()
    assert (data["code"], data["accepted"]) == ("unavailable", False)
    assert response["Retry-After"] == "5"
    assert says in data["detail"]
    assert state() == before
