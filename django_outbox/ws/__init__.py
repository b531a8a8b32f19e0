"""The WebSocket wing (README "Live updates (WebSocket)").

- :mod:`django_outbox.ws.consumer`: ``OutboxConsumer``, one client watching one
  session's queue (a snapshot on connect, then every ``queue.update``);
- :mod:`django_outbox.ws.routing`: ``websocket_urlpatterns`` for your ``URLRouter``;
- :mod:`django_outbox.ws.publish`: the channel-layer publisher of ``queue.update``
  messages, called by :class:`django_outbox.outbox.Outbox` on every change.

Nothing is imported here, so importing the publisher does not load the consumer.
"""
