"""``Outbox.accept_on_commit``: a prompt enters the outbox if and only if the caller's
transaction commits, exactly once (docs/howto/transactions.md; django_outbox/transactional.py).

In-process, on the test database (SQLite) and a real Valkey: commits, rollbacks and
savepoints, the move and its idempotency, the refusals and their retry policy, the duty a
worker runs, what staff see in the admin and the metrics. The same scenarios across real
processes, on SQLite and PostgreSQL, with a process SIGKILLed between its commit and the
move, are in tests/django/test_on_commit_processes.py.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models.functions import Now
from django.utils import timezone

from django_outbox import Status, transactional
from django_outbox.errors import (
    ContentTooLarge,
    CutNotSupported,
    InvalidContent,
    InvalidIdentifier,
)
from django_outbox.metrics import WorkerMetrics
from django_outbox.models import PendingAccept
from django_outbox.outbox import get_outbox
from tests.support.admin import ALL_PERMS, login, staff
from tests.support.admin import texts as messages_of
from tests.support.helpers import QUICK_PASSWORD_HASHERS, SES, WS, accept, wait_for
from tests.support.valkey import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


PENDING = "/admin/django_outbox/pendingaccept/"


class Rollback(Exception):
    """Raised to roll a transaction (or a savepoint) back."""


def on_commit(outbox, key: str = "k1", text: str | None = None, **options):
    """``accept_on_commit`` with the suite's defaults; the text is ``"work on <key>"``."""
    text = f"work on {key}" if text is None else text
    return outbox.accept_on_commit(
        WS, SES, user_id="u", client_message_id=key, text=text, **options
    )


def texts(outbox) -> list[str]:
    return [entry.text for entry in outbox.list(WS, SES)]


def rows() -> list[tuple[str, str, int]]:
    """(key, state, attempts) of every pending accept, oldest first."""
    return list(
        PendingAccept.objects.order_by("pk").values_list("client_message_id", "state", "attempts")
    )


def the_row() -> PendingAccept:
    [row] = PendingAccept.objects.all()
    return row


def come_due() -> None:
    """Every waiting row's next try is now (as if its backoff had passed)."""
    PendingAccept.objects.update(next_attempt=Now())


def unreachable(make_outbox):
    """An outbox whose Valkey is not there: its moves are refused (OutboxUnavailable)."""
    return make_outbox(url=f"redis://127.0.0.1:{free_port()}/0")


def seconds_until_next_try(row: PendingAccept) -> float:
    return (row.next_attempt - timezone.now()).total_seconds()


def called_ago(seconds: float) -> None:
    """Every row's call was ``seconds`` ago on the database's clock, and its move is due
    now (as if its process had died, or Valkey had been down, since)."""
    PendingAccept.objects.update(created=Now() - timedelta(seconds=seconds), next_attempt=Now())


def step(outbox) -> list[str]:
    """One worker pass over the session (``adeliver_once``); returns the texts the agent
    was handed."""
    sent: list[str] = []

    async def deliver(entry, **kwargs):
        sent.append(entry.text)

    async def main():
        try:
            await outbox.adeliver_once(WS, SES, deliverer=deliver)
        finally:
            await outbox.aclose()

    asyncio.run(main())
    return sent


# --- if and only if the transaction commits ---------------------------------------------------


def test_the_prompt_enters_the_outbox_when_the_transaction_commits_and_not_before(outbox):
    with transaction.atomic():
        Group.objects.create(name="order 1")
        pending = on_commit(outbox, "k1", "work on order 1")
        assert texts(outbox) == [], "nothing is in the outbox before the commit"
        assert rows() == [("k1", "waiting", 0)]

    assert texts(outbox) == ["work on order 1"]
    assert rows() == [], "the row is deleted once moved"
    assert isinstance(pending, PendingAccept)
    assert transactional.move_due(outbox) == 0, "nothing is left for a worker"
    assert texts(outbox) == ["work on order 1"]


def test_a_rollback_takes_the_prompt_with_the_callers_own_rows(outbox):
    with pytest.raises(Rollback), transaction.atomic():
        Group.objects.create(name="order 1")
        on_commit(outbox, "k1", "work on order 1")
        raise Rollback

    assert Group.objects.count() == 0
    assert rows() == []
    assert transactional.move_due(outbox) == 0
    assert texts(outbox) == []


def test_a_rolled_back_savepoint_takes_its_prompt_and_the_commit_moves_the_others(outbox):
    with transaction.atomic():
        on_commit(outbox, "outer")
        with pytest.raises(Rollback), transaction.atomic():
            on_commit(outbox, "inner")
            raise Rollback
        on_commit(outbox, "after")

    assert texts(outbox) == ["work on outer", "work on after"]
    assert rows() == []
    assert transactional.move_due(outbox) == 0
    assert texts(outbox) == ["work on outer", "work on after"]


def test_a_released_savepoint_does_not_outlive_the_transaction_that_rolls_back(outbox):
    with pytest.raises(Rollback), transaction.atomic():
        with transaction.atomic():
            on_commit(outbox, "inner")
        raise Rollback

    assert rows() == []
    assert transactional.move_due(outbox) == 0
    assert texts(outbox) == []


def test_the_prompts_of_one_transaction_enter_in_the_order_they_were_accepted(outbox):
    with transaction.atomic():
        for n in range(5):
            on_commit(outbox, f"k{n}")

    assert texts(outbox) == [f"work on k{n}" for n in range(5)]


def test_outside_a_transaction_the_prompt_moves_at_once(outbox):
    on_commit(outbox, "k1")

    assert texts(outbox) == ["work on k1"]
    assert rows() == []


def test_plain_accept_stays_immediate_even_in_a_transaction_that_rolls_back(outbox):
    """A prompt accepted with ``accept`` inside a transaction that rolls back is still sent
    (``accept`` is immediate): what accept_on_commit is for."""
    with pytest.raises(Rollback), transaction.atomic():
        accept(outbox, "k1", "work on order 1")
        raise Rollback

    assert texts(outbox) == ["work on order 1"]


def test_any_text_and_model_round_trip_through_the_row(outbox):
    text = "NUL \x00, é, 🎉 and \u202e"
    model = {"providerID": "p", "modelID": "m \x00 ü", "options": {"n": [1, 2.5, None, True]}}
    with transaction.atomic():
        on_commit(outbox, "k1", text, model=model)

    [entry] = outbox.list(WS, SES)
    assert (entry.text, entry.model, entry.user_id) == (text, model, "u")


@pytest.mark.parametrize(
    "call, error",
    [
        ({"workspace_id": "no spaces"}, InvalidIdentifier),
        ({"session_id": "a:b"}, InvalidIdentifier),
        ({"text": ""}, InvalidContent),
        ({"text": "x" * 1_000_001}, ContentTooLarge),
        ({"model": "gpt"}, InvalidContent),
        ({"client_message_id": "\n"}, InvalidContent),
        ({"user_id": None}, InvalidContent),
        ({"ifBusy": "reject"}, TypeError),  # an option accept() does not take
        ({"if_busy": "interrupt"}, CutNotSupported),  # this outbox cannot cut a turn
        ({"if_busy": "sometimes"}, InvalidContent),  # accept's own rules for its options
        ({"expires_after": 0}, InvalidContent),
        ({"expires_after": "60"}, InvalidContent),
    ],
)
def test_bad_input_raises_inside_the_transaction_and_writes_nothing(outbox, call, error):
    arguments = {
        "workspace_id": WS,
        "session_id": SES,
        "user_id": "u",
        "client_message_id": "k1",
        "text": "hello",
        **call,
    }
    with transaction.atomic():
        Group.objects.create(name="order 1")
        with pytest.raises(error):
            outbox.accept_on_commit(**arguments)
        # The caller is still in its transaction, which goes on and commits.
        assert transaction.get_connection().in_atomic_block
        Group.objects.create(name="order 2")

    assert Group.objects.count() == 2
    assert rows() == []
    assert texts(outbox) == []


def test_a_model_outside_the_allow_list_raises_inside_the_transaction(make_outbox):
    """docs/reference/settings.md#models: refused at once, no row, nothing moves later."""
    from django_outbox.errors import ModelNotAllowed

    strict = make_outbox(models=("anthropic/*",))
    with transaction.atomic(), pytest.raises(ModelNotAllowed):
        strict.accept_on_commit(
            WS,
            SES,
            user_id="u",
            client_message_id="k1",
            text="hello",
            model={"providerID": "openai", "modelID": "gpt-5"},
        )
    assert rows() == [] and texts(strict) == []


# --- exactly one entry -------------------------------------------------------------------


def test_a_move_answered_duplicate_has_moved_already_and_deletes_its_row(outbox):
    first = accept(outbox, "k1", "work on k1")  # e.g. a move whose row could not be deleted
    with transaction.atomic():
        on_commit(outbox, "k1")

    assert [e.id for e in outbox.list(WS, SES)] == [first.id]
    assert rows() == []


def test_moving_one_row_twice_makes_one_entry(outbox, make_outbox):
    down = unreachable(make_outbox)
    with transaction.atomic():
        on_commit(down, "k1")  # its move finds no Valkey: the row stays
    [first_copy], [second_copy] = (
        list(PendingAccept.objects.all()),
        list(PendingAccept.objects.all()),
    )

    moved = transactional.move(outbox, first_copy, using="default")
    again = transactional.move(outbox, second_copy, using="default")

    assert moved.outcome is transactional.Moved.MOVED
    assert again == (transactional.Moved.ALREADY, moved.detail)
    assert [e.id for e in outbox.list(WS, SES)] == [moved.detail]
    assert rows() == []


def test_the_duty_moves_a_row_the_committing_process_could_not_move(outbox, make_outbox, caplog):
    down = unreachable(make_outbox)
    with caplog.at_level(logging.WARNING, "django_outbox"), transaction.atomic():
        on_commit(down, "k1")

    row = the_row()
    assert (row.state, row.attempts) == ("waiting", 1)
    assert row.last_error.startswith("OutboxUnavailable: ")
    assert "refused: OutboxUnavailable" in caplog.text
    assert transactional.move_due(outbox) == 0, "not before its backoff"

    come_due()
    assert transactional.move_due(outbox) == 1
    assert texts(outbox) == ["work on k1"]
    assert rows() == []


def test_a_running_worker_moves_what_was_left_behind_within_seconds(outbox, make_outbox):
    down = unreachable(make_outbox)
    with transaction.atomic():
        on_commit(down, "k1")
    come_due()
    delivered: list[str] = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.text)

    async def run():
        stop = asyncio.Event()
        worker = asyncio.create_task(outbox.arun(deliver, stop=stop, tick=0.05))
        try:
            await wait_for(lambda: delivered, 10, 0.02, "the left-behind prompt delivered")
        finally:
            stop.set()
            await worker
            await outbox.aclose()

    asyncio.run(run())

    assert delivered == ["work on k1"]
    assert rows() == []


async def test_a_failing_pass_pauses_the_duty_rather_than_failing_every_second(
    outbox, django_db_blocker
):
    duty = transactional.mover(outbox, interval=0.5)
    with django_db_blocker.block():  # the database refuses every connection
        with pytest.raises(RuntimeError, match="Database access not allowed"):
            await duty.run()
        await duty.run()  # paused for one interval: nothing tried, nothing to log
        await asyncio.sleep(0.6)
        with pytest.raises(RuntimeError):
            await duty.run()
        await asyncio.sleep(0.6)
        await duty.run()  # paused for two intervals now
    await asyncio.sleep(0.5)
    await duty.run()  # the database is back
    await outbox.aclose()


def test_every_django_outbox_runs_the_mover_duty(outbox):
    [duty] = [d for d in outbox.duties if d.name == "moving accepts on commit"]
    assert (duty.interval, duty.first_after, duty.burst) == (transactional.MOVE_INTERVAL, 0, True)
    assert transactional.MOVE_INTERVAL <= 1.0


# --- accept's options: what they mean to accept, from the call ------------------------------


def test_if_busy_reject_in_a_busy_session_is_refused_for_good_and_shown_as_refused(
    django_user_model, caplog
):
    """accept_on_commit keeps if_busy: ``SessionBusy`` is accept's answer to the caller's own
    ``if_busy="reject"``,
    not a condition to wait out: the row is failed at once, never moved by a worker when the
    session is idle later, and staff see the refusal."""
    outbox = get_outbox()
    blocker = accept(outbox, "first")  # pending: the session is busy
    with caplog.at_level(logging.ERROR, "django_outbox"), transaction.atomic():
        on_commit(outbox, "k1", if_busy="reject")

    row = the_row()
    assert (row.state, row.attempts) == ("failed", 1)
    assert row.last_error.startswith("SessionBusy: the session is busy")
    assert "refused for good" in caplog.text
    html = login(staff(django_user_model, "view_outboxentry")).get(PENDING).content.decode()
    assert "SessionBusy: the session is busy" in html

    outbox.dismiss(WS, SES, blocker.id)  # idle now; the caller's refusal stands
    come_due()
    assert transactional.move_due(outbox) == 0
    assert texts(outbox) == []
    assert rows() == [("k1", "failed", 1)]


def test_if_busy_reject_in_an_idle_session_moves(outbox):
    with transaction.atomic():
        on_commit(outbox, "k1", if_busy="reject")

    assert texts(outbox) == ["work on k1"]
    assert rows() == []


def test_an_expiry_runs_from_the_call_not_from_the_move(outbox, make_outbox):
    """The move gives accept what is left of ``expires_after`` (60 s, the call 20 s ago on
    the database's clock): the entry expires about 40 s after it is accepted."""
    with transaction.atomic():
        on_commit(unreachable(make_outbox), "k1", expires_after=60)
    called_ago(20)

    assert transactional.move_due(outbox) == 1

    [entry] = outbox.list(WS, SES)
    assert entry.expires_at is not None
    left = datetime.fromisoformat(entry.expires_at) - datetime.fromisoformat(entry.accepted_at)
    assert 39 <= left.total_seconds() <= 40


def test_a_prompt_whose_expiry_passed_before_its_move_is_never_sent_and_ends_expired(
    outbox, make_outbox
):
    """accept_on_commit keeps expires_after: ``expires_after=2``, moved 10 s after the call. As
    with accept, a prompt
    not handed to the agent in time is never sent and ends ``expired``, for a person."""
    with transaction.atomic():
        on_commit(unreachable(make_outbox), "k1", expires_after=2)
    called_ago(10)

    assert transactional.move_due(outbox) == 1

    assert step(outbox) == []
    assert [(e.text, e.status) for e in outbox.list(WS, SES)] == [("work on k1", Status.EXPIRED)]
    assert rows() == []


def test_an_interrupting_prompt_expired_before_its_move_cuts_nothing(make_outbox):
    """It will never be sent: the move stores it behind the queue, without the Send now
    that would cut the running turn, and it ends ``expired``."""

    async def abort(entry, **kwargs):
        return None

    outbox = make_outbox(aborter=abort)
    accept(outbox, "k0", "queued first")
    down = make_outbox(url=f"redis://127.0.0.1:{free_port()}/0", aborter=abort)
    with transaction.atomic():
        on_commit(down, "k1", "now", if_busy="interrupt", expires_after=5)
    called_ago(30)

    assert transactional.move_due(outbox) == 1

    assert texts(outbox) == ["queued first", "now"], "not moved ahead: nothing was cut"
    assert step(outbox) == ["queued first"]
    assert step(outbox) == []
    assert [(e.text, e.status) for e in outbox.list(WS, SES)] == [("now", Status.EXPIRED)]


# --- refused moves: visible, retried, given up -------------------------------------------------


def test_a_refused_move_is_kept_with_its_reason_logged_and_retried_with_a_backoff(
    make_outbox, caplog
):
    outbox = make_outbox(cap=1)
    blocker = accept(outbox, "first")
    with caplog.at_level(logging.WARNING, "django_outbox"), transaction.atomic():
        on_commit(outbox, "k1")

    row = the_row()
    assert (row.state, row.attempts) == ("waiting", 1)
    assert row.last_error == "OutboxFull: session outbox is full (1 entries)"
    assert 0 < seconds_until_next_try(row) <= transactional.RETRY_BACKOFF
    assert "outbox: moving the accept on commit" in caplog.text
    assert "session outbox is full" in caplog.text

    assert transactional.move_due(outbox) == 0, "not before its next try"
    come_due()
    assert transactional.move_due(outbox) == 0, "still full"
    row = the_row()
    assert row.attempts == 2
    assert (
        transactional.RETRY_BACKOFF
        < seconds_until_next_try(row)
        <= 2 * (transactional.RETRY_BACKOFF)
    ), "the backoff doubles"

    outbox.dismiss(WS, SES, blocker.id)
    come_due()
    assert transactional.move_due(outbox) == 1
    assert texts(outbox) == ["work on k1"]
    assert rows() == []


def test_the_backoff_stops_growing_at_its_bound(make_outbox):
    outbox = make_outbox(cap=1)
    accept(outbox, "first")
    with transaction.atomic():
        on_commit(outbox, "k1")
    PendingAccept.objects.update(attempts=40, next_attempt=Now())

    transactional.move_due(outbox)

    wait = seconds_until_next_try(the_row())
    assert transactional.MAX_RETRY_BACKOFF - 1 < wait <= transactional.MAX_RETRY_BACKOFF


def test_a_rate_limited_move_waits_at_least_until_the_limit_allows(make_outbox):
    outbox = make_outbox(user_accepts_per_minute=1)
    accept(outbox, "first")
    with transaction.atomic():
        on_commit(outbox, "k1")

    row = the_row()
    assert row.last_error.startswith("RateLimited: ")
    assert seconds_until_next_try(row) > 50


def test_a_key_holding_another_prompt_fails_at_once_and_is_never_moved(outbox, caplog):
    other = accept(outbox, "k1", "another prompt")
    with caplog.at_level(logging.ERROR, "django_outbox"), transaction.atomic():
        on_commit(outbox, "k1", "work on k1")

    row = the_row()
    assert (row.state, row.attempts) == ("failed", 1)
    assert row.last_error.startswith("IdempotencyConflict: ")
    assert other.id in row.last_error
    assert "refused for good" in caplog.text
    come_due()
    assert transactional.move_due(outbox) == 0
    assert [e.id for e in outbox.list(WS, SES)] == [other.id]


def test_a_prompt_that_todays_rules_refuse_fails_at_once(make_outbox):
    lenient, strict = make_outbox(), make_outbox(max_text_bytes=10)
    down = unreachable(make_outbox)
    with transaction.atomic():
        on_commit(down, "k1", "x" * 20)  # accepted while 20 bytes were allowed
    come_due()

    assert transactional.move_due(strict) == 0

    row = the_row()
    assert row.state == "failed"
    assert row.last_error.startswith("ContentTooLarge: ")
    assert texts(lenient) == []


def test_a_row_not_moved_within_dedupe_ttl_is_given_up_and_never_moved(make_outbox, caplog):
    outbox = make_outbox(dedupe_ttl=60)
    down = unreachable(make_outbox)
    with transaction.atomic():
        on_commit(down, "k1")
    PendingAccept.objects.update(created=Now() - timedelta(seconds=61), next_attempt=Now())

    with caplog.at_level(logging.ERROR, "django_outbox"):
        assert transactional.move_due(outbox) == 0

    row = the_row()
    assert (row.state, row.attempts) == ("failed", 1)
    assert row.last_error.startswith("not moved within DEDUPE_TTL")
    assert "last refusal: OutboxUnavailable" in row.last_error
    assert "gave up the accept on commit" in caplog.text
    assert texts(outbox) == []


def test_a_row_just_inside_dedupe_ttl_is_still_moved(make_outbox):
    outbox = make_outbox(dedupe_ttl=60)
    down = unreachable(make_outbox)
    with transaction.atomic():
        on_commit(down, "k1")
    PendingAccept.objects.update(created=Now() - timedelta(seconds=55), next_attempt=Now())

    assert transactional.move_due(outbox) == 1
    assert texts(outbox) == ["work on k1"]


def test_the_metrics_count_the_rows_by_state(outbox, make_outbox):
    down = unreachable(make_outbox)
    accept(outbox, "k2", "another prompt")
    with transaction.atomic():
        on_commit(down, "k1")  # waiting
        on_commit(outbox, "k2")  # failed: the key holds another prompt

    metrics = WorkerMetrics(outbox)
    sample = metrics.registry.get_sample_value
    assert sample("outbox_pending_accepts", {"state": "waiting"}) == 1
    assert sample("outbox_pending_accepts", {"state": "failed"}) == 1


# --- staff: the admin's Pending accepts ------------------------------------------------------


@pytest.fixture
def refused(settings):
    """One waiting row (its session is full: ``CAP`` 1) and one failed row (its key holds
    another prompt), accepted on commit through the process-wide outbox the admin uses;
    returns the prompt that fills the session."""
    settings.OUTBOX = {"CAP": 1}
    outbox = get_outbox()
    blocker = accept(outbox, "first", ses="full")
    accept(outbox, "taken", "another prompt")
    with transaction.atomic():
        outbox.accept_on_commit(WS, "full", user_id="u", client_message_id="k1", text="<b>k1</b>")
        on_commit(outbox, "taken")
    assert rows() == [("k1", "waiting", 1), ("taken", "failed", 1)]
    return blocker


def test_staff_see_each_refused_move_with_its_reason(django_user_model, refused):
    page = login(staff(django_user_model, "view_outboxentry")).get(PENDING)

    assert page.status_code == 200
    html = page.content.decode()
    assert "session outbox is full" in html
    assert "IdempotencyConflict: clientMessageID was already used" in html
    assert "&lt;b&gt;k1&lt;/b&gt;" in html and "<b>k1</b>" not in html, "text escaped"
    assert "Move selected accepts into the outbox now" not in html, "no retry permission"
    assert "Delete selected" not in html, "no dismiss permission"


def test_staff_without_view_permission_see_nothing(django_user_model, refused):
    assert login(staff(django_user_model)).get(PENDING).status_code == 403


def test_moving_now_moves_waiting_and_failed_rows_and_logs_it(django_user_model, refused):
    operator = staff(django_user_model, *ALL_PERMS)
    client = login(operator)
    get_outbox().dismiss(WS, "full", refused.id)  # room for the waiting one
    ids = list(PendingAccept.objects.order_by("pk").values_list("pk", flat=True))

    response = client.post(PENDING, {"action": "move_now", "_selected_action": ids}, follow=True)

    assert response.status_code == 200
    said = messages_of(response)
    assert said[0] == "1 accept moved into the outbox."
    assert said[1].startswith("1 refused, and kept with the refusal: 'taken': IdempotencyConflict")
    assert [e.text for e in get_outbox().list(WS, "full")] == ["<b>k1</b>"]
    assert rows() == [("taken", "failed", 2)]
    [log] = LogEntry.objects.all()
    assert log.user == operator
    assert log.change_message.startswith("Moved into the outbox as entry ")


def test_a_failed_row_moves_when_staff_move_it(django_user_model, make_outbox):
    down = unreachable(make_outbox)
    with transaction.atomic():
        on_commit(down, "k1")
    PendingAccept.objects.update(state=PendingAccept.State.FAILED)
    client = login(staff(django_user_model, "view_outboxentry", "retry_outboxentry"))

    client.post(PENDING, {"action": "move_now", "_selected_action": [the_row().pk]})

    assert texts(get_outbox()) == ["work on k1"]
    assert rows() == []


def test_deleting_a_row_needs_the_dismiss_permission(django_user_model, refused):
    ids = list(PendingAccept.objects.values_list("pk", flat=True))
    viewer = login(staff(django_user_model, "view_outboxentry", "retry_outboxentry"))
    dismisser = login(staff(django_user_model, "view_outboxentry", "dismiss_outboxentry"))
    data = {"action": "delete_selected", "_selected_action": ids, "post": "yes"}

    viewer.post(PENDING, data)
    assert len(rows()) == 2
    dismisser.post(PENDING, data)
    assert rows() == []


def test_an_interrupting_accept_on_commit_goes_next_after_the_commit(make_outbox):
    """docs/howto/cutting.md: the move runs accept with ifBusy interrupt."""

    async def abort(entry, **kwargs):
        return None

    outbox = make_outbox(aborter=abort)
    first = accept(outbox, "k0", "queued first")
    with transaction.atomic():
        outbox.accept_on_commit(
            WS, SES, user_id="u", client_message_id="k1", text="now", if_busy="interrupt"
        )
        assert [e.id for e in outbox.list(WS, SES)] == [first.id]
    listed = outbox.list(WS, SES)
    assert [(e.text, e.mode) for e in listed] == [("now", "interrupt"), ("queued first", "queue")]


def test_a_move_whose_row_cannot_be_deleted_leaves_the_callers_commit_alone(outbox, caplog):
    """The move runs as a robust ``on_commit`` callback: when the database refuses to delete
    the moved row (here a trigger), the caller's committed transaction raises nothing, the
    prompt is in the outbox once, the failure is logged, and the row left behind is settled
    by a later move as already moved (docs/howto/transactions.md)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TRIGGER outbox_test_keep_rows BEFORE DELETE ON django_outbox_pendingaccept "
            "BEGIN SELECT RAISE(ABORT, 'injected: the row cannot be deleted'); END"
        )
    try:
        with caplog.at_level(logging.ERROR, "django.db.backends.base"), transaction.atomic():
            Group.objects.create(name="order 1")
            on_commit(outbox, "k1")
        assert Group.objects.count() == 1  # the caller's own rows are committed
        assert texts(outbox) == ["work on k1"]
        assert rows() == [("k1", "waiting", 0)]
        assert "injected: the row cannot be deleted" in caplog.text
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER outbox_test_keep_rows")
    come_due()
    transactional.move_due(outbox)
    assert rows() == []
    assert texts(outbox) == ["work on k1"]
