"""URLs of the outbox API: mount with ``path("outbox/", include("django_outbox.urls"))``.

``api/...`` is the REST API (:mod:`django_outbox.api.urls`), ``api/schema/`` its
OpenAPI 3 document. Names live in the ``django_outbox`` namespace, e.g.
``reverse("django_outbox:api-messages", args=["ws1", "ses1"])``.
"""

from __future__ import annotations

from django.urls import include, path

from .api.schema import OutboxSchemaView

app_name = "django_outbox"

urlpatterns = [
    path("api/schema/", OutboxSchemaView.as_view(), name="api-schema"),
    path("api/", include("django_outbox.api.urls")),
]
