"""A project laid out as ``startproject`` does, for django_outbox.E004 without
``ASGI_APPLICATION`` (tests/test_ws_wire_checks.py)."""
