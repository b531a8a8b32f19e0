"""Key names as documented: every process of a fleet, of any version, must build the same
ones (docs/howto/cluster.md, docs/explanation/storage.md)."""

import zlib

from django_outbox.core.keys import KeySpace


def test_a_workspace_belongs_to_the_shard_its_crc32_names():
    """``crc32(ws) % CLUSTER_SHARDS`` (docs/howto/cluster.md): a worker of another release
    must look for a workspace in the same shard's indices."""
    keys = KeySpace("outbox", shards=16)
    for ws in ("w1", "alice", "team-42", "x" * 128):
        assert keys.shard_of(ws) == zlib.crc32(ws.encode()) % 16
    assert [keys.shard_of(ws) for ws in ("w1", "w2", "w3")] == [4, 14, 8]
    assert KeySpace("outbox").shard_of("w1") == 0  # standalone: one copy


def test_every_key_of_a_workspace_carries_its_hash_tag():
    """One workspace lives in one cluster slot: its session keys, its indices, its
    per-minute history and its cut signal all carry ``{<ws>}``."""
    keys = KeySpace("p:")
    session = keys.session("w1", "s1")
    names = [
        *session.script_keys(),
        keys.dedupe("w1", "s1", "m"),
        keys.cut("w1", "s1"),
        keys.owed_failures("w1", "s1"),
        keys.history(7, "w1"),
    ]
    assert all(name.startswith("p:") and "{w1}" in name for name in names)
