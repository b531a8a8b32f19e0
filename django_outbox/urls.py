"""URLs of the outbox API: mount with ``path("outbox/", include("django_outbox.urls"))``."""

app_name = "django_outbox"

urlpatterns: list = []
