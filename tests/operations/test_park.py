"""Parking pauses a workspace: what is queued is parked, everything accepted
afterwards into any of its sessions is held with the park's reason, and unpark
releases each session in accept order."""

from __future__ import annotations

import asyncio

import pytest

from django_outbox import Status
from django_outbox.core.scripts import reason_argv
from django_outbox.errors import InvalidContent
from tests.support.helpers import BlockingDeliverer, aaccept, accept, wait_for

WS = "ws1"


async def test_the_case_a_prompt_sent_while_parked_waits_behind_the_parked_ones(make_outbox):
    agent = BlockingDeliverer()
    outbox = make_outbox(deliverer=agent, retry_backoff=0.05, verify_delay=0)
    try:
        for text in ("1", "2", "3"):
            await aaccept(outbox, text, ws=WS, ses="s3")
        step = asyncio.create_task(outbox.adeliver_once(WS, "s3"))  # prompt 1 in flight
        await asyncio.wait_for(agent.started.wait(), 5)
        await outbox.apark_workspace(WS, "maintenance")
        held = await aaccept(outbox, "4", ws=WS, ses="s3")
        entry = next(e for e in await outbox.alist(WS, "s3") if e.id == held.id)
        assert (entry.status, entry.reason) == (Status.PARKED, "maintenance")  # visible, why
        agent.release()
        assert await step  # prompt 1 finishes; its outcome is recorded as usual
        assert not await outbox.adeliver_once(WS, "s3")  # nothing moves while parked
        assert await outbox.aunpark_workspace(WS) == 3
        while await outbox.adeliver_once(WS, "s3"):
            pass
        assert agent.calls == ["1", "2", "3", "4"]  # not 1, 4, 2, 3
    finally:
        agent.release()
        await outbox.aclose()


def test_new_sessions_of_a_parked_workspace_are_held_too(outbox):
    accept(outbox, "a", ws=WS, ses="old")
    assert outbox.park_workspace(WS, "mode_transition") == 1
    new = accept(outbox, "b", ws=WS, ses="brand-new")
    (entry,) = outbox.list(WS, "brand-new")
    assert (entry.id, entry.status, entry.reason) == (new.id, Status.PARKED, "mode_transition")
    other = accept(outbox, "c", ws="another", ses="s1")  # other workspaces are not paused
    assert outbox.list("another", "s1")[0].status is Status.PENDING
    assert other.id
    assert outbox.unpark_workspace(WS) == 2
    assert {e.status for s in ("old", "brand-new") for e in outbox.list(WS, s)} == {Status.PENDING}
    accept(outbox, "d", ws=WS, ses="brand-new")  # the pause is over
    assert outbox.list(WS, "brand-new")[-1].status is Status.PENDING


def test_unpark_with_another_reason_keeps_the_pause(outbox):
    outbox.park_workspace(WS, "maintenance")
    accept(outbox, "a", ws=WS)
    assert outbox.unpark_workspace(WS, "other-reason") == 0
    accept(outbox, "b", ws=WS)
    assert [e.status for e in outbox.list(WS, "s1")] == [Status.PARKED, Status.PARKED]
    assert outbox.unpark_workspace(WS, "maintenance") == 2
    accept(outbox, "c", ws=WS)
    assert [e.status for e in outbox.list(WS, "s1")] == [Status.PENDING] * 3


def test_parking_again_replaces_the_reason_new_prompts_get(outbox):
    outbox.park_workspace(WS, "first")
    outbox.park_workspace(WS, "second")
    accept(outbox, "a", ws=WS)
    assert outbox.list(WS, "s1")[0].reason == "second"


def test_an_accept_during_an_unpark_waits_behind_its_sessions_held_prompts(outbox):
    """The interleaving the per-session release guards: session s2 is released (its
    held prompts unparked) while s1 is still held; an accept into s1 meanwhile is
    held behind s1's earlier prompts, one into s2 lines up behind s2's."""
    outbox.park_workspace(WS, "maintenance")
    accept(outbox, "s1-a", ws=WS, ses="s1")
    accept(outbox, "s2-a", ws=WS, ses="s2")
    # one session's unpark, as unpark_workspace takes them one by one
    outbox.run_script("unpark", WS, "s2", reason_argv("", 0))
    accept(outbox, "s1-b", ws=WS, ses="s1")
    accept(outbox, "s2-b", ws=WS, ses="s2")
    assert [(e.text, e.status) for e in outbox.list(WS, "s1")] == [
        ("s1-a", Status.PARKED),
        ("s1-b", Status.PARKED),
    ]
    assert [(e.text, e.status) for e in outbox.list(WS, "s2")] == [
        ("s2-a", Status.PENDING),
        ("s2-b", Status.PENDING),
    ]
    outbox.unpark_workspace(WS)
    assert [e.status for e in outbox.list(WS, "s1")] == [Status.PENDING] * 2


def test_cleanup_ends_the_pause(outbox, r):
    outbox.park_workspace(WS, "maintenance")
    accept(outbox, "a", ws=WS)
    outbox.cleanup_workspace(WS)
    assert not r.exists(outbox.keys.pause(WS))
    accept(outbox, "b", ws=WS)
    assert outbox.list(WS, "s1")[0].status is Status.PENDING


def test_parking_an_empty_workspace_holds_its_first_prompt(outbox):
    assert outbox.park_workspace(WS, "maintenance") == 0
    accept(outbox, "a", ws=WS)
    assert outbox.list(WS, "s1")[0].status is Status.PARKED
    assert outbox.unpark_workspace(WS) == 1


async def test_a_worker_leaves_a_paused_workspace_alone_and_resumes_after_unpark(make_outbox):
    delivered = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.text)

    outbox = make_outbox(deliverer=deliver)
    stop = asyncio.Event()
    worker = asyncio.create_task(outbox.arun(stop=stop, tick=0.05, heartbeat=False))
    try:
        await outbox.apark_workspace(WS, "maintenance")
        for text in ("1", "2"):
            await aaccept(outbox, text, ws=WS)
        await asyncio.sleep(0.3)
        assert delivered == []
        await outbox.aunpark_workspace(WS)
        await wait_for(lambda: delivered == ["1", "2"], 5)
    finally:
        stop.set()
        await worker
        await outbox.aclose()


@pytest.mark.parametrize("reason", ["maint\u202enuf", "maint\x00", "main\u200bt", "a\u2028b"])
def test_a_park_reason_with_control_or_format_characters_is_refused(outbox, reason):
    """Operators read the reason as stored: one that would read as something else (a
    right-to-left override, a NUL, a zero-width space, a line separator) parks nothing."""
    accept(outbox, "a", ws=WS, ses="s1")
    with pytest.raises(InvalidContent, match="control or format characters"):
        outbox.park_workspace(WS, reason)
    assert outbox.list(WS, "s1")[0].status is Status.PENDING
    assert outbox.park_workspace(WS, "Wartung für 🎉") == 1  # letters of any script are fine
    assert outbox.list(WS, "s1")[0].reason == "Wartung für 🎉"
