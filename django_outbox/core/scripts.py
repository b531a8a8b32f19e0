"""The Lua scripts: loaded once from ``core/lua``, called by SHA (EVALSHA), reloaded on NOSCRIPT.

Each transition that touches more than one key, or reads then writes, is one
script in its own file; ``_lib.lua`` (shared helpers and the KEYS/ARGV layout)
is prepended to each. The ``#!lua`` shebang makes Valkey refuse a writing
script *before* it runs when memory is full, so an OOM can never leave a
transition half-applied.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources

SCRIPT_NAMES = (
    "accept",
    "claim",
    "settle",
    "renew",
    "release",
    "snapshot",
    "operate",
    "cleanup",
    "index",
)
READ_ONLY = {"snapshot"}
#: Per-session transitions: on a cluster they answer ``{reply, hint}`` (see _lib.lua).
HINTED = frozenset({"accept", "claim", "settle", "release", "operate", "cleanup"})
#: Scripts on a cluster shard's keys, without the per-session library.
WITHOUT_LIBRARY = frozenset({"index"})

# Wraps a per-session transition so that, on a cluster (G = 0), its reply
# carries the index hint. DUE_BEFORE/after compare the workspace's earliest due
# time: only a move earlier needs the shard told (it may only ever be early).
_HINTED_BODY = """local DUE_BEFORE = G == 0 and earliest_due() or nil
local function transition()
{body}
end
local reply = transition()
if G ~= 0 then return reply end
local due_after = earliest_due()
if due_after ~= nil and (HINT[8] == 1 or DUE_BEFORE == nil or due_after < DUE_BEFORE) then
  HINT[1] = due_after
end
HINT[7] = tonumber(redis.call('GET', VER) or 0)
if reply == nil then reply = false end
return {{reply, HINT}}
"""


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
    scripts = {}
    for name in SCRIPT_NAMES:
        flags = " flags=no-writes" if name in READ_ONLY else ""
        body = _read(name)
        if name in WITHOUT_LIBRARY:
            text = f"#!lua{flags}\n-- {name}.lua\n{body}"
        elif name in HINTED:
            text = f"#!lua{flags}\n{library}\n-- {name}.lua\n{_HINTED_BODY.format(body=body)}"
        else:
            text = f"#!lua{flags}\n{library}\n-- {name}.lua\n{body}"
        sha = hashlib.sha1(text.encode("utf-8")).hexdigest()
        scripts[name] = Script(name, text, sha)
    return scripts
