"""One queue WebSocket session through Channels' communicator, for the access tests
(tests/django/test_authz.py, test_policy_table.py): connect as a user, then resync."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

#: A channel layer for in-process sockets (``override_settings(CHANNEL_LAYERS=...)``).
IN_MEMORY_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


def connect_and_resync(
    workspace_id: str, session_id: str, user: Any, between: Callable[[], Any] | None = None
) -> tuple[Any, Any]:
    """Connect to the session's queue socket as ``user`` (the scope's user, as a token
    middleware sets it; None: anonymous), then send ``resync``; ``between`` (sync) runs
    before the resync, e.g. to take away what let the user in. Answers ``(connect,
    resync)``: ``"snapshot"`` (a snapshot, or ``queue.current`` for the resync) or the
    close code; ``(code, None)`` when the connect was refused."""
    from asgiref.sync import async_to_sync, sync_to_async
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import AnonymousUser

    from django_outbox.outbox import get_outbox
    from django_outbox.ws.routing import websocket_urlpatterns

    async def run():
        comm = WebsocketCommunicator(
            URLRouter(websocket_urlpatterns),
            f"/ws/outbox/workspaces/{workspace_id}/sessions/{session_id}/",
        )
        comm.scope["user"] = user if user is not None else AnonymousUser()
        try:
            connected, _ = await comm.connect()
            assert connected  # a refusal accepts, then closes with its code
            output = await comm.receive_output(5)
            if output["type"] == "websocket.close":
                return output["code"], None
            assert json.loads(output["text"])["type"] == "queue.snapshot"
            if between is not None:
                await sync_to_async(between)()
            await comm.send_to(text_data=json.dumps({"type": "resync"}))
            answer = await comm.receive_output(5)
            if answer["type"] == "websocket.close":
                return "snapshot", answer["code"]
            # Answered (queue.current: nothing changed since the first snapshot).
            assert json.loads(answer["text"])["type"] in ("queue.snapshot", "queue.current")
            return "snapshot", "snapshot"
        finally:
            await comm.disconnect()
            await get_outbox().aclose()

    return async_to_sync(run)()


async def origin_refusal_line(origin: bytes, caplog: Any) -> str:
    """The one log line of a socket from ``origin`` refused by an
    :class:`~django_outbox.ws.origin.OriginValidator` allowing only ``https://example.com``,
    as channels calls it (the socket must be accepted, then closed 4403)."""
    import logging

    from channels.testing import WebsocketCommunicator

    from django_outbox.ws.origin import OriginValidator

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a foreign origin got through")

    validator = OriginValidator(never, ["https://example.com"])
    comm = WebsocketCommunicator(validator, "/ws/x/", headers=[(b"origin", origin)])
    with caplog.at_level(logging.WARNING, "django_outbox.consumers"):
        connected, _ = await comm.connect()
        assert connected
        assert await comm.receive_output(5) == {"type": "websocket.close", "code": 4403}
    await comm.disconnect()
    (line,) = [r.getMessage() for r in caplog.records if "refused (4403)" in r.getMessage()]
    return line
