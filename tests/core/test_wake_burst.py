"""A wake read takes a burst in one round trip: up to ``1 + batch`` items
(core/finding.py wait_wake; docs/explanation/storage.md)."""

import asyncio

from django_outbox.core.finding import wait_wake


def test_a_wake_read_takes_one_item_plus_the_batch(outbox, r):
    key = outbox.keys.index_keys("wake")[0]
    r.rpush(key, "w1 s1", "w1 s2", "w1 s3", "w1 s4")

    async def read():
        try:
            return await wait_wake(outbox, key, 1.0, 2)
        finally:
            await outbox.aclose()

    assert asyncio.run(read()) == [("w1", "s1"), ("w1", "s2"), ("w1", "s3")]
    assert r.lrange(key, 0, -1) == ["w1 s4"]
