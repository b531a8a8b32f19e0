"""A command ran but its reply was lost and the client sent it again."""

import pytest

from django_outbox.errors import Duplicate
from tests.support.proxy import TcpProxy

WS, SES = "w1", "s1"


@pytest.fixture
def proxy(valkey):
    port = int(valkey.rsplit(":", 1)[1].split("/")[0])
    proxy = TcpProxy(port).start()
    yield proxy
    proxy.close()


def test_accept_reply_lost_is_one_entry(make_outbox, proxy):
    # (a) the retried accept recognises its own write: one entry, answered as accepted
    outbox = make_outbox(url=proxy.url)
    outbox.load_scripts()
    proxy.drop_reply_to(outbox.scripts["accept"].sha.encode())
    entry = outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="hi")
    assert proxy.dropped == 1
    assert [e.id for e in outbox.list(WS, SES)] == [entry.id]
    with pytest.raises(Duplicate) as info:
        outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="hi")
    assert info.value.accepted_id == entry.id


async def test_delivered_reply_lost_fires_once_and_is_not_resent(make_outbox, proxy, signals_log):
    # (b) the settle that removes m1 ran, its reply was lost: entry_delivered fires exactly once
    calls = []

    async def deliver(entry, **kwargs):
        calls.append(entry.text)

    outbox = make_outbox(url=proxy.url, deliverer=deliver)
    m1 = await outbox.aaccept(WS, SES, user_id="u", client_message_id="m1", text="m1")
    await outbox.aload_scripts()
    proxy.drop_reply_to(outbox.scripts["settle_delivered"].sha.encode())
    assert await outbox.adeliver_once(WS, SES)
    assert proxy.dropped == 1
    assert signals_log.ids("delivered") == [m1.id]
    assert not await outbox.adeliver_once(WS, SES)
    assert calls == ["m1"] and await outbox.alist(WS, SES) == []
    await outbox.aclose()
