"""A worker's wake read (django_outbox/core/finding.py, docs/explanation/storage.md) hands
on only well-formed ``"<workspace> <session>"`` items: one missing either half (written by
something else, or cut) is dropped, never offered as a session with an empty ID."""

from django_outbox.core.finding import wait_wake
from tests.support.scenarios import amake  # noqa: F401  (the fixture)


async def test_a_wake_item_missing_a_half_is_dropped(amake, r):  # noqa: F811
    outbox = amake(deliverer=lambda *a, **k: None)
    key = outbox.keys.index_keys("wake")[0]
    r.rpush(key, "w1 s1", "w1", "w1 ", " s2", "", "w2 s2")
    pairs = await wait_wake(outbox, key, 0.1, 10)
    assert pairs == [("w1", "s1"), ("w2", "s2")]
    assert r.llen(key) == 0
