"""Calling one Lua script on its own, as tests/core/test_scripts.py does: the session
layout of workspace ``w1`` and session ``s1`` at a fixed ``NOW`` (microseconds), replies
decoded to text, entries seeded with ``seed.lua``, settles with the outbox's tunables
(docs/explanation/storage.md, "The Lua scripts"), for tests of what a script answers
(core/scripts.py's ARGV builders, core/replies.py's typed replies)."""

from __future__ import annotations

import dataclasses
from typing import Any

from django_outbox import Entry
from django_outbox.core.entry import format_time, new_entry_id
from django_outbox.core.scripts import accept_argv, seed_argv, settle_argv
from django_outbox.core.step import RECEIPT_TTL_MS

WS, SES = "w1", "s1"
NOW = 1_764_466_959_000_000  # microseconds


def decode(value: Any) -> Any:
    """A script's reply with bytes decoded as UTF-8 text (lists element by element)."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def call(outbox, name: str, *args: Any, now: int = NOW, ses: str = SES, extra_keys=()) -> Any:
    """Run script ``name`` with the session layout, ARGV[6..] ``args``, ``now`` in
    microseconds (0: Valkey's clock); returns the decoded reply, raises what it raises."""
    return decode(outbox.run_script(name, WS, ses, args, extra_keys=extra_keys, now_us=now))


def stored_entry(
    accepted: int = NOW, status: str = "pending", key: str = "", text: str = "t", **state: Any
) -> Entry:
    """An entry of user ``u`` accepted at ``accepted`` (us), as a script would store it;
    ``key``: its client message ID (a fresh ``k-...`` when empty); ``state``: further
    Entry fields."""
    return Entry(
        id=new_entry_id(accepted // 1000),
        client_message_id=key or "k-" + new_entry_id(),
        user_id="u",
        text=text,
        accepted_at=format_time(accepted),
        status=status,
        **state,
    )


def seed(outbox, *, status: str = "pending", accepted: int = NOW, ses: str = SES, **state) -> Entry:
    """Store one entry of ``status`` accepted at ``accepted`` (us) with ``seed.lua``
    (staged when ``delivering``); ``state``: further Entry fields. Returns the entry."""
    entry = stored_entry(accepted, status, **state)
    answer = call(
        outbox, "seed", *seed_argv(entry.to_json(), entry.id, status == "delivering"), ses=ses
    )
    assert answer[0] == "ok"
    return entry


def accept_args(entry: Entry, fp: str = "fp1", cap: int = 25, ttl: int = 60_000) -> list[Any]:
    """ARGV[6..] of ``accept.lua`` for ``entry`` by user ``u``, dedupe TTL ``ttl`` ms."""
    return accept_argv(entry.to_json(), entry.id, fp, cap, ttl, entry.client_message_id, "u")


def settle(
    outbox, token: str, entry_id: str, outcome: str, error: str = "", now: int = NOW, **tunables
) -> Any:
    """``settle.lua`` for ``entry_id`` under lease ``token`` with the outbox's config,
    ``tunables`` (Config fields) replaced; returns the decoded reply."""
    config = dataclasses.replace(outbox.config, **tunables) if tunables else outbox.config
    args = settle_argv(token, entry_id, outcome, error, config, RECEIPT_TTL_MS)
    return call(outbox, "settle", *args, now=now)
