"""A session's WebSocket watcher count (``Outbox.awatch``, docs/reference/websocket.md):
counted in and out, and gone from Valkey once nobody watches, so the scripts stop
building events for it and no key is left to its TTL."""

from __future__ import annotations


async def test_the_last_watcher_out_leaves_no_count_behind(outbox, r):
    key = outbox.keys.session("w1", "s1").watch
    assert await outbox.awatch("w1", "s1", +1) == 1
    assert await outbox.awatch("w1", "s1", +1) == 2
    assert await outbox.awatch("w1", "s1", -1) == 1
    assert r.exists(key)
    assert await outbox.awatch("w1", "s1", -1) == 0
    assert not r.exists(key)
    await outbox.aclose()


async def test_a_count_out_below_zero_is_forgotten(outbox, r):
    # A server that counted a watcher out twice (or one counted in by a server since
    # restarted) must not leave a negative count that hides the next watcher.
    assert await outbox.awatch("w1", "s1", -1) == -1
    assert not r.exists(outbox.keys.session("w1", "s1").watch)
    assert await outbox.awatch("w1", "s1", +1) == 1
    await outbox.aclose()
