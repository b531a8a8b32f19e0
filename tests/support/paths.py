"""Where things are, for tests that start processes in the checkout or read its files."""

from __future__ import annotations

from pathlib import Path

#: The repository's root (the checkout holding ``django_outbox/`` and ``tests/``).
ROOT = Path(__file__).resolve().parents[2]
#: The browser client, as the package ships it.
OUTBOX_JS = ROOT / "django_outbox/static/django_outbox/outbox.js"
