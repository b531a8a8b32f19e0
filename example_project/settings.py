"""Settings of the example project: django-outbox used the way a real project would use it.

``python -m example_project.run`` (``make demo``) sets the environment this file
reads; run by hand, the defaults below expect a Valkey on 127.0.0.1:6379 and an
opencode-compatible agent on 127.0.0.1:4096.

Environment:

- ``OUTBOX_VALKEY_URL``: the Valkey of the outbox *and* of the channel layer.
- ``DEMO_DATA_DIR``: where the SQLite database lives (default ``var/demo``, git-ignored).
- ``DEMO_AGENT_URL`` / ``DEMO_AGENT_PASSWORD``: the opencode(-compatible) server and its
  HTTP Basic password; ``DEMO_AGENT_KIND`` is ``fake`` or ``opencode`` (shown on the page;
  ``fake`` enables the page's fault-injection panel).
- ``DEMO_AGENT_KIND=http``: deliver through ``django_outbox.delivery.http`` to the demo's
  in-house HTTP agent at ``DEMO_AGENT_URL`` (``make demo AGENT=http``,
  ``example_project/http_agent.py``, docs/howto/http-agent.md): one ``AGENTS`` entry.
- ``DEMO_AGENT_KIND=langgraph``: deliver to the LangGraph Agent Server at ``DEMO_AGENT_URL``
  instead (``make demo AGENT=langgraph``; graph ``echo``, docs/howto/langgraph.md).
- ``DEMO_OUTBOX``: a JSON object merged over ``OUTBOX`` (e.g. ``{"LOCK_TTL": 3}``), used by
  the smoke run and ``--agent opencode`` for short timeouts.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ.get("DEMO_DATA_DIR") or REPO / "var" / "demo")
VALKEY_URL = os.environ.get("OUTBOX_VALKEY_URL", "redis://127.0.0.1:6379/0")
AGENT_URL = os.environ.get("DEMO_AGENT_URL", "http://127.0.0.1:4096")
AGENT_KIND = os.environ.get("DEMO_AGENT_KIND", "opencode")
AGENT_PASSWORD = os.environ.get("DEMO_AGENT_PASSWORD") or None

# A demo runs on loopback only; a real project reads these from its secrets.
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "django-insecure-outbox-demo-not-a-secret")
DEBUG = os.environ.get("DEMO_DEBUG", "1") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "channels",
    "django_outbox",
    "example_project.demo",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"
ASGI_APPLICATION = "example_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DATA_DIR / "db.sqlite3",
        # Three processes (web, worker, setup) share the file: wait for locks.
        "OPTIONS": {"timeout": 20},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "/static/"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# outbox.js reads the CSRF token from this cookie, or, when the cookie is HttpOnly (as in
# cookiecutter-django), from the page's {% csrf_token %} input (docs/howto/frontend.md).
# DEMO_CSRF_COOKIE_HTTPONLY=1 tries the latter.
CSRF_COOKIE_HTTPONLY = os.environ.get("DEMO_CSRF_COOKIE_HTTPONLY") == "1"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {"TITLE": "django-outbox demo API", "VERSION": "1"}

# The same Valkey carries the channel layer (queue.update events from the worker).
# socket_timeout must exceed channels-redis's blocking receive (BZPOPMIN, 5 s): redis-py 8
# made 5 s the default, which tears every idle WebSocket down after ~5 s
# (django/channels_redis#422).
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            "hosts": [{"address": VALKEY_URL, "socket_timeout": 30, "socket_keepalive": True}],
            "prefix": "demo-asgi",
        },
    }
}

OUTBOX = {
    "VALKEY_URL": VALKEY_URL,
    "DELIVERER": "django_outbox.delivery.opencode.deliver",
    "VERIFIER": "django_outbox.delivery.opencode.verify",
    "ABORTER": "django_outbox.delivery.opencode.abort",  # Stop / Send now cut the turn
    "ACCESS_POLICY": "example_project.demo.policy.workspace_members",
    "OPENCODE": {"BASE_URL": AGENT_URL, "PASSWORD": AGENT_PASSWORD},
    "DELIVERY_TIMEOUT": 120,
    "RETRY_BACKOFF": 2,
    "MAX_BACKOFF": 30,
}
if AGENT_KIND == "langgraph":
    OUTBOX.update(
        DELIVERER="django_outbox.delivery.langgraph.deliver",
        VERIFIER="django_outbox.delivery.langgraph.verify",
        ABORTER="django_outbox.delivery.langgraph.abort",  # Stop cancels the run
        LANGGRAPH={"URL": AGENT_URL, "ASSISTANT_ID": "echo"},
    )
if AGENT_KIND == "http":
    # One named agent instead of the single DELIVERER/VERIFIER/ABORTER: the only entry
    # of AGENTS serves every session (docs/howto/agents.md). Its password travels in
    # HEADERS, so no error text or lastError ever shows it.
    for single in ("DELIVERER", "VERIFIER", "ABORTER", "OPENCODE"):
        OUTBOX.pop(single)
    _session = AGENT_URL + "/agent/w/{workspace_id}/s/{session_id}"
    _basic = base64.b64encode(f"opencode:{AGENT_PASSWORD or ''}".encode()).decode()
    OUTBOX["AGENTS"] = {
        "inhouse": {
            "DELIVERER": "django_outbox.delivery.http.deliver",
            "VERIFIER": "django_outbox.delivery.http.verify",
            "ABORTER": "django_outbox.delivery.http.abort",  # Stop / Send now cut the turn
            "SEND_URL": _session + "/prompts",
            "VERIFY_URL": _session + "/prompts/{idempotency_key}",
            "ABORT_URL": _session + "/abort",
            "HEADERS": {"Authorization": f"Basic {_basic}"} if AGENT_PASSWORD else {},
        }
    }
OUTBOX.update(json.loads(os.environ.get("DEMO_OUTBOX") or "{}"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "django_outbox": {"handlers": ["console"], "level": "INFO"},
        "example_project": {"handlers": ["console"], "level": "INFO"},
    },
}
