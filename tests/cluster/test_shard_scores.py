"""On a cluster, a shard's copy of a workspace's due time may be early, never late (README
"Valkey Cluster"): a session that becomes due before the time its shard holds is found by
the next scan, without waiting for a wake or the index repair (work is found at once, as
tests/delivery/test_timing.py asks of the wakes)."""

import pytest
import redis

from django_outbox.core.finding import due_sessions
from tests.support.helpers import aaccept

pytestmark = pytest.mark.cluster

T0 = 1_900_000_000.0


async def test_a_session_due_before_its_shards_score_is_found_by_the_scan(cluster_outbox):
    now = [T0]

    async def refuse(entry, **kwargs):
        raise RuntimeError("500")

    outbox = cluster_outbox(deliverer=refuse, retry_backoff=10, clock=lambda: now[0])
    try:
        await aaccept(outbox, "k1", ses="s1")
        assert await outbox.adeliver_once("w1", "s1")  # s1 backs off until T0 + 10 s
        now[0] = T0 + 1
        assert await due_sessions(outbox, 100) == []  # the shard's score is raised to T0 + 10
        await aaccept(outbox, "k2", ses="s2")  # due now: earlier than the shard's score
        assert await due_sessions(outbox, 100) == [("w1", "s2")]
        now[0] = T0 + 10
        assert sorted(await due_sessions(outbox, 100)) == [("w1", "s1"), ("w1", "s2")]
    finally:
        await outbox.aclose()


async def test_an_attention_verdict_carries_the_session_version_it_was_taken_at(
    cluster_outbox, cluster_node_url
):
    """The shard applies a verdict only if it is not older than the last one applied, so a
    late hint never undoes a newer one: each hint must carry its session's version."""

    async def refuse(entry, **kwargs):
        raise RuntimeError("500")

    outbox = cluster_outbox(deliverer=refuse, max_attempts=1)
    node = redis.Redis.from_url(cluster_node_url, decode_responses=True)
    attnver = outbox.keys.shard_keys(outbox.keys.shard_of("w1"))[5]
    try:
        await aaccept(outbox, "k1")
        assert await outbox.adeliver_once("w1", "s1")  # error: needs attention
        version = (await outbox.asnapshot("w1", "s1")).version
        assert outbox.index_totals().attention == 1
        assert int(node.hget(attnver, "w1 s1")) == version
        entry = (await outbox.alist("w1", "s1"))[0]
        assert await outbox.adismiss("w1", "s1", entry.id)
        assert outbox.index_totals().attention == 0
        assert int(node.hget(attnver, "w1 s1")) == (await outbox.asnapshot("w1", "s1")).version
    finally:
        node.close()
        await outbox.aclose()
