"""C packing of commands for redis-py's async client, when hiredis is installed.

Mixed into the async connection classes by :func:`with_hiredis_packing` (the
``[fast]`` extra); without hiredis the classes are used as they are.
"""

from __future__ import annotations

from typing import Any, cast

try:
    import hiredis
except ImportError:  # optional: pip install django-outbox[fast]
    hiredis = None  # type: ignore[assignment]


class HiredisPacking:
    """Mixed into redis-py's async connection classes when hiredis is installed: pack
    commands in C, as redis-py's sync client already does (its async client packs in
    Python, a sixth of a worker's CPU). Same bytes on the wire; anything hiredis will
    not pack falls back to redis-py's own packer."""

    def pack_command(self, *args: Any) -> list[bytes]:
        head = args[0]
        if isinstance(head, str):
            packed = (*head.encode().split(), *args[1:])
        elif b" " in head:
            packed = (*head.split(), *args[1:])
        else:
            packed = args
        try:
            return [cast(bytes, hiredis.pack_command(packed))]
        except (TypeError, hiredis.HiredisError):
            return super().pack_command(*args)  # type: ignore[misc,no-any-return]


PACKING_CLASSES: dict[type, type] = {}


def with_hiredis_packing(connection_class: type) -> type:
    if hiredis is None or not hasattr(hiredis, "pack_command"):
        return connection_class
    cls = PACKING_CLASSES.get(connection_class)
    if cls is None:
        name = f"HiredisPacking{connection_class.__name__}"
        cls = PACKING_CLASSES[connection_class] = type(name, (HiredisPacking, connection_class), {})
    return cls
