"""The test suite's Valkey helpers: the ones shipped in :mod:`django_outbox.testing`.

``ValkeyProcess`` is the suite's older name of :class:`~django_outbox.testing.ValkeyServer`.
"""

from __future__ import annotations

from django_outbox.testing import ValkeyServer, free_port, server_binary, wait_until

ValkeyProcess = ValkeyServer

__all__ = ["ValkeyProcess", "ValkeyServer", "free_port", "server_binary", "wait_until"]
