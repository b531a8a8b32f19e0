"""The async client packs commands with hiredis when it is installed (the `fast` extra):
the bytes on the wire must be exactly redis-py's own."""

import pytest
import redis.asyncio

from django_outbox.core.packing import with_hiredis_packing

hiredis = pytest.importorskip("hiredis")  # in the test extra; optional for users


@pytest.mark.parametrize(
    "command",
    [
        ("EVALSHA", "a" * 40, 2, "outboxq:{w1}:s1", "k", 0, 1764466959123456, "ü 🙂 \x00"),
        ("CONFIG GET", "maxmemory-policy"),
        (b"SCRIPT LOAD", b"return 1"),
        ("ZADD", "k", "LT", 1.5, "m"),
        ("SET", "k", memoryview(b"bytes")),
    ],
)
def test_hiredis_packing_sends_the_same_bytes(command):
    fast = with_hiredis_packing(redis.asyncio.Connection)()
    plain = redis.asyncio.Connection()
    assert fast is not plain and type(fast) is not redis.asyncio.Connection
    assert b"".join(fast.pack_command(*command)) == b"".join(
        bytes(chunk) for chunk in plain.pack_command(*command)
    )


@pytest.mark.standalone  # a standalone client's one connection pool
async def test_the_outbox_client_uses_it(make_outbox):
    outbox = make_outbox()
    client = outbox._aclient()
    assert client.connection_pool.connection_class.__name__.startswith("HiredisPacking")
    await outbox.aaccept("w1", "s1", user_id="u", client_message_id="k", text="t")
    assert [e.text for e in await outbox.alist("w1", "s1")] == ["t"]
    await outbox.aclose()
