"""Merged prompts through the built-in opencode deliverer and verifier, against the fake
opencode server: one user message with a text part per prompt, in accept order, verified
once for all (docs/howto/steering.md#merging)."""

from __future__ import annotations

import math

import pytest

from django_outbox import Status
from django_outbox.delivery import opencode
from django_outbox.delivery.opencode import OpencodeClient, message_id_for
from tests.support.fake_opencode import FakeOpencode, Fault


@pytest.fixture(autouse=True)
async def _opencode_module_state():
    yield
    await opencode.aclose()


@pytest.fixture
async def fake():
    async with FakeOpencode() as server:
        yield server


@pytest.fixture
async def client(fake):
    c = OpencodeClient(fake.base_url, connect_timeout=1, timeout=5, verify_timeout=2)
    yield c
    await c.aclose()


async def test_merge_prompts_are_one_message_with_their_parts(fake, client, make_outbox):
    sid = fake.create_session()
    ob = make_outbox(deliverer=client.deliver, verifier=client.verify)
    try:
        first = await ob.aaccept(
            "w1", sid, user_id="u", client_message_id="k1", text="one", if_busy="merge"
        )
        for key, text in (("k2", "two"), ("k3", "three")):
            await ob.aaccept(
                "w1", sid, user_id="u", client_message_id=key, text=text, if_busy="merge"
            )
        while await ob.adeliver_once("w1", sid):
            pass
        assert fake.user_texts(sid) == [["one", "two", "three"]]
        user = [m for m in fake.messages(sid) if m["info"]["role"] == "user"]
        assert [m["info"]["id"] for m in user] == [message_id_for(first)]
        assert await ob.alist("w1", sid) == []
    finally:
        await ob.aclose()


async def test_a_merged_turn_that_times_out_is_verified_delivered_for_all(
    fake, client, make_outbox, signals_log
):
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(delay=math.inf)  # the turn never ends
    ob = make_outbox(
        deliverer=client.deliver,
        verifier=client.verify,
        delivery_timeout=1,
        verify_delay=0,
        verify_backoff=0.1,
        max_verify_backoff=0.5,
    )
    try:
        ids = [
            (
                await ob.aaccept(
                    "w1", sid, user_id="u", client_message_id=k, text=k, if_busy="merge"
                )
            ).id
            for k in ("a", "b")
        ]
        assert await ob.adeliver_once("w1", sid)
        assert [e.status for e in await ob.alist("w1", sid)] == [Status.VERIFYING] * 2
        fake.faults.clear()
        while await ob.adeliver_once("w1", sid):
            pass
        assert await ob.alist("w1", sid) == []
        assert sorted(signals_log.ids("delivered")) == sorted(ids)
        assert fake.user_texts(sid) == [["a", "b"]]  # never sent again
    finally:
        await ob.aclose()


async def test_a_member_verified_alone_finds_its_part_in_the_merged_message(fake, client):
    """If the group's first entry is gone (dismissed), a member is verified on its own: its
    text is a part of the merged message, sent inside its window."""
    from tests.support.helpers import make_entry

    sid = fake.create_session()
    head = make_entry("one")
    member = make_entry("two", merged_into=head.id)
    await client.deliver(
        head.evolve(parts=("one", "two")), workspace_id="w1", session_id=sid, attempt=1
    )
    verdict = await client.verify(member, workspace_id="w1", session_id=sid)
    assert verdict.name == "DELIVERED"
