"""Access policies: ``(user, workspace_id, session_id, action) -> bool``.

Actions are ``view``, ``accept``, ``retry``, ``dismiss`` and ``operate``
(park, unpark, cleanup; ``session_id`` is None for those). Set
``OUTBOX["ACCESS_POLICY"]`` to your own; a system check warns while the
default is in use.
"""

from __future__ import annotations

from typing import Any

ACTIONS = ("view", "accept", "retry", "dismiss", "operate")


def staff_only(user: Any, workspace_id: str, session_id: str | None, action: str) -> bool:
    """The default: active staff may do everything, everyone else nothing."""
    return bool(getattr(user, "is_active", False) and getattr(user, "is_staff", False))
