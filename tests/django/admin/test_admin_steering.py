"""The admin shows expired prompts like errors: in "Needs attention" and their own filter
(docs/howto/steering.md#expiry)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.admin import CHANGELIST

pytestmark = pytest.mark.django_db


def test_an_expired_prompt_needs_attention(admin_client, make_outbox):
    clock_now = [1_900_000_000.0]
    outbox = make_outbox(clock=lambda: clock_now[0])
    outbox.accept("ws", "ses", user_id="u1", client_message_id="k", text="stale", expires_after=1)
    outbox.accept("ws", "other", user_id="u1", client_message_id="k", text="fresh")
    clock_now[0] += 5

    async def claim():
        try:
            await outbox.adeliver_once("ws", "ses", deliverer=never)
        finally:
            await outbox.aclose()

    async def never(entry, **kwargs):
        raise AssertionError("an expired prompt was sent")

    asyncio.run(claim())
    page = admin_client.get(CHANGELIST).content.decode()
    assert "stale" in page and "fresh" not in page
    expired = admin_client.get(CHANGELIST, {"status": "expired"}).content.decode()
    assert "stale" in expired and "fresh" not in expired
