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
)
READ_ONLY = {"snapshot"}


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
        text = f"#!lua{flags}\n{library}\n-- {name}.lua\n{_read(name)}"
        sha = hashlib.sha1(text.encode("utf-8")).hexdigest()
        scripts[name] = Script(name, text, sha)
    return scripts
