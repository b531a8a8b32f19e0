"""The WebSocket wing (docs/reference/websocket.md).

- :mod:`django_outbox.ws.consumer`: ``OutboxConsumer``, one client watching one
  session's queue (a snapshot on connect, then every ``queue.update``);
- :mod:`django_outbox.ws.snapshots`: what that socket sends and when (snapshot pages,
  ``queue.current``, read receipts and slow readers), the consumer's base class;
- :mod:`django_outbox.ws.routing`: ``websocket_urlpatterns`` for your ``URLRouter``;
- :mod:`django_outbox.ws.publish`: the channel-layer publisher of ``queue.update``
  messages, subscribed to :class:`django_outbox.outbox.Outbox`'s events from
  ``OutboxConfig.ready``; it logs as ``django_outbox.ws``;
- :mod:`django_outbox.ws.origin`: ``OriginValidator`` and ``AllowedHostsOriginValidator``,
  channels' origin checks that log a refusal and close with 4403 where the client sees
  it; importable from here (``from django_outbox.ws import AllowedHostsOriginValidator``);
- :mod:`django_outbox.ws.checks`: the channel layer's system check (``W018``).

Nothing is imported here until asked for, so importing the publisher does not load
the consumer or channels' WebSocket classes.
"""

from typing import Any

__all__ = ["AllowedHostsOriginValidator", "OriginValidator"]


def __getattr__(name: str) -> Any:
    """The origin validators of :mod:`django_outbox.ws.origin`, imported on first use."""
    if name in __all__:
        from . import origin

        return getattr(origin, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
