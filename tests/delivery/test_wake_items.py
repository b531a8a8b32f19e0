"""A worker's wake read (django_outbox/core/finding.py, docs/explanation/storage.md) hands
on only well-formed ``"<workspace> <session>"`` items: one missing either half (written by
something else, or cut) is dropped, never offered as a session with an empty ID."""

from django_outbox.core.finding import wait_wake
from tests.support.helpers import wait_for
from tests.support.scenarios import amake  # noqa: F401  (the fixture)


async def test_a_wake_item_missing_a_half_is_dropped(amake, r):  # noqa: F811
    outbox = amake(deliverer=lambda *a, **k: None)
    key = outbox.keys.index_keys("wake")[0]
    r.rpush(key, "w1 s1", "w1", "w1 ", " s2", "", "w2 s2")
    pairs = await wait_wake(outbox, key, 0.1, 10)
    assert pairs == [("w1", "s1"), ("w2", "s2")]
    assert r.llen(key) == 0


async def test_a_busy_worker_leaves_the_wakes_it_has_no_slot_for_to_the_others(amake, r):  # noqa: F811
    """A worker takes from a wake list only what its free slots can start: a wake it cannot
    start stays in the list for another worker (several workers share one backlog evenly)."""
    import asyncio

    from django_outbox.core.worker import Worker

    gates: dict[str, asyncio.Event] = {}
    started: list[str] = []

    async def deliver(entry, *, workspace_id, session_id, attempt):
        started.append(session_id)
        await gates.setdefault(session_id, asyncio.Event()).wait()

    outbox = amake(deliverer=deliver)
    key = outbox.keys.index("wake", outbox.keys.shard_of("w1"))  # w1's shard on a cluster
    stop = asyncio.Event()
    worker = Worker(outbox, None, concurrency=1, tick=30, stop=stop, heartbeat=False)
    run = asyncio.create_task(worker.run())
    try:
        await outbox.aaccept("w1", "s1", user_id="u", client_message_id="k1", text="t")
        await wait_for(lambda: started == ["s1"], 5)
        for ses in ("s2", "s3", "s4"):
            await outbox.aaccept("w1", ses, user_id="u", client_message_id=ses, text="t")
        assert r.llen(key) == 3
        gates["s1"].set()  # one slot frees: at most one wake is taken, two stay for others
        await wait_for(lambda: len(started) == 2, 5)
        # (The freed slot may also be filled from the due index, no wake taken: then 3.)
        assert r.llen(key) >= 2
    finally:
        for gate in gates.values():
            gate.set()
        for ses in ("s2", "s3", "s4"):
            gates.setdefault(ses, asyncio.Event()).set()
        stop.set()
        await asyncio.wait_for(run, 10)
