"""Debian's ``redis-server`` for the tests of supported servers (``apt-get install
redis-server``; ``.ci/run`` installs it): Redis 7.0 on Debian 12, the oldest server the
outbox supports and one without WAITAOF (docs/howto/valkey.md#supported-servers).

It runs through :class:`~django_outbox.testing.ValkeyServer` with ``binary=``: a free
loopback port, a data folder of the test's, persistence off unless asked for.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from django_outbox.testing import ValkeyServer


def binary() -> str | None:
    """The ``redis-server`` on ``PATH``, or None."""
    return shutil.which("redis-server")


def unavailable() -> str | None:
    """Why a test on Redis cannot run here (a sentence for ``pytest.skip``), or None."""
    if binary() is None:
        return (
            "redis-server is not installed (Debian's redis-server package: apt-get install "
            "redis-server; .ci/run installs it)"
        )
    return None


def redis_server(workdir: Path, **config: str) -> ValkeyServer:
    """A (not yet started) ``redis-server`` in ``workdir``; ``config`` as for
    :class:`~django_outbox.testing.ValkeyServer` (``appendonly="yes"``)."""
    found = binary()
    if found is None:
        raise RuntimeError(unavailable())
    return ValkeyServer(workdir, binary=found, **config)
