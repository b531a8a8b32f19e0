"""The typed replies of core/replies.py read from what the real scripts answer, on the
less common paths: a replayed accept into a parked workspace, a replayed delivered-settle
(docs/explanation/storage.md "The Lua scripts")."""

import asyncio

from django_outbox.core.replies import AcceptReply, SettleReply
from tests.support.helpers import accept
from tests.support.script_calls import SES, WS, accept_args, call, seed, settle, stored_entry


def test_a_replayed_accept_into_a_parked_workspace_still_says_it_is_held(outbox):
    """An accept whose reply was lost is sent again with the same entry (``own``): the
    replay must report the park too, or the caller's event says ``queued`` for an entry
    stored ``parked`` (docs/explanation/lifecycle.md)."""
    outbox.park_workspace(WS, "hold")
    e = stored_entry(key="k1", text="hi")
    marker = outbox.keys.dedupe(WS, SES, "k1")
    first = AcceptReply.parse(call(outbox, "accept", *accept_args(e), extra_keys=[marker]))
    again = AcceptReply.parse(call(outbox, "accept", *accept_args(e), extra_keys=[marker]))
    assert (first.status, first.held) == ("ok", "hold")
    assert (again.status, again.held) == ("own", "hold")
    assert (again.version, again.seq, again.accepted_at) == (
        first.version,
        first.seq,
        first.accepted_at,
    )


def test_a_replayed_delivered_settle_counts_as_the_delivery(outbox):
    """A holder whose delivered-settle reply was lost asks again and learns it recorded
    the delivery (``replayed``/``removed``): that is a delivery, the others are not."""
    e = seed(outbox)
    assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
    first = SettleReply.parse(settle(outbox, "tok", e.id, "delivered"))
    replay = SettleReply.parse(settle(outbox, "tok", e.id, "delivered"))
    lost = SettleReply.parse(settle(outbox, "other", e.id, "delivered"))
    assert (first.kind, first.delivered) == ("removed", True)
    assert (replay.kind, replay.replayed, replay.delivered) == ("replayed", "removed", True)
    assert (lost.kind, lost.delivered) == ("lost", False)


def test_an_outbox_on_a_decoding_connection_still_sends_a_merged_message_whole(make_outbox, valkey):
    """A ``VALKEY_URL`` may ask redis-py for decoded replies (``?decode_responses=true``):
    the scripts then answer ``str``, and a merged delivery's members must still be read as
    members, not as recovered entries (docs/howto/steering.md#merging)."""
    url = valkey + ("&" if "?" in valkey else "?") + "decode_responses=true"
    outbox = make_outbox(url=url)
    for key in ("a", "b", "c"):
        accept(outbox, key, if_busy="merge")
    messages = []

    async def deliver(entry, **kwargs):
        messages.append(list(entry.parts or (entry.text,)))

    async def once():
        try:
            return await outbox.adeliver_once(WS, SES, deliverer=deliver)
        finally:
            await outbox.aclose()

    assert asyncio.run(once())
    assert messages == [["a", "b", "c"]]
    assert outbox.list(WS, SES) == []
