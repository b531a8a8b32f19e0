"""The admin's queue-control actions: *Cancel selected queued prompts* and *Stop: cut the
turn of selected prompts in flight* (docs/howto/steering.md#cancel, docs/howto/cutting.md),
each gated by its access-table permission and saying what happened."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import override_settings

from django_outbox.core.entry import Status
from django_outbox.signals import entry_updated
from tests.support.admin import (
    ALL_PERMS,
    CHANGELIST,
    accept,
    detail_url,
    hold_lease,
    login,
    post_action,
    staff,
    texts,
)
from tests.support.helpers import QUICK_PASSWORD_HASHERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


ABORTER = {"ABORTER": "tests.support.agents.abort"}


@pytest.fixture
def operator(django_user_model):
    return login(staff(django_user_model, *ALL_PERMS, "add_outboxentry"))


def test_cancel_removes_a_queued_prompt_and_leaves_the_one_in_flight(operator, outbox):
    running = accept(outbox, "ws", "ses", "running")
    queued = accept(outbox, "ws", "ses", "queued")
    hold_lease(outbox, "ws", "ses")
    refs = [f"ws/ses/{running.id}", f"ws/ses/{queued.id}", "ws/ses/missing1"]
    response = post_action(operator, "cancel_entries", refs)
    assert texts(response) == [
        f"Cancelled 1 entry, never sent: ws/ses/{queued.id}.",
        f"In flight, not cancelled (1): ws/ses/{running.id} — being delivered or verified; "
        "Stop cuts its turn.",
        "Not found (1): ws/ses/missing1 — delivered, dismissed or cleaned up meanwhile.",
    ]
    assert [(e.id, e.status) for e in outbox.list("ws", "ses")] == [(running.id, Status.DELIVERING)]
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag) == (f"ws/ses/{queued.id}", DELETION)


@override_settings(OUTBOX=ABORTER)
def test_stop_cuts_the_turn_in_flight_and_says_what_it_did_with_each(operator, outbox):
    running = accept(outbox, "ws", "ses", "running")
    queued = accept(outbox, "ws", "ses", "queued")
    hold_lease(outbox, "ws", "ses")
    refs = [f"ws/ses/{running.id}", f"ws/ses/{queued.id}"]
    response = post_action(operator, "cut_entries", refs)
    assert texts(response) == [
        f"Cutting the turn of 1 entry: ws/ses/{running.id} — each ends sent (interrupted) "
        "or cancelled, as the verifier finds.",
        f"Waiting in the queue, never sent, nothing to cut (1): ws/ses/{queued.id} — "
        "cancel it instead.",
    ]
    listed = outbox.list("ws", "ses")
    assert [(e.id, e.interrupted) for e in listed] == [(running.id, True), (queued.id, False)]
    log = LogEntry.objects.get()
    assert (log.object_id, log.action_flag) == (f"ws/ses/{running.id}", CHANGE)
    again = post_action(operator, "cut_entries", refs[:1])
    assert texts(again) == [f"Already being cut (1): ws/ses/{running.id}."]
    assert LogEntry.objects.count() == 1


@override_settings(OUTBOX=ABORTER)
def test_stop_of_a_prompt_whose_turn_ended_never_cuts_the_next_one(operator, outbox):
    """A stale Stop in the admin: the list showed "running" in flight and staff select it for
    Stop; meanwhile it was delivered and the worker runs "next". The Stop names the
    selected entry, so it cuts nothing (not found: delivered) and "next" runs on."""
    running = accept(outbox, "ws", "ses", "running")
    following = accept(outbox, "ws", "ses", "next")

    async def deliver_running():
        try:
            assert await outbox.adeliver_once("ws", "ses", deliverer=lambda entry, **kw: None)
        finally:
            await outbox.aclose()

    asyncio.run(deliver_running())
    assert hold_lease(outbox, "ws", "ses").id == following.id
    (message,) = texts(post_action(operator, "cut_entries", [f"ws/ses/{running.id}"]))
    assert message.startswith(f"Not found (1): ws/ses/{running.id} — delivered")
    assert [(e.id, e.interrupted) for e in outbox.list("ws", "ses")] == [(following.id, False)]
    assert not LogEntry.objects.exists()


def test_stop_without_an_aborter_cuts_nothing_and_says_why(operator, outbox):
    running = accept(outbox, "ws", "ses", "running")
    hold_lease(outbox, "ws", "ses")
    (message,) = texts(post_action(operator, "cut_entries", [f"ws/ses/{running.id}"]))
    assert message.startswith(f"Not cut (1): ws/ses/{running.id} — no aborter is configured")
    assert not outbox.list("ws", "ses")[0].interrupted
    assert not LogEntry.objects.exists()


@override_settings(OUTBOX=ABORTER)
def test_each_action_needs_its_permission(django_user_model, outbox):
    running = accept(outbox, "ws", "ses", "running")
    queued = accept(outbox, "ws", "ses", "queued")
    hold_lease(outbox, "ws", "ses")
    # cancel is dismiss_outboxentry, Stop is add_outboxentry (who may send may stop).
    viewer = login(staff(django_user_model, "view_outboxentry", "retry_outboxentry"))
    page = viewer.get(CHANGELIST).content.decode()
    assert "cancel_entries" not in page and "cut_entries" not in page
    for action, ref in (("cancel_entries", queued.id), ("cut_entries", running.id)):
        response = viewer.post(CHANGELIST, {"action": action, "_selected_action": [ref]})
        assert response.status_code == 403
    listed = outbox.list("ws", "ses")
    assert [(e.id, e.interrupted) for e in listed] == [(running.id, False), (queued.id, False)]
    operator = login(
        staff(django_user_model, "view_outboxentry", "dismiss_outboxentry", "add_outboxentry")
    )
    page = operator.get(CHANGELIST).content.decode()
    assert "cancel_entries" in page and "cut_entries" in page


@override_settings(OUTBOX=ABORTER)
def test_cancel_and_stop_record_the_staff_user_and_the_entry_page_shows_who_changed_it(
    django_user_model, outbox
):
    user = staff(django_user_model, *ALL_PERMS, "add_outboxentry")
    client = login(user)
    running = accept(outbox, "ws", "ses", "running")
    queued = accept(outbox, "ws", "ses", "queued")
    hold_lease(outbox, "ws", "ses")
    outbox.edit("ws", "ses", queued.id, text="queued, better", actor="user:7")
    cancelled = []

    def receiver(entry, state, **kwargs):
        cancelled.append((state, entry.id, entry.cancelled_by))

    post_action(client, "cut_entries", [f"ws/ses/{running.id}"])
    entry_updated.connect(receiver)
    try:
        post_action(client, "cancel_entries", [f"ws/ses/{queued.id}"])
    finally:
        entry_updated.disconnect(receiver)
    assert cancelled == [("cancelled", queued.id, f"staff:{user.pk}")]
    [cut] = outbox.list("ws", "ses")
    assert cut.stopped_by == f"staff:{user.pk}"
    page = client.get(detail_url(f"ws/ses/{running.id}")).content.decode()
    assert f"stopped by <bdi>staff:{user.pk} ({user.get_username()})</bdi>" in page
    edited = accept(outbox, "ws", "ses2", "other")
    outbox.edit("ws", "ses2", edited.id, text="other, better", actor="user:999999")
    page = client.get(detail_url(f"ws/ses2/{edited.id}")).content.decode()
    assert "edited by <bdi>user:999999</bdi>" in page  # no such user: the actor as stored
