"""Who changed an entry: the actor an edit, move, cancel or Stop records
(docs/explanation/storage.md#who-changed-an-entry).

An actor is a short string, never a prompt's text:

- ``user:<userID>``: an end user through REST, the WebSocket or ``outbox.js``;
  ``<userID>`` is written as an entry's ``userID`` is (the REST API stores the user's pk),
  so ``editedBy == "user:" + userID`` reads "the author did it";
- ``staff:<pk>``: a staff user in the admin (the user's primary key);
- ``cli:<login>``: an operator running ``manage.py outbox`` (the operating system login,
  ``cli`` alone when it cannot be read);
- ``system``: code calling the Python API without naming an actor.

The scripts that make the transition write it into the entry's state run (``editedBy``,
``movedBy``, ``cancelledBy``, ``stoppedBy``), so it is recorded by the same atomic step.
"""

from __future__ import annotations

import getpass
import re
from typing import Any

from .errors import InvalidContent
from .rules import MAX_USER_ID_CHARS

#: The actor of a Python API call that names none.
SYSTEM = "system"
#: The longest actor: a ``user:`` prefix and the longest user ID.
MAX_ACTOR_CHARS = MAX_USER_ID_CHARS + 16
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def check_actor(actor: object) -> str:
    """Return ``actor`` if it is a valid actor: a str of 1 to :data:`MAX_ACTOR_CHARS`
    characters (any user ID an accept takes fits after ``user:``). Raises
    :class:`InvalidContent` otherwise."""
    if not isinstance(actor, str) or not actor or len(actor) > MAX_ACTOR_CHARS:
        raise InvalidContent(
            f"actor must be a string of 1 to {MAX_ACTOR_CHARS} characters, e.g. 'user:42', "
            "'staff:1' or 'system'"
        )
    return actor


def user_actor(user_id: Any) -> str:
    """``user:<user_id>``: an end user (``user_id`` as the entry's ``userID`` holds it)."""
    return check_actor(f"user:{user_id}")


def staff_actor(pk: Any) -> str:
    """``staff:<pk>``: a staff user acting in the admin."""
    return check_actor(f"staff:{pk}")


def cli_actor() -> str:
    """``cli:<login>``: an operator running a management command (``cli`` when the
    operating system login cannot be read, as in some containers)."""
    try:
        login = getpass.getuser()
    except Exception:  # no login name (no USER, no passwd entry): still the CLI
        return "cli"
    login = _CONTROL.sub("", login)[:MAX_USER_ID_CHARS]
    return f"cli:{login}" if login else "cli"


#: What each recorded change is called, in the order the entry stores them.
CHANGES = (
    ("edited", "edited_by"),
    ("moved", "moved_by"),
    ("cancelled", "cancelled_by"),
    ("stopped", "stopped_by"),
)


def changes_of(entry: Any) -> list[tuple[str, str]]:
    """The changes an :class:`~django_outbox.core.entry.Entry` records and their actors,
    ``[("edited", "user:7"), ("stopped", "staff:1")]``, in stored order; [] when none."""
    return [(what, getattr(entry, attr)) for what, attr in CHANGES if getattr(entry, attr)]


def actor_user_pk(actor: str) -> str | None:
    """The user's primary key in a ``user:<pk>`` or ``staff:<pk>`` actor; None for any
    other (``cli:...``, ``system``)."""
    kind, _, rest = actor.partition(":")
    return rest if kind in ("user", "staff") and rest else None
