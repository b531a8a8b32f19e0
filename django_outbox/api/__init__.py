"""The REST API (docs/reference/rest.md): DRF views over the outbox service, OpenAPI via
drf-spectacular. Mount it with ``path("outbox/", include("django_outbox.urls"))``.

``base`` (the endpoint base class), ``errors`` (the error contract), ``schema``
(the OpenAPI document), ``serializers``, ``permissions``, ``views`` and ``urls``.
"""
