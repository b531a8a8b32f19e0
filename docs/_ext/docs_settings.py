"""Django settings for building the documentation (autodoc imports the package, the
OpenAPI document is generated from the real views, the worker's options come from its
argparse parser). Nothing here connects to Valkey."""

SECRET_KEY = "docs-build-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver"]
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.staticfiles",
    "rest_framework",
    "channels",
    "django_outbox",
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = "docs_urls"
STATIC_URL = "static/"
USE_TZ = True
OUTBOX = {"VALKEY_URL": "redis://127.0.0.1:6379/0"}
