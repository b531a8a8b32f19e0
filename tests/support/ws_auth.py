"""The token middleware of docs/howto/clients.md#tokens-on-the-websocket, as a project
would write it: ``scope["user"]`` from an ``Authorization: Token <key>`` header (DRF's
tokens), and ``scope["outbox_revalidate"]``, which the consumer calls at every periodic
check and resync: the token must still exist, belong to that user, and the user be
active.

Served by tests/support/asgi/revoke.py (tests/django/ws/test_revocation_on_servers.py).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware


@database_sync_to_async
def user_for_token(key: str) -> Any:
    """The user of token ``key``, or None."""
    from rest_framework.authtoken.models import Token

    token = Token.objects.select_related("user").filter(key=key).first()
    return token.user if token else None


def token_still_valid(key: str, user_id: Any, scope: dict[str, Any]) -> bool:
    """Whether token ``key`` still exists, still belongs to ``user_id``, and that user is
    active (sync: the consumer runs it in a thread)."""
    from rest_framework.authtoken.models import Token

    return Token.objects.filter(key=key, user_id=user_id, user__is_active=True).exists()


class TokenAuthMiddleware(BaseMiddleware):
    """Sets ``scope["user"]`` and ``scope["outbox_revalidate"]`` from a token header; a
    request without one (or with an unknown token) passes unchanged, so the session
    cookie of ``AuthMiddlewareStack`` around it still works."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if header.startswith("Token "):
            key = header[6:].strip()
            user = await user_for_token(key)
            if user is not None:
                scope = {
                    **scope,
                    "user": user,
                    "outbox_revalidate": partial(token_still_valid, key, user.pk),
                }
        return await super().__call__(scope, receive, send)
