"""A project laid out as ``startproject`` does, for django_outbox.E004 without
``ASGI_APPLICATION`` (tests/django/test_asgi_checks.py)."""
