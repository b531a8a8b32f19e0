"""The OpenAPI 3 document of the REST API (drf-spectacular).

The parameters and error responses every endpoint shares, the :func:`documented`
decorator the views use, and :class:`OutboxSchemaView`, which serves the
document of the outbox endpoints only (:func:`only_outbox_endpoints`).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from drf_spectacular.views import SpectacularAPIView

from .base import OutboxAPIView
from .errors import FULL_RETRY_AFTER, UNAVAILABLE_RETRY_AFTER
from .serializers import (
    IDENTIFIER_PATTERN,
    ErrorSerializer,
    ForbiddenSerializer,
    UnavailableSerializer,
    ValidationErrorSerializer,
)

_ID_HELP = "1 to 128 characters: ASCII letters, digits, '.', '_' and '-', starting alnum."
WORKSPACE_PARAM = OpenApiParameter(
    "workspace_id",
    str,
    OpenApiParameter.PATH,
    pattern=IDENTIFIER_PATTERN,
    description=f"Workspace ID; {_ID_HELP}",
)
SESSION_PARAM = OpenApiParameter(
    "session_id",
    str,
    OpenApiParameter.PATH,
    pattern=IDENTIFIER_PATTERN,
    description=f"Session ID; {_ID_HELP}",
)
ENTRY_PARAM = OpenApiParameter(
    "entry_id",
    str,
    OpenApiParameter.PATH,
    pattern=IDENTIFIER_PATTERN,
    description="Entry ID (the ``id`` of an entry).",
)
FULL_RETRY_AFTER_HEADER = OpenApiParameter(
    "Retry-After",
    int,
    OpenApiParameter.HEADER,
    response=[429],
    description=f"Seconds to wait before retrying ({FULL_RETRY_AFTER} for outbox_full; for "
    "rate_limited, the seconds until the user's next accept can succeed).",
)
UNAVAILABLE_RETRY_AFTER_HEADER = OpenApiParameter(
    "Retry-After",
    int,
    OpenApiParameter.HEADER,
    response=[503],
    description=f"Seconds to wait before retrying ({UNAVAILABLE_RETRY_AFTER}).",
)


def with_common_errors(own: dict[int, Any]) -> dict[int, Any]:
    """The error responses every endpoint can give, plus the endpoint's ``own``
    (``{status: serializer or OpenApiResponse}``), sorted by status."""
    responses: dict[int, Any] = {
        400: OpenApiResponse(
            ValidationErrorSerializer,
            "A malformed ID in the path (invalid_identifier) or body (invalid, parse_error).",
        ),
        401: OpenApiResponse(
            ErrorSerializer,
            "Not authenticated, with a WWW-Authenticate header (when the project's first "
            "authentication class sends one).",
        ),
        403: OpenApiResponse(
            ForbiddenSerializer,
            "Not authenticated (not_authenticated, session authentication), CSRF failed, or "
            "the access policy refused the action (permission_denied, naming it in action).",
        ),
        406: OpenApiResponse(ErrorSerializer, "The Accept header excludes application/json."),
        503: OpenApiResponse(
            UnavailableSerializer,
            "Valkey unreachable, out of memory, or a durability wait timed out (unavailable).",
        ),
    }
    responses.update(own)
    return dict(sorted(responses.items()))


#: The refusals of an endpoint that takes a body: 413 and 415.
BODY_ERRORS = {
    413: OpenApiResponse(
        ErrorSerializer, "The body exceeds DATA_UPLOAD_MAX_MEMORY_SIZE (too_large)."
    ),
    415: OpenApiResponse(ErrorSerializer, "Content-Type is not application/json."),
}


def documented(**kwargs: Any) -> Any:
    """``extend_schema(**kwargs)`` on drf-spectacular's own ``AutoSchema``, whatever the
    project's ``DEFAULT_SCHEMA_CLASS`` (extend_schema otherwise bases the method's schema
    on it, and a project without drf-spectacular as its default would get a broken
    document). Decorates a view method; for a method a view inherits, pass it to
    ``extend_schema_view(post=documented(...))``."""

    def decorate(method: Any) -> Any:
        method.schema = AutoSchema
        return extend_schema(**kwargs)(method)

    return decorate


def only_outbox_endpoints(endpoints: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """drf-spectacular preprocessing hook: keep the outbox API's endpoints only
    (those served by an :class:`OutboxAPIView`)."""
    return [
        endpoint
        for endpoint in endpoints
        if isinstance(getattr(endpoint[3], "cls", None), type)
        and issubclass(endpoint[3].cls, OutboxAPIView)
    ]


class OutboxSchemaView(SpectacularAPIView):
    """The OpenAPI 3 document of the outbox API, wherever it is mounted.

    YAML by default; ``?format=json`` or ``Accept: application/vnd.oai.openapi+json``
    for JSON. Only the outbox endpoints are described, with their full paths.
    """

    custom_settings = {
        "TITLE": "django-outbox API",
        "DESCRIPTION": "Accept prompts into a durable per-session outbox and operate on it. "
        'Every error body is {"detail": "...", "code": "..."} with a stable code.',
        "VERSION": "1",
        "PREPROCESSING_HOOKS": ["django_outbox.api.schema.only_outbox_endpoints"],
    }


IF_MATCH_HEADER = OpenApiParameter(
    "If-Match",
    str,
    OpenApiParameter.HEADER,
    required=False,
    description='The session version the client last read, quoted ("42"): the list\'s '
    "`ETag` or `version`, or an event's. Another version answers 412 version_mismatch. "
    "Without it the edit applies to whatever the message holds now.",
)
