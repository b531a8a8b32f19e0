"""The Lua scripts: loaded once from ``core/lua``, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each transition that touches more than one key, or reads then writes, is one
script in its own file (:data:`VARIANTS` are copies of one with other flags).
``_lib.lua`` (shared helpers and the KEYS/ARGV layout) is prepended to each, and
``_hinted.lua`` wraps the per-session transitions so that on a cluster they
report index hints. The ``#!lua`` shebang makes Valkey refuse a writing script
*before* it runs when memory is full, so an OOM can never leave a transition
half-applied; the scripts in :data:`ALLOW_OOM`, which drain the queue, run anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .config import Config

SCRIPT_NAMES = (
    "accept",
    "claim",
    "settle",
    "renew",
    "release",
    "snapshot",
    "statuses",
    "operate",
    "recover",
    "cleanup",
    "index",
    "due",
    "sockets",
)
#: Scripts that run others' bodies one after the other: ``{name: (file, parts)}``; the
#: file holds the glue, and each part's body goes where its line ``--@<part>`` stands.
COMBINED = {"settle_next": ("settle_next", ("settle", "claim"))}
#: Copies of a script that run only one of its operations: ``{name: (file, operation)}``.
#: They exist for their flags (see ALLOW_OOM).
VARIANTS = {"dismiss": ("operate", "dismiss"), "settle_delivered": ("settle", "delivered")}
READ_ONLY = {"snapshot", "statuses", "due"}
#: Scripts Valkey runs even at ``maxmemory`` (flag ``allow-oom``): what frees memory or
#: keeps a delivery safe — a claim, then a delivered-settle and a release, free a whole
#: entry; renewing keeps a lease from expiring under a running delivery; recovery,
#: dismissal and cleanup only move or remove. Every other writing script (accept,
#: the other settles and operator actions) is refused whole, before it runs, on a
#: full server (README "Operations").
ALLOW_OOM = frozenset(
    {"claim", "settle_delivered", "settle_next", "release", "renew", "recover", "dismiss",
     "cleanup", "index"}
)  # fmt: skip
#: Per-session transitions: on a cluster they answer ``{reply, hint}`` (see _lib.lua).
HINTED = frozenset(
    {"accept", "claim", "settle", "settle_delivered", "settle_next", "release", "operate",
     "dismiss", "recover", "cleanup"}
)  # fmt: skip
#: Scripts on a cluster shard's keys, without the per-session library.
WITHOUT_LIBRARY = frozenset({"index", "due", "sockets"})


@dataclass(frozen=True, slots=True)
class Script:
    """One assembled script: ``name``, full source ``text`` and its ``sha`` (hex SHA-1)."""

    name: str
    text: str
    sha: str


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text("utf-8")


@cache
def load_scripts() -> dict[str, Script]:
    """Assemble every script once per process: ``{name: Script}``."""
    library = _read("_lib")
    hinted = _read("_hinted")
    scripts = {}
    for name in (*SCRIPT_NAMES, *VARIANTS, *COMBINED):
        flags = " flags=no-writes" if name in READ_ONLY else ""
        flags = " flags=allow-oom" if name in ALLOW_OOM else flags
        file, only = VARIANTS.get(name, (name, None))
        body = _read(file)
        if name in COMBINED:
            file, parts = COMBINED[name]
            body = _read(file)
            for part in parts:
                body = body.replace(f"--@{part}\n", _read(part).rstrip("\n") + "\n", 1)
        if only is not None:
            body = f"ONLY_OP = '{only}'\n{body}"
        if name in WITHOUT_LIBRARY:
            text = f"#!lua{flags}\n-- {name}.lua\n{body}"
        elif name in HINTED:
            wrapped = hinted.replace("--@transition\n", body.rstrip("\n") + "\n", 1)
            text = f"#!lua{flags}\n{library}\n-- {name}.lua\n{wrapped}"
        else:
            text = f"#!lua{flags}\n{library}\n-- {name}.lua\n{body}"
        sha = hashlib.sha1(text.encode("utf-8")).hexdigest()
        scripts[name] = Script(name, text, sha)
    return scripts


# --- arguments -------------------------------------------------------------------------
# One builder per script, each giving the script-specific ARGV in the order its
# header (core/lua/<name>.lua) states; the per-session KEYS and the ARGV[1..5]
# prefix come from OutboxBase._session_args (the layout of _lib.lua).


def session_prefix(
    global_keys: int, now_us: int, session_id: str, workspace_id: str, ordering: str
) -> list[Any]:
    """ARGV[1..5] of every per-session script: the number of global keys passed (0 on
    a cluster), now in microseconds, session ID, workspace ID, ordering."""
    return [global_keys, now_us, session_id, workspace_id, ordering]


def accept_argv(
    entry_json: str,
    entry_id: str,
    fingerprint: str,
    cap: int,
    dedupe_ttl_ms: int,
    marker: str,
    target: str = "queue",
    user: str = "",
    user_max_queued: int = 0,
    user_accepts_per_minute: int = 0,
    history_ttl_ms: int = 0,
) -> list[Any]:
    """ARGV[6..15] of ``accept.lua``: the entry's JSON and ID, the content fingerprint,
    ``CAP`` (0: no cap, no marker: seeding), the dedupe TTL in milliseconds, the
    marker's name (:func:`~django_outbox.core.keys.dedupe_marker`: the key scoped to the
    accepting user), ``"queue"`` or ``"staging"`` (seeding a dead holder's delivery),
    then the per-user bounds (README "Per-user bounds"): the user's digest
    (:func:`~django_outbox.core.keys.user_digest`; ``""``: not counted, as seeding),
    ``USER_MAX_QUEUED`` and ``USER_ACCEPTS_PER_MINUTE`` (0: off), and how long the
    per-minute history keeps the count, in milliseconds (``HISTORY_WINDOW``; 0: not
    counted; README "Dashboard"). KEYS: the session layout, then the dedupe marker key."""
    return [
        entry_json,
        entry_id,
        fingerprint,
        cap,
        dedupe_ttl_ms,
        marker,
        target,
        user,
        user_max_queued,
        user_accepts_per_minute,
        history_ttl_ms,
    ]


def claim_argv(token: str, lock_ttl_ms: int, acknowledge: Iterable[str] = ()) -> list[Any]:
    """ARGV[6..] of ``claim.lua``: lease token, lease TTL in milliseconds, then IDs of
    delivered entries whose ``entry_delivered`` fired under this lease."""
    return [token, lock_ttl_ms, *acknowledge]


def settle_argv(
    token: str, entry_id: str, outcome: str, error: str, config: Config, receipt_ttl_ms: int
) -> list[Any]:
    """ARGV[6..18] of ``settle.lua``: lease token, entry ID, outcome, error text, then
    the backoff tunables of ``config`` in microseconds (counts as they are) and the
    settle receipt's TTL in milliseconds."""
    c = config
    us = 1_000_000
    return [
        token,
        entry_id,
        outcome,
        error,
        c.max_attempts,
        int(c.retry_backoff * us),
        int(c.max_backoff * us),
        c.max_transient_failures,
        int(c.verify_delay * us),
        int(c.verify_backoff * us),
        int(c.max_verify_backoff * us),
        c.max_verify_attempts,
        receipt_ttl_ms,
    ]


def settle_next_argv(
    token: str,
    entry_id: str,
    config: Config,
    receipt_ttl_ms: int,
    lock_ttl_ms: int,
    acknowledge: Iterable[str],
) -> list[Any]:
    """ARGV[6..] of ``settle_next.lua``: :func:`settle_argv` for the outcome
    ``delivered``, then the lease TTL in milliseconds and the IDs of delivered entries to
    acknowledge (the settled entry's among them)."""
    settle = settle_argv(token, entry_id, "delivered", "", config, receipt_ttl_ms)
    return [*settle, lock_ttl_ms, *acknowledge]


def release_argv(token: str, acknowledge: Iterable[str] = ()) -> list[Any]:
    """ARGV[6..] of ``release.lua``: lease token, then IDs of delivered entries to
    acknowledge."""
    return [token, *acknowledge]


def operate_argv(op: str, arg1: str = "", arg2: str = "", history_ttl_ms: int = 0) -> list[Any]:
    """ARGV[6..9] of ``operate.lua``: the operation (``retry``, ``dismiss``, ``park``,
    ``unpark``, ``rearm_unverifiable``, ``ledger_complete``, ``ledger_rearm``), its two
    arguments, and the per-minute history's TTL in milliseconds (0: not counted)."""
    return [op, arg1, arg2, history_ttl_ms]


def renew_call(
    global_keys: list[str],
    now_us: int,
    lock_ttl_ms: int,
    leases: Iterable[tuple[str, str, str, str, str]],
) -> tuple[list[str], list[Any]]:
    """``(KEYS, ARGV)`` of ``renew.lua`` for ``leases`` given as ``(lock key, due key,
    token, session ID, workspace ID)``; ``global_keys`` is ``[workspaces-due key]`` on
    a standalone server, ``[]`` on a cluster (one call per workspace there)."""
    keys = list(global_keys)
    argv: list[Any] = [len(keys), now_us, "", "", "", lock_ttl_ms]
    for lock, due, token, session_id, workspace_id in leases:
        keys += [lock, due]
        argv += [token, session_id, workspace_id]
    return keys, argv


def index_hint_argv(
    workspace_id: str, session_id: str, hint: Iterable[int], now_ms: int, wake_cap: int
) -> list[Any]:
    """ARGV of ``index.lua``'s ``hint`` operation: workspace, session, the seven HINT
    members (due, wake, attention, new, gone, workspace empty, version), now in
    milliseconds and the wake list's cap. KEYS: the shard's keys."""
    return ["hint", workspace_id, session_id, *hint, now_ms, wake_cap]


def index_drop_argv(workspace_id: str, score_ms: int) -> list[Any]:
    """ARGV of ``index.lua``'s ``drop`` operation: remove the workspace from the shard's
    due ZSET only if its score is still ``score_ms``."""
    return ["drop", workspace_id, score_ms]


def due_argv(now_us: int, limit: int, *, with_scores: bool = False) -> list[Any]:
    """ARGV of ``due.lua``: now in microseconds (0: the server's clock), the most
    members to return (-1: all), and whether to return their scores. KEYS: one
    due-time ZSET."""
    return [now_us, limit, "1" if with_scores else "0"]
