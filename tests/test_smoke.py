import asyncio

from django_outbox import Status


async def test_accept_deliver(outbox, signals_log):
    seen = []

    async def deliver(entry, *, workspace_id, session_id, attempt):
        seen.append((entry.text, attempt))

    e = await outbox.aaccept("w1", "s1", user_id="u1", client_message_id="k1", text="hello")
    assert e.status is Status.PENDING
    assert [x.id for x in await outbox.alist("w1", "s1")] == [e.id]
    assert await outbox.adeliver_once("w1", "s1", deliverer=deliver)
    assert seen == [("hello", 1)]
    assert await outbox.alist("w1", "s1") == []
    assert signals_log.ids("delivered") == [e.id]
    await outbox.aclose()
    await asyncio.sleep(0)
