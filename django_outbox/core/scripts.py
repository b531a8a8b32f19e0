"""The Lua scripts: assembled once from ``core/lua``, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each transition that touches more than one key, or reads then writes, is one
script in its own file, ``core/lua/<name>.lua``. A script starts with its
``#!lua`` line (with its flags, if any), then a header that states its KEYS,
ARGV and every reply, and names what it uses from ``core/lua/lib/`` in
``--@include <name> ...`` lines; a library file may include others the same
way. :func:`load_scripts` puts each named library file before the script's
body, once, in the order the names resolve (what a file includes comes before
it). Nothing else is spliced: a script that runs two transitions
(``settle_next.lua``) calls two library functions.

The flags are Valkey's own: ``no-writes`` for the reads, and ``allow-oom`` for
what drains the queue or keeps a delivery safe (a claim, a delivered-settle, a
release, a lease renewal, recovery, dismissal, cleanup, the cluster index).
Every other writing script is refused whole by Valkey, *before* it runs, on a
server at ``maxmemory``, so an out-of-memory error can never leave a transition
half-applied (docs/howto/valkey.md). The per-session transitions include
``lib/hinted.lua``: on a cluster they answer ``{reply, hint}`` and the client
applies the hint to the workspace's shard (:data:`HINTED`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .config import Config

#: ``--@include a b c``: library files (``core/lua/lib/<name>.lua``) a file uses.
_INCLUDE = re.compile(r"^--@include((?: +[a-z_]+)+) *$", re.MULTILINE)
#: The first line of every script: ``#!lua`` and, optionally, its flags.
_SHEBANG = re.compile(r"^#!lua(?: flags=([a-z,-]+))?$")


@dataclass(frozen=True, slots=True)
class Script:
    """One assembled script: ``name``, full source ``text``, its ``sha`` (hex SHA-1),
    the library files it includes in the order they are put before its body
    (``includes``) and its Valkey ``flags`` (``"allow-oom"``, ``"no-writes"``)."""

    name: str
    text: str
    sha: str
    includes: tuple[str, ...]
    flags: frozenset[str]


def _lua_dir() -> Any:
    return resources.files(__package__).joinpath("lua")


def read_source(name: str) -> str:
    """The text of ``core/lua/<name>.lua`` (``"lib/entry"`` for a library file)."""
    return str(_lua_dir().joinpath(f"{name}.lua").read_text("utf-8"))


def includes_of(text: str) -> list[str]:
    """The names a file's ``--@include`` lines give, in order."""
    return [name for match in _INCLUDE.finditer(text) for name in match.group(1).split()]


def resolve_includes(text: str) -> list[str]:
    """Every library file ``text`` needs, each once, what a file includes before it.
    Raises ``ValueError`` on an include cycle or an unknown name."""
    order: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise ValueError(f"include cycle: {' -> '.join([*visiting, name])}")
        visiting.append(name)
        try:
            source = read_source(f"lib/{name}")
        except FileNotFoundError:
            raise ValueError(f"unknown include {name!r}") from None
        for dep in includes_of(source):
            visit(dep)
        visiting.pop()
        order.append(name)

    for name in includes_of(text):
        visit(name)
    return order


def script_names() -> tuple[str, ...]:
    """The names of the scripts (``core/lua/*.lua``, library files excluded), sorted."""
    return tuple(
        sorted(
            entry.name.removesuffix(".lua")
            for entry in _lua_dir().iterdir()
            if entry.name.endswith(".lua")
        )
    )


def assemble(name: str) -> Script:
    """Script ``name`` as Valkey runs it: its ``#!lua`` line, the library files it
    includes, then its own text. Raises ``ValueError`` if the file does not start with
    a ``#!lua`` line or names an unknown include."""
    source = read_source(name)
    first, _, body = source.partition("\n")
    shebang = _SHEBANG.match(first)
    if shebang is None:
        raise ValueError(f"{name}.lua must start with a #!lua line, not {first!r}")
    includes = tuple(resolve_includes(body))
    parts = [first]
    for lib in includes:
        parts.append(f"-- lib/{lib}.lua\n{read_source(f'lib/{lib}').rstrip()}")
    parts.append(f"-- {name}.lua\n{body.rstrip()}\n")
    text = "\n".join(parts)
    flags = frozenset((shebang.group(1) or "").split(",")) - {""}
    sha = hashlib.sha1(text.encode("utf-8")).hexdigest()
    return Script(name, text, sha, includes, flags)


@cache
def load_scripts() -> dict[str, Script]:
    """Assemble every script once per process: ``{name: Script}``."""
    return {name: assemble(name) for name in script_names()}


#: The scripts' names.
SCRIPT_NAMES = tuple(load_scripts())
#: Per-session transitions (they include ``lib/hinted.lua``): on a cluster they answer
#: ``{reply, hint}`` (see core/hints.py or the cluster index hints in core/transport.py).
HINTED = frozenset(name for name, s in load_scripts().items() if "hinted" in s.includes)
#: Scripts Valkey runs even at ``maxmemory`` (flag ``allow-oom``).
ALLOW_OOM = frozenset(name for name, s in load_scripts().items() if "allow-oom" in s.flags)
#: Scripts that only read (flag ``no-writes``).
READ_ONLY = frozenset(name for name, s in load_scripts().items() if "no-writes" in s.flags)


# --- arguments -------------------------------------------------------------------------
# One builder per script, each giving the script-specific ARGV in the order its
# header (core/lua/<name>.lua) states; the per-session KEYS and the ARGV[1..5]
# prefix come from OutboxBase._session_args (lib/layout.lua). Each reply has its type
# in core/replies.py.


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
    user: str,
    user_max_queued: int = 0,
    user_accepts_per_minute: int = 0,
    history_ttl_ms: int = 0,
    expires_after_us: int = 0,
    mode: str = "queue",
) -> list[Any]:
    """ARGV[6..17] of ``accept.lua``: the entry's JSON and ID, the content fingerprint,
    ``CAP``, the dedupe TTL in milliseconds, the marker's name
    (:func:`~django_outbox.core.keys.dedupe_marker`: the key scoped to the accepting
    user), then the per-user bounds (docs/explanation/idempotency.md): the user's digest
    (:func:`~django_outbox.core.keys.user_digest`), ``USER_MAX_QUEUED`` and
    ``USER_ACCEPTS_PER_MINUTE`` (0: off), and how long the per-minute history keeps the
    count, in milliseconds (``HISTORY_WINDOW``; 0: not counted; docs/howto/observe.md),
    then the accept options (docs/howto/steering.md): how long until the prompt expires
    unsent, in microseconds (0: never), and its mode (``queue``, ``reject``, ``merge``).
    KEYS: the session layout, then the dedupe marker key. Reply:
    :class:`~django_outbox.core.replies.AcceptReply`."""
    return [
        entry_json,
        entry_id,
        fingerprint,
        cap,
        dedupe_ttl_ms,
        marker,
        user,
        user_max_queued,
        user_accepts_per_minute,
        history_ttl_ms,
        expires_after_us,
        mode,
    ]


def seed_argv(entry_json: str, entry_id: str, staged: bool) -> list[Any]:
    """ARGV[6..8] of ``seed.lua`` (test harnesses: django_outbox.testing): the whole
    entry's JSON, its ID, and whether it goes to staging (a delivery a dead worker left
    behind) rather than the queue. Reply: :class:`~django_outbox.core.replies.SeedReply`."""
    return [entry_json, entry_id, "staging" if staged else "queue"]


def claim_argv(token: str, lock_ttl_ms: int, acknowledge: Iterable[str] = ()) -> list[Any]:
    """ARGV[6..] of ``claim.lua``: lease token, lease TTL in milliseconds, then IDs of
    delivered entries whose ``entry_delivered`` fired under this lease."""
    return [token, lock_ttl_ms, *acknowledge]


def settle_argv(
    token: str, entry_id: str, outcome: str, error: str, config: Config, receipt_ttl_ms: int
) -> list[Any]:
    """ARGV[6..18] of ``settle.lua``: lease token, entry ID, outcome, error text (for
    ``delivered``: the agent's reference, :func:`~django_outbox.core.rules.agent_ref_json`'s
    compact JSON or ``""``), then
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


def hold_argv(hold_seconds: float, config: Config) -> list[Any]:
    """ARGV[19..22] of ``settle.lua``, read for the outcome ``held``, all in microseconds:
    how long the agent asked to be left alone (a negative or NaN wait is 0, an endless one
    ``HOLD_MAX``), ``HOLD_FLOOR``, ``HOLD_MAX`` and ``HOLD_MAX_TOTAL``."""
    us = 1_000_000
    wait = hold_seconds if hold_seconds > 0 else 0.0  # NaN compares False: 0
    wait = min(wait, config.hold_max)
    return [
        int(wait * us),
        int(config.hold_floor * us),
        int(config.hold_max * us),
        int(config.hold_max_total * us),
    ]


def settle_next_argv(
    token: str,
    entry_id: str,
    config: Config,
    receipt_ttl_ms: int,
    lock_ttl_ms: int,
    acknowledge: Iterable[str],
    agent_ref: str = "",
) -> list[Any]:
    """ARGV[6..] of ``settle_next.lua``: :func:`settle_argv` for the outcome
    ``delivered`` (``agent_ref`` in the error text's place), then the lease TTL in
    milliseconds and the IDs of delivered entries to acknowledge (the settled entry's
    among them)."""
    settle = settle_argv(token, entry_id, "delivered", agent_ref, config, receipt_ttl_ms)
    return [*settle, lock_ttl_ms, *acknowledge]


def release_argv(token: str, acknowledge: Iterable[str] = ()) -> list[Any]:
    """ARGV[6..] of ``release.lua``: lease token, then IDs of delivered entries to
    acknowledge."""
    return [token, *acknowledge]


def retry_argv(entry_id: str, has_verifier: bool, history_ttl_ms: int) -> list[Any]:
    """ARGV[6..8] of ``retry.lua``: the entry ID, whether a verifier is configured (an
    unverifiable entry is then re-armed as verifying), the per-minute history's TTL in
    milliseconds (0: not counted). Reply: :class:`~django_outbox.core.replies.OperatorReply`."""
    return [entry_id, "1" if has_verifier else "0", history_ttl_ms]


def dismiss_argv(entry_id: str, history_ttl_ms: int) -> list[Any]:
    """ARGV[6..7] of ``dismiss.lua``: the entry ID and the history's TTL (ms; 0: not
    counted). Reply: :class:`~django_outbox.core.replies.OperatorReply`."""
    return [entry_id, history_ttl_ms]


def reason_argv(reason: str, history_ttl_ms: int) -> list[Any]:
    """ARGV[6..7] of ``park.lua`` and ``unpark.lua``: the reason (``""`` for unpark:
    any) and the history's TTL (ms; 0: not counted). Reply:
    :class:`~django_outbox.core.replies.OperatorReply`."""
    return [reason, history_ttl_ms]


def unpause_argv(reason: str) -> list[Any]:
    """ARGV[6] of ``unpause.lua``: the reason the pause must have (``""``: any). Reply:
    :class:`~django_outbox.core.replies.OperatorReply` (``count`` 1: the pause ended)."""
    return [reason]


def rearm_unverifiable_argv(history_ttl_ms: int) -> list[Any]:
    """ARGV[6] of ``rearm_unverifiable.lua``: the history's TTL (ms; 0: not counted).
    Reply: :class:`~django_outbox.core.replies.OperatorReply`."""
    return [history_ttl_ms]


def ledger_argv(entry_id: str, attempts: int, history_ttl_ms: int) -> list[Any]:
    """ARGV[6..8] of ``ledger_complete.lua`` and ``ledger_rearm.lua``: the entry ID, the
    attempts it had when the ledger probe was asked (busy if it moved since), the
    history's TTL (ms; 0: not counted). Reply:
    :class:`~django_outbox.core.replies.OperatorReply`."""
    return [entry_id, attempts, history_ttl_ms]


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


def edit_argv(
    entry_id: str,
    if_version: int | None,
    seen: str,
    content: str,
    history_ttl_ms: int,
    actor: str,
) -> list[Any]:
    """ARGV[6..11] of ``edit.lua``: the entry ID, the session version the caller saw (``""``:
    any), the entry's content as read (from ``,"clientMessageID":`` to the end), the new
    content, the history's TTL (ms; 0: not counted), the actor recorded as ``editedBy``
    (:mod:`~django_outbox.core.actors`). Reply:
    :class:`~django_outbox.core.replies.OperatorReply`."""
    version = "" if if_version is None else if_version
    return [entry_id, version, seen, content, history_ttl_ms, actor]


def move_argv(entry_id: str, where: str, before: str, history_ttl_ms: int, actor: str) -> list[Any]:
    """ARGV[6..10] of ``move.lua``: the entry ID, ``next``/``last``/``before``, the entry to
    go before (``""`` unless ``before``), the history's TTL (ms; 0: not counted), the actor
    recorded as ``movedBy``. Reply: :class:`~django_outbox.core.replies.OperatorReply`."""
    return [entry_id, where, before, history_ttl_ms, actor]


def cancel_argv(entry_id: str, history_ttl_ms: int, actor: str) -> list[Any]:
    """ARGV[6..8] of ``cancel.lua``: the entry ID, the history's TTL (ms; 0: not
    counted) and the actor the removed entry is reported with as ``cancelledBy``. Reply:
    :class:`~django_outbox.core.replies.OperatorReply`."""
    return [entry_id, history_ttl_ms, actor]


def cut_argv(
    entry_id: str, signal_ttl_ms: int, named: str = "", actor: str = "system"
) -> list[Any]:
    """ARGV[6..9] of ``cut.lua``: the entry ID (``""``: the one in flight), the cut
    signal's TTL (ms), the entry a Stop names (``""``: none; with ``entry_id`` ``""``
    only: the turn is cut only while that entry is the one in flight, else the reply is
    ``not_in_flight``) and the actor recorded as ``stoppedBy``; its extra key is the
    session's cut signal (:meth:`~django_outbox.core.keys.KeySpace.cut`). Reply:
    :class:`~django_outbox.core.replies.OperatorReply` (docs/howto/cutting.md)."""
    return [entry_id, signal_ttl_ms, named, actor]


def send_now_argv(
    entry_id: str, signal_ttl_ms: int, actor: str = "system", cut_only: str | None = None
) -> list[Any]:
    """ARGV[6..9] of ``send_now.lua``: the entry ID, the cut signal's TTL (ms), the actor
    (the moved prompt's ``movedBy``, the cut entry's ``stoppedBy``) and the entry whose turn
    alone may be cut (None: whichever runs; ``""``: none, sent as ``-``, never an ID); its
    extra key
    is the session's cut signal. Reply:
    :class:`~django_outbox.core.replies.OperatorReply` (docs/howto/cutting.md)."""
    return [entry_id, signal_ttl_ms, actor, "" if cut_only is None else cut_only or "-"]
