from django.urls import include, path
from django.views.decorators.csrf import csrf_exempt

from .views import baseline

urlpatterns = [
    path("outbox/", include("django_outbox.urls")),
    path("baseline/", csrf_exempt(baseline)),
]
