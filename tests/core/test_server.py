"""The session's server is the one the run asked for: Valkey by default, Debian's Redis 7.0
with ``OUTBOX_TEST_SERVER=redis-server`` (``make test-redis7``), so the matrix of
docs/howto/valkey.md#supported-servers tests what it says it tests."""

from __future__ import annotations

import asyncio
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


@pytest.mark.standalone
def test_a_server_is_named_by_its_own_product_and_version(r, make_outbox):
    """The refusals and the check name what runs there: a Valkey by its own version,
    not the ``redis_version`` it reports for compatibility
    (docs/howto/valkey.md#supported-servers)."""
    info = r.info("server")
    (server,) = make_outbox().server_capabilities()
    if "valkey_version" in info:
        assert str(server) == f"Valkey {info['valkey_version']}"
    else:
        assert str(server) == f"Redis {info['redis_version']}"
    assert server.compatible == tuple(int(p) for p in info["redis_version"].split(".")[:2])
    assert {"BLMPOP", "WAITAOF"} & server.commands


@pytest.mark.standalone
def test_the_async_read_says_what_the_sync_read_says(make_outbox):
    """Both probes send each command bare: "wrong number of arguments" means present."""

    async def read(outbox):
        try:
            return await outbox.aserver_capabilities()
        finally:
            await outbox.aclose()

    assert asyncio.run(read(make_outbox())) == make_outbox().server_capabilities()
