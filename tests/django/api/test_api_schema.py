"""The served OpenAPI document: complete, and honoured under schemathesis fuzzing."""

from __future__ import annotations

import base64

import pytest
import schemathesis
from django.contrib.auth.models import Permission
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections
from django.test import Client, override_settings
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from django_outbox.core.rules import ErrorKind

pytestmark = pytest.mark.django_db

SCHEMA_PATH = "/outbox/api/schema/?format=json"
#: Examples per operation and generation mode: 10 operations x 2 modes x 50 = 1000 cases.
MAX_EXAMPLES = 50

OPERATIONS = {
    ("get", "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/"): {200},
    ("post", "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/"): {
        200,
        202,
        409,
        413,
        415,
        422,
        429,
    },
    (
        "post",
        "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/{entry_id}/retry/",
    ): {200, 404, 409},
    (
        "delete",
        "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/{entry_id}/",
    ): {204, 404, 409},
    (
        "patch",
        "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/{entry_id}/",
    ): {200, 404, 409, 412, 413, 415},
    (
        "post",
        "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/{entry_id}/move/",
    ): {200, 404, 409, 413, 415},
    (
        "post",
        "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/{entry_id}/cancel/",
    ): {202, 204, 404, 409},
    ("post", "/outbox/api/workspaces/{workspace_id}/park/"): {200, 413, 415},
    ("post", "/outbox/api/workspaces/{workspace_id}/unpark/"): {200, 413, 415},
    ("delete", "/outbox/api/workspaces/{workspace_id}/"): {200},
    ("post", "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/interrupt/"): {
        200,
        202,
        409,
        413,
        415,
    },
    (
        "post",
        "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/{entry_id}/send-now/",
    ): {200, 202, 404, 409},
    ("get", "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/worker/"): {200},
}
COMMON = {400, 401, 403, 406, 503}


def test_schema_documents_every_operation_status_and_error_body():
    response = Client().get(SCHEMA_PATH)
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.")
    found = {
        (method, path): {int(code) for code in operation["responses"]}
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }
    assert found == {key: own | COMMON for key, own in OPERATIONS.items()}
    schemas = document["components"]["schemas"]
    for path, item in document["paths"].items():
        for operation in item.values():
            for code, answer in operation["responses"].items():
                if int(code) >= 400:
                    ref = answer["content"]["application/json"]["schema"]["$ref"]
                    error = schemas[ref.rsplit("/", 1)[1]]
                    assert {"detail", "code"} <= set(error["required"]), (path, code)
            if "429" in operation["responses"] or "503" in operation["responses"]:
                for code in ("429", "503"):
                    if code in operation["responses"]:
                        assert "Retry-After" in operation["responses"][code]["headers"]


def test_the_entry_schema_documents_what_a_viewer_reads_of_an_error():
    schemas = Client().get(SCHEMA_PATH).json()["components"]["schemas"]
    entry = schemas["Entry"]
    kind = entry["properties"]["errorKind"]["allOf"][0]["$ref"].rsplit("/", 1)[1]
    assert schemas[kind]["enum"] == [k.value for k in ErrorKind]
    assert "`agent_error` - the agent answered with an error" in schemas[kind]["description"]
    status = entry["properties"]["errorStatus"]
    assert (status["type"], status["minimum"], status["maximum"]) == ("integer", 100, 599)
    assert "staff" in entry["properties"]["lastError"]["description"]
    assert not {"errorKind", "errorStatus", "lastError"} & set(entry["required"])


def test_the_accept_schema_offers_every_if_busy_and_documents_not_supported():
    document = Client().get(SCHEMA_PATH).json()
    schemas = document["components"]["schemas"]
    field = schemas["AcceptRequest"]["properties"]["ifBusy"]
    choices = schemas[field["allOf"][0]["$ref"].rsplit("/", 1)[1]] if "allOf" in field else field
    assert set(choices["enum"]) == {"queue", "reject", "interrupt", "merge"}
    assert "cut the running turn" in field["description"]
    path = "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/messages/"
    assert "not_supported" in document["paths"][path]["post"]["responses"]["409"]["description"]


def test_the_interrupt_schema_takes_the_entry_a_stop_names_and_documents_not_in_flight():
    document = Client().get(SCHEMA_PATH).json()
    path = "/outbox/api/workspaces/{workspace_id}/sessions/{session_id}/interrupt/"
    operation = document["paths"][path]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    schema = document["components"]["schemas"][body.rsplit("/", 1)[1]]
    assert set(schema["properties"]) == {"entryID"} and not schema.get("required")
    assert "not_in_flight" in schema["properties"]["entryID"]["description"]
    assert "not_in_flight" in operation["responses"]["409"]["description"]
    assert "not_in_flight" in operation["description"]


def test_schema_yaml_by_default():
    response = Client().get("/outbox/api/schema/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi")


def fuzz(operation, mode: GenerationMode, headers: dict[str, str], seen: set[int]) -> None:
    """Send ``MAX_EXAMPLES`` derandomized cases of one operation; raise on a failed check."""
    checks = [not_a_server_error, response_schema_conformance]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case):
        seen.add(case.call_and_validate(headers=headers, checks=checks).status_code)

    run()


@pytest.fixture
def wsgi_app():
    """Django's WSGI handler, keeping the test's database connection across requests
    (as Django's test client does)."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)


@override_settings(
    ALLOWED_HOSTS=["localhost", "testserver"],
    PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    # With an aborter, interrupt/ and send-now/ are driven past not_supported.
    OUTBOX={"ABORTER": "tests.support.agents.abort"},
)
def test_fuzzed_requests_get_no_5xx_and_conforming_responses(django_user_model, wsgi_app):
    root = django_user_model.objects.create_user("root", password="pw", is_staff=True)
    # an operator: the default policy gives staff their outbox permissions
    root.user_permissions.add(*Permission.objects.filter(content_type__app_label="django_outbox"))
    auth = {"Authorization": "Basic " + base64.b64encode(b"root:pw").decode()}
    schema = schemathesis.openapi.from_wsgi(SCHEMA_PATH, wsgi_app)
    seen: dict[str, set[int]] = {}
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == len(OPERATIONS)
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            fuzz(operation, mode, auth, seen.setdefault(operation.label, set()))
    assert all(code < 500 for codes in seen.values() for code in codes), seen
    # every operation was driven past validation (retry/dismiss of random IDs: 404)
    assert all(codes & {200, 202, 204, 404} for codes in seen.values()), seen
