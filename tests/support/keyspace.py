"""The whole keyspace as data, and the indices a session's entries call for.

A refused transition must write nothing (docs/explanation/storage.md, "The Lua scripts":
every transition decides before it writes). :func:`keyspace` dumps every key of the test
Valkey, with its type and value, so a test can compare the keyspace before and after
and see any write at all: the session's lists, its version, its markers, the workspace's
indices and the global ones, the cut signal, the history. TTLs are left out (they tick),
values are not.

:func:`assert_indices_agree` checks, after a transition that did change something, that
every index points where the session's entries say it should (lib/indices.lua): each
entry in exactly one of the queue and the staging list, the session in the workspace's
due index exactly when something there is due or held, in the admin's attention index
exactly when an entry waits for a person, and its user counted once per entry it still
has. The tests flush the keyspace before each test, so a dump holds only the test's keys.
"""

from __future__ import annotations

import json
from typing import Any

from django_outbox.core.keys import user_digest

#: Statuses that put a session in the admin's attention index (lib/indices.lua).
ATTENTION_STATUSES = {"error", "parked", "verifying", "expired"}


def keyspace(client) -> dict[str, tuple[str, Any]]:
    """Every key of ``client``'s database: ``{key: (type, value)}``, value as a plain,
    comparable Python value (a string, a list, a dict, a sorted list of set members, a
    list of ``(member, score)`` pairs). ``client`` decodes responses. A standalone server
    only (a cluster client's ``SCAN`` walks one node)."""
    out: dict[str, tuple[str, Any]] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == "string":
            value: Any = client.get(key)
        elif kind == "list":
            value = client.lrange(key, 0, -1)
        elif kind == "hash":
            value = client.hgetall(key)
        elif kind == "set":
            value = sorted(client.smembers(key))
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "none":  # expired between SCAN and TYPE
            continue
        else:  # pragma: no cover - the outbox writes no other type
            raise AssertionError(f"{key}: unexpected type {kind}")
        out[key] = (kind, value)
    return out


def keyspace_diff(before: dict, after: dict) -> list[str]:
    """The keys whose presence, type or value differ between two :func:`keyspace` dumps,
    each as a readable line (empty: nothing changed)."""
    lines = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            lines.append(f"{key}: {before.get(key)!r} -> {after.get(key)!r}")
    return lines


def _state(raw: str) -> dict[str, Any]:
    return json.loads(raw)


def assert_indices_agree(client, outbox, ws: str, ses: str, users: tuple[str, ...] = ("u",)):
    """Assert that the session's indices agree with its entries (see the module docstring).

    ``users``: the user IDs whose per-user count to check (``USERS`` HASH: ``"<n> <full
    at>"``, n = the user's entries still queued or in flight). Raises ``AssertionError``
    naming the index that disagrees."""
    keys = outbox.keys.session(ws, ses)
    queue = [_state(raw) for raw in client.lrange(keys.queue, 0, -1)]
    staged = [_state(raw) for raw in client.lrange(keys.staging, 0, -1)]
    locked = bool(client.exists(keys.lock))
    ids = [e["id"] for e in queue + staged]
    assert len(ids) == len(set(ids)), f"an entry is in two places: {ids}"

    attention = (staged and not locked) or any(
        e["status"] in ATTENTION_STATUSES or (locked and e["status"] == "pending") for e in queue
    )
    member = f"{ws} {ses}"
    in_attention = client.zscore(outbox.keys.attention, member) is not None
    assert in_attention == bool(attention), f"attention index: {in_attention}, entries {queue}"

    due = (
        locked
        or bool(staged)
        or not queue
        or any(e["status"] in ("pending", "verifying") for e in queue)
    )
    in_due = client.zscore(keys.due, ses) is not None
    assert in_due == due, f"due index: {in_due}, entries {queue}, staged {staged}"
    ws_due = client.zscore(outbox.keys.workspaces_due, ws) is not None
    assert ws_due == bool(client.zcard(keys.due)), "the workspace's due mirror"

    for user in users:
        digest = user_digest(user)
        owned = [
            e
            for e in queue + staged
            if e.get("userDigest") == digest and e.get("deliveredAt") is None
        ]
        field = client.hget(keys.users, digest)
        counted = int(field.split()[0]) if field else 0
        assert counted == len(owned), f"user {user}: counted {counted}, holds {len(owned)}"
