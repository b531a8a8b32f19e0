"""A tiny Django project for the HTTP accept benchmark (bench.run, measurement accept_http).

The DRF accept endpoint (``django_outbox.urls`` under ``outbox/``) next to a bare view doing
one Valkey SET (``baseline/``). Authentication returns a fixed user and the access policy
allows everyone, so no database lookup is on the path. Served by uvicorn:
``OUTBOX_VALKEY_URL=... uvicorn bench.httpproject.asgi:application``.
"""
