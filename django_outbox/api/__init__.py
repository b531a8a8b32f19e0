"""The REST API of DESIGN section 10: DRF views over the outbox service, OpenAPI via
drf-spectacular. Mount it with ``path("outbox/", include("django_outbox.urls"))``."""
