"""Sanity checks for the local Valkey Cluster harness in ``tests/support/cluster.py``."""

from __future__ import annotations

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support.cluster import ValkeyCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 3-master, 3-replica cluster shared by the non-destructive tests."""
    with ValkeyCluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture
def cluster_client(cluster):
    client = RedisCluster.from_url(cluster.startup_url, decode_responses=True)
    yield client
    client.close()


def keys_on_every_master(cluster: ValkeyCluster, per_master: int = 3) -> dict[int, list[str]]:
    """``per_master`` keys for each master, keyed by the master's port."""
    masters = cluster.masters()
    by_master: dict[int, list[str]] = {port: [] for port in masters}
    for i in range(1000):
        key = f"harness:{i}"
        owner = by_master[cluster.master_for_key(key)]
        if len(owner) < per_master:
            owner.append(key)
        if all(len(keys) == per_master for keys in by_master.values()):
            return by_master
    raise AssertionError(f"1000 keys did not cover every master: {by_master}")


def test_cluster_starts_with_one_replica_per_master(cluster):
    masters = cluster.masters()
    assert len(masters) == 3
    assert len(cluster.ports) == 6
    replicas = [cluster.replica_of(port) for port in masters]
    assert sorted(masters + replicas) == sorted(cluster.ports)
    assert cluster.startup_url == f"redis://127.0.0.1:{masters[0]}/0"


def test_cluster_client_reads_and_writes_keys_on_every_master(cluster, cluster_client):
    by_master = keys_on_every_master(cluster)
    for master, keys in by_master.items():
        for key in keys:
            assert cluster_client.set(key, f"value of {key}")
            # The key really lives on that master, not just in the client's slot map.
            direct = redis.Redis(port=master, decode_responses=True)
            assert direct.get(key) == f"value of {key}"
            direct.close()
    for keys in by_master.values():
        for key in keys:
            assert cluster_client.get(key) == f"value of {key}"


def test_replicated_writes_survive_a_master_kill(tmp_path):
    with ValkeyCluster(tmp_path) as cluster:
        by_master = keys_on_every_master(cluster)
        victim = cluster.masters()[0]
        replica = cluster.replica_of(victim)
        # WAIT covers the writes made on the *same connection*, so write and WAIT
        # on one direct connection to the owning master. (RedisCluster.wait() goes
        # to the client's default node only, whichever master owns the key.)
        for master, keys in by_master.items():
            direct = redis.Redis(port=master)
            for key in keys:
                direct.set(key, f"value of {key}")
            assert direct.wait(1, 1000) == 1
            direct.close()

        cluster.kill(victim)
        new_master = cluster.wait_failover(victim, timeout=15)

        assert new_master == replica
        assert victim not in cluster.masters()
        assert new_master in cluster.masters()
        client = RedisCluster.from_url(cluster.startup_url, decode_responses=True)
        try:
            for keys in by_master.values():
                for key in keys:
                    assert client.get(key) == f"value of {key}"
            for key in by_master[victim]:
                assert cluster.master_for_key(key) == new_master
        finally:
            client.close()

        # The old master comes back as a replica of the node that replaced it.
        cluster.restart(victim)
        assert cluster.replicas_of(new_master) == [victim]
        assert sorted(cluster.masters()) == sorted(
            [new_master, *(p for p in by_master if p != victim)]
        )
