"""The URL configuration the documentation describes: the outbox mounted at ``outbox/``."""

from django.urls import include, path

urlpatterns = [path("outbox/", include("django_outbox.urls"))]
