"""Build-time helpers of the django-outbox documentation.

- On ``builder-inited`` the OpenAPI document is fetched from the real schema view
  (``outbox/api/schema/``, drf-spectacular) and written to ``_generated/openapi.yaml``,
  which :doc:`reference/rest` renders with sphinxcontrib-openapi and links for download.
- :func:`worker_parser` returns ``manage.py outbox_worker``'s argparse parser, which
  sphinx-argparse renders in :doc:`reference/commands`.

Both need Django configured: ``conf.py`` sets ``DJANGO_SETTINGS_MODULE`` to
``docs_settings`` and calls ``django.setup()`` before Sphinx loads this module.
"""

from __future__ import annotations

from pathlib import Path

GENERATED = Path(__file__).resolve().parent.parent / "_generated"


def write_openapi() -> Path:
    """Write the served OpenAPI 3 document (YAML) to ``_generated/openapi.yaml``."""
    from django.test import Client

    response = Client().get("/outbox/api/schema/")
    if response.status_code != 200:
        raise RuntimeError(f"the schema view answered {response.status_code}")
    GENERATED.mkdir(exist_ok=True)
    target = GENERATED / "openapi.yaml"
    body = response.content
    if not target.exists() or target.read_bytes() != body:  # keep the mtime: no rebuild loop
        target.write_bytes(body)
    return target


def worker_parser():
    """The argparse parser of ``manage.py outbox_worker`` (Django's common options too)."""
    from django_outbox.management.commands.outbox_worker import Command

    return Command().create_parser("manage.py", "outbox_worker")


def outbox_parser():
    """The argparse parser of ``manage.py outbox`` (its subcommands included)."""
    from django_outbox.management.commands.outbox import Command

    return Command().create_parser("manage.py", "outbox")


def _on_builder_inited(app) -> None:
    write_openapi()


def setup(app):
    app.connect("builder-inited", _on_builder_inited)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
