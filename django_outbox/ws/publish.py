"""The channel-layer publisher: ``queue.update`` messages, their shape and their sending.

docs/reference/websocket.md gives the message as clients receive it.

Every state change the service makes — in an API process or a worker — is
published to the Channels group of its session: :func:`subscribe` (called from
``OutboxConfig.ready``) adds :func:`publish` / :func:`apublish` to the Django
outbox's event listeners. Group names allow only
``[A-Za-z0-9._-]`` and fewer than 100 characters, so they are derived by
hashing (workspace, session), behind the project's tag
(:func:`~django_outbox.outbox.key_space_tag`): projects sharing one channel layer
never share a group (docs/howto/valkey.md#sharing-a-channel-layer). A publish that
fails is logged and counted and never fails the mutation: the event is a hint, the
snapshot is the truth (clients that see a version gap ask for a resync).

Events of sessions nobody watches are not published at all: the consumer
counts its clients in the session's ``watch`` key (before it joins the group
and reads its snapshot), and the script that makes a change reports whether
that count is above zero. A client that connects after the change was made
finds it in its snapshot; one that connected before is counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import weakref
from typing import Any

from asgiref.sync import async_to_sync

from ..core.entry import OutboxEvent
from ..outbox import EventListener, Outbox, key_space_tag

logger = logging.getLogger("django_outbox.ws")
#: The name the publisher logged under in 0.1.0, deprecated: a logging config that still
#: sets it up (a level, handlers, ``propagate``) gets the publisher's records there until
#: the next release.
_OLD_LOGGER = logging.getLogger("django_outbox.events")

GROUP_PREFIX = "outbox."
MESSAGE_TYPE = "queue.update"
#: Publications in flight at once per event loop, so a busy worker never exhausts
#: the channel layer's connection pool (channels-redis raises instead of waiting).
MAX_CONCURRENT_PUBLISHES = 32

_limits: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def _limit() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    semaphore = _limits.get(loop)
    if semaphore is None:
        semaphore = _limits[loop] = asyncio.Semaphore(MAX_CONCURRENT_PUBLISHES)
    return semaphore


def group_name(workspace_id: str, session_id: str) -> str:
    """The Channels group of a session: ``outbox.<tag>.`` + 40 hex digits of
    SHA-256(ws, ses), 60 characters, where ``<tag>`` is this project's
    :func:`~django_outbox.outbox.key_space_tag` (12 hex digits of its key space owner's
    identity): two projects on one channel layer, whatever its ``prefix``, never share a
    group, and the publisher (a worker, a web process) and the consumer compute the same
    name from the same ``SECRET_KEY`` and ``KEY_PREFIX``
    (docs/howto/valkey.md#sharing-a-channel-layer). Raises ``ImproperlyConfigured``
    without a ``SECRET_KEY``."""
    digest = hashlib.sha256(f"{workspace_id}\x00{session_id}".encode()).hexdigest()[:40]
    return f"{GROUP_PREFIX}{key_space_tag()}.{digest}"


def update_message(event: OutboxEvent) -> dict[str, Any]:
    """The ``queue.update`` message for an event (also what the consumer forwards).

    ``{"type": "queue.update", "workspaceID", "sessionID", "version", "state",
    "entry"}`` where ``entry`` is the entry's camelCase JSON.
    """
    return {
        "type": MESSAGE_TYPE,
        "workspaceID": event.workspace_id,
        "sessionID": event.session_id,
        "version": event.version,
        "state": event.state,
        "entry": event.entry.to_dict(),
    }


class PublishStats:
    """Counts of publications, readable by tests and metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.published = 0
        self.failed = 0

    def count(self, ok: bool) -> None:
        with self._lock:
            if ok:
                self.published += 1
            else:
                self.failed += 1


stats = PublishStats()


def _logger() -> logging.Logger:
    """``django_outbox.ws``, or the deprecated ``django_outbox.events`` while a logging
    config still sets that one up."""
    old = _OLD_LOGGER
    if old.handlers or old.level != logging.NOTSET or not old.propagate:
        return old
    return logger


def _layer() -> Any:
    from channels.layers import get_channel_layer

    return get_channel_layer()


async def apublish(event: OutboxEvent) -> bool:
    """Publish an ``updated`` event to its session's group; True if it was handed over.

    Other kinds (staged, delivered) are covered by their ``updated`` twin. No
    channel layer configured means nothing to do (True). Never raises.
    """
    if event.kind != "updated" or not event.watched:
        return True
    try:
        layer = _layer()
        if layer is None:
            return True
        async with _limit():
            await layer.group_send(
                group_name(event.workspace_id, event.session_id), update_message(event)
            )
    except Exception as exc:
        stats.count(False)
        _logger().warning(
            "outbox: could not publish %s for %s/%s: %s",
            MESSAGE_TYPE,
            event.workspace_id,
            event.session_id,
            exc,
        )
        return False
    stats.count(True)
    return True


def publish(event: OutboxEvent) -> bool:
    """Sync :func:`apublish` (from request threads and sync service calls)."""
    if event.kind != "updated" or not event.watched:
        return True
    return async_to_sync(apublish)(event)


def subscribe() -> None:
    """Publish the events of every :class:`~django_outbox.outbox.Outbox` from now on
    (``OutboxConfig.ready`` calls it; calling it again changes nothing)."""
    listener = EventListener(publish, apublish)
    if listener not in Outbox.event_listeners:
        Outbox.event_listeners.append(listener)
