"""The session's server is the one the run asked for: Valkey by default, Debian's Redis 7.0
with ``OUTBOX_TEST_SERVER=redis-server`` (``make test-redis7``), so the matrix of
docs/howto/valkey.md#supported-servers tests what it says it tests."""

from __future__ import annotations

import os

import pytest


@pytest.mark.standalone
def test_the_session_server_is_the_one_the_run_asked_for(r):
    info = r.info("server")
    if os.environ.get("OUTBOX_TEST_SERVER") == "redis-server":
        assert info["redis_version"].startswith("7.0.")
        assert "valkey_version" not in info and info.get("server_name") != "valkey"
    else:
        assert info["server_name"] == "valkey"
