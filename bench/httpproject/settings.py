"""Settings of the HTTP benchmark project (no middleware, no database on the request path)."""

import os

SECRET_KEY = "bench"
DEBUG = False
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "django_outbox",
]
MIDDLEWARE: list[str] = []
ROOT_URLCONF = "bench.httpproject.urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
USE_TZ = True
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["bench.httpproject.views.FixedUserAuthentication"],
    "UNAUTHENTICATED_USER": None,
}
OUTBOX = {
    "VALKEY_URL": os.environ["OUTBOX_VALKEY_URL"],
    "DELIVERER": "bench.agents.noop",
    "ACCESS_POLICY": "bench.httpproject.views.allow_all",
    "CAP": 1_000_000,
    # One synthetic user sends the whole load: no per-user bounds.
    "USER_MAX_QUEUED": 0,
    "USER_ACCEPTS_PER_MINUTE": 0,
    "USER_ACCEPTS_PER_MINUTE_ALL": 0,
}
SILENCED_SYSTEM_CHECKS = ["django_outbox.W001"]
LOGGING = {"version": 1, "root": {"level": "WARNING"}}
