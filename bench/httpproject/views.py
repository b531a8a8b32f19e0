"""Authentication, access policy and the baseline view of the HTTP benchmark project."""

import os

import redis
from django.http import HttpResponse
from rest_framework.authentication import BaseAuthentication


class BenchUser:
    pk = "bench"
    id = "bench"
    is_active = True
    is_staff = True
    is_authenticated = True
    is_anonymous = False


_USER = BenchUser()


class FixedUserAuthentication(BaseAuthentication):
    """Every request is the same user; no database lookup."""

    def authenticate(self, request):
        return (_USER, None)


def allow_all(user, workspace_id, session_id, action):
    return True


_client = redis.Redis.from_url(os.environ["OUTBOX_VALKEY_URL"])


def baseline(request):
    """A bare Django view doing one SET (the reference for accept_http)."""
    _client.set(f"baseline:{request.GET.get('k', '0')}", request.body or b"x", ex=60)
    return HttpResponse(b'{"ok":true}', status=202, content_type="application/json")
