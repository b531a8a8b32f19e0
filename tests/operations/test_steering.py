"""Steering the queue: accept options (expiry, what to do while busy), edit, move, cancel.

docs/howto/steering.md.
"""

import asyncio

import pytest

from django_outbox import CancelResult, EditResult, MoveResult, RetryResult, Status
from django_outbox.errors import Duplicate, IdempotencyConflict, InvalidContent, SessionBusy
from tests.support.helpers import BlockingDeliverer, accept

WS, SES = "w1", "s1"
T0 = 1_900_000_000.0  # seconds since the epoch, for an injected clock


def step(outbox, deliverer=None):
    """One adeliver_once from sync code, closing the loop's client before the loop ends."""

    async def main():
        try:
            return await outbox.adeliver_once(WS, SES, deliverer=deliverer)
        finally:
            await outbox.aclose()

    return asyncio.run(main())


class Sent:
    """A deliverer that records the texts it was handed."""

    def __init__(self):
        self.texts = []

    async def __call__(self, entry, **kwargs):
        self.texts.append(entry.text)


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


# --- expiry -------------------------------------------------------------------------


def test_expires_at_is_stamped_on_the_server_clock(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    entry = accept(outbox, expires_after=90)
    assert entry.accepted_at == "2030-03-17T17:46:40.000000Z"
    assert entry.expires_at == "2030-03-17T17:48:10.000000Z"
    assert outbox.list(WS, SES)[0].expires_at == entry.expires_at
    assert accept(outbox, "k2").expires_at is None


def test_a_prompt_claimed_at_its_expiry_is_never_sent(make_outbox, signals_log):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    first = accept(outbox, "a", expires_after=1)
    accept(outbox, "b")
    sent = Sent()
    clock.now = T0 + 1  # the very microsecond it expires
    assert step(outbox, sent)
    assert sent.texts == ["b"]
    [left] = outbox.list(WS, SES)
    assert (left.id, left.status) == (first.id, Status.EXPIRED)
    assert [e.id for e, kw in signals_log.calls["updated"] if kw["state"] == "expired"] == [
        first.id
    ]
    # Never sent afterwards either: expired entries wait for a person.
    clock.now = T0 + 60
    step(outbox, sent)
    assert sent.texts == ["b"]


def test_a_prompt_claimed_just_before_its_expiry_is_sent(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    accept(outbox, "a", expires_after=1)
    sent = Sent()
    clock.now = T0 + 0.999999
    step(outbox, sent)
    assert sent.texts == ["a"] and outbox.list(WS, SES) == []


def test_an_expired_prompt_is_retried_without_its_expiry_or_dismissed(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    entry = accept(outbox, "a", expires_after=1)
    clock.now = T0 + 2
    step(outbox, Sent())
    assert outbox.list(WS, SES)[0].status is Status.EXPIRED
    assert outbox.retry(WS, SES, entry.id) is RetryResult.UPDATED
    again = outbox.list(WS, SES)[0]
    assert (again.status, again.expires_at) == (Status.PENDING, None)
    sent = Sent()
    step(outbox, sent)
    assert sent.texts == ["a"]


def test_an_expiry_shorter_than_a_microsecond_still_expires_one_microsecond_later(make_outbox):
    """Stored in microseconds: a positive expiresAfter below one rounds up to one
    microsecond, never down to 0, which would mean "never expires"."""
    clock = Clock()
    outbox = make_outbox(clock=clock)
    entry = accept(outbox, expires_after=1e-7)
    assert entry.expires_at == "2030-03-17T17:46:40.000001Z"
    clock.now = T0 + 1
    sent = Sent()
    step(outbox, sent)
    assert sent.texts == [] and outbox.list(WS, SES)[0].status is Status.EXPIRED


@pytest.mark.parametrize("bad", [0, -1, True, "10", float("nan"), 31 * 24 * 3600])
def test_expires_after_must_be_a_positive_number_of_seconds(outbox, bad):
    with pytest.raises(InvalidContent, match="expiresAfter"):
        accept(outbox, expires_after=bad)
    assert outbox.list(WS, SES) == []


# --- if_busy ------------------------------------------------------------------------


def test_reject_while_busy_stores_nothing_and_leaves_no_marker(outbox):
    accept(outbox, "first")
    with pytest.raises(SessionBusy):
        accept(outbox, "k2", "second", if_busy="reject")
    assert [e.text for e in outbox.list(WS, SES)] == ["first"]
    # No marker: once the session is idle the same key is accepted.
    step(outbox, Sent())
    entry = accept(outbox, "k2", "second", if_busy="reject")
    assert entry.mode == "reject"
    assert [e.mode for e in outbox.list(WS, SES)] == ["reject"]


def test_reject_sees_a_delivery_in_flight(outbox):
    accept(outbox, "first")
    blocking = BlockingDeliverer()

    async def main():
        try:
            task = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=blocking))
            await blocking.started.wait()
            with pytest.raises(SessionBusy):
                await outbox.aaccept(
                    WS, SES, user_id="u", client_message_id="k2", text="x", if_busy="reject"
                )
            blocking.release()
            await task
        finally:
            await outbox.aclose()

    asyncio.run(main())
    assert outbox.list(WS, SES) == []


def test_reject_ignores_entries_waiting_for_a_person(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    accept(outbox, "old", expires_after=1)
    clock.now = T0 + 5
    step(outbox, Sent())  # expires it
    assert accept(outbox, "k2", if_busy="reject").mode == "reject"


def test_reject_sees_a_prompt_whose_outcome_is_being_verified(make_outbox):
    """A prompt being verified may be with the agent (its turn may still run): the session
    is busy for ``ifBusy: reject`` although nothing is pending and no lease is held."""
    from django_outbox import Verdict
    from django_outbox.errors import AmbiguousError

    async def verify(entry, **kwargs):
        return Verdict.INCONCLUSIVE

    async def cut(entry, **kwargs):
        raise AmbiguousError("connection cut")

    outbox = make_outbox(verifier=verify, verify_delay=60)
    accept(outbox, "a")
    step(outbox, cut)
    assert [str(e.status) for e in outbox.list(WS, SES)] == ["verifying"]
    with pytest.raises(SessionBusy):
        accept(outbox, "k2", "second", if_busy="reject")
    assert [e.text for e in outbox.list(WS, SES)] == ["a"]


def test_a_resend_of_a_rejected_mode_prompt_is_still_a_duplicate(outbox):
    entry = accept(outbox, "k1", if_busy="reject")
    with pytest.raises(Duplicate) as caught:
        accept(outbox, "k1", if_busy="reject")
    assert caught.value.accepted_id == entry.id


@pytest.mark.parametrize("bad", ["later", "", None, 1, "interrupt-now"])
def test_if_busy_names_a_known_choice(outbox, bad):
    with pytest.raises(InvalidContent, match="ifBusy"):
        accept(outbox, if_busy=bad)


# --- edit ---------------------------------------------------------------------------


def test_edit_replaces_text_and_model_in_place(outbox, signals_log):
    first = accept(outbox, "a", model={"big": 12345678901234567, "empty": []})
    accept(outbox, "b")
    version = outbox.snapshot(WS, SES).version
    result = outbox.edit(WS, SES, first.id, text="a, edited", if_version=version)
    assert result is EditResult.UPDATED
    edited = outbox.list(WS, SES)[0]
    assert (edited.id, edited.text, edited.seq, edited.client_message_id) == (
        first.id,
        "a, edited",
        first.seq,
        "a",
    )
    assert edited.model == {"big": 12345678901234567, "empty": []}  # kept byte for byte
    assert outbox.edit(WS, SES, first.id, model={"id": "m2"}) is EditResult.UPDATED
    assert outbox.list(WS, SES)[0].model == {"id": "m2"}
    assert outbox.snapshot(WS, SES).version == version + 2
    assert [kw["state"] for _, kw in signals_log.calls["updated"][-2:]] == ["edited", "edited"]
    sent = Sent()
    step(outbox, sent)
    assert sent.texts == ["a, edited"]


def test_an_edit_of_text_and_model_together_of_a_prompt_in_any_script(outbox, signals_log):
    """Both given: both replaced in one edit. The compare-and-set reads the stored entry as
    UTF-8, so a prompt with non-ASCII text is edited like any other (never BUSY)."""
    entry = accept(outbox, "a", "caf\u00e9 \u2615 \u65e5\u672c", model={"id": "m1"})
    result = outbox.edit(WS, SES, entry.id, text="th\u00e9 \U0001f375", model={"id": "m2"})
    assert result is EditResult.UPDATED
    [edited] = outbox.list(WS, SES)
    assert (edited.text, edited.model) == ("th\u00e9 \U0001f375", {"id": "m2"})
    assert outbox.edit(WS, SES, entry.id, model={"id": "m3"}) is EditResult.UPDATED
    [edited] = outbox.list(WS, SES)
    assert (edited.text, edited.model) == ("th\u00e9 \U0001f375", {"id": "m3"})
    told = [e for e, kw in signals_log.calls["updated"] if kw["state"] == "edited"]
    assert [(e.text, e.model) for e in told] == [
        ("th\u00e9 \U0001f375", {"id": "m2"}),
        ("th\u00e9 \U0001f375", {"id": "m3"}),
    ]


def test_a_resend_of_the_original_after_an_edit_is_a_duplicate(outbox):
    entry = accept(outbox, "k1", "original")
    assert outbox.edit(WS, SES, entry.id, text="changed") is EditResult.UPDATED
    with pytest.raises(Duplicate) as caught:
        accept(outbox, "k1", "original")
    assert caught.value.accepted_id == entry.id
    with pytest.raises(IdempotencyConflict):  # the key is bound to what was first sent
        accept(outbox, "k1", "changed")
    assert [e.text for e in outbox.list(WS, SES)] == ["changed"]


def test_edit_with_a_stale_version_changes_nothing(outbox):
    entry = accept(outbox, "a")
    stale = outbox.snapshot(WS, SES).version
    accept(outbox, "b")
    assert outbox.edit(WS, SES, entry.id, text="x", if_version=stale) is (
        EditResult.VERSION_MISMATCH
    )
    # A version the session has not reached yet is no match either (If-Match is equality).
    ahead = outbox.snapshot(WS, SES).version + 1
    assert outbox.edit(WS, SES, entry.id, text="x", if_version=ahead) is (
        EditResult.VERSION_MISMATCH
    )
    assert outbox.list(WS, SES)[0].text == "a"


def test_an_edit_naming_version_0_is_a_version_mismatch_not_invalid_input(outbox):
    """``if_version`` is any session version, an integer >= 0 (docs/howto/steering.md#edit):
    0, the smallest, is one the session is not at, so the edit is refused as stale
    (VERSION_MISMATCH, 412 over REST), not as malformed input."""
    entry = accept(outbox, "a")
    assert outbox.edit(WS, SES, entry.id, text="x", if_version=0) is EditResult.VERSION_MISMATCH
    assert outbox.list(WS, SES)[0].text == "a"


def test_edit_of_a_prompt_being_delivered_or_verified_is_busy(outbox):
    entry = accept(outbox, "a")
    blocking = BlockingDeliverer()

    async def main():
        try:
            task = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=blocking))
            await blocking.started.wait()
            assert await outbox.aedit(WS, SES, entry.id, text="x") is EditResult.BUSY
            assert await outbox.amove(WS, SES, entry.id, to="last") is MoveResult.BUSY
            assert await outbox.acancel(WS, SES, entry.id) is CancelResult.IN_FLIGHT
            blocking.release()
            await task
        finally:
            await outbox.aclose()

    asyncio.run(main())
    assert blocking.calls == ["a"] and outbox.list(WS, SES) == []


def test_edit_and_cancel_of_an_entry_being_verified_are_refused(make_outbox):
    from django_outbox import Verdict
    from django_outbox.errors import AmbiguousError

    async def verify(entry, **kwargs):
        return Verdict.INCONCLUSIVE

    outbox = make_outbox(verifier=verify, verify_delay=60)
    entry = accept(outbox, "a")

    async def cut(e, **kwargs):
        raise AmbiguousError("cut")

    step(outbox, cut)
    assert outbox.list(WS, SES)[0].status is Status.VERIFYING
    assert outbox.edit(WS, SES, entry.id, text="x") is EditResult.BUSY
    assert outbox.cancel(WS, SES, entry.id) is CancelResult.IN_FLIGHT
    assert outbox.move(WS, SES, entry.id, to="last") is MoveResult.BUSY
    b = accept(outbox, "b")
    assert outbox.move(WS, SES, b.id, to="next") is MoveResult.MOVED
    assert outbox.move(WS, SES, b.id, before=entry.id) is MoveResult.BUSY
    assert queued(outbox) == ["a", "b"]


def test_edit_of_an_expired_prompt_then_retry_sends_the_new_text(make_outbox):
    clock = Clock()
    outbox = make_outbox(clock=clock)
    entry = accept(outbox, "a", expires_after=1)
    clock.now = T0 + 2
    step(outbox, Sent())
    assert outbox.edit(WS, SES, entry.id, text="fresh") is EditResult.UPDATED
    assert outbox.list(WS, SES)[0].status is Status.EXPIRED
    outbox.retry(WS, SES, entry.id)
    sent = Sent()
    step(outbox, sent)
    assert sent.texts == ["fresh"]


def test_edit_refuses_bad_input_and_missing_entries(outbox):
    entry = accept(outbox, "a")
    with pytest.raises(InvalidContent, match="nothing to edit"):
        outbox.edit(WS, SES, entry.id)
    with pytest.raises(InvalidContent):
        outbox.edit(WS, SES, entry.id, text="")
    with pytest.raises(InvalidContent):
        outbox.edit(WS, SES, entry.id, text="x", if_version="7")
    assert outbox.edit(WS, SES, "nope", text="x") is EditResult.NOT_FOUND
    assert outbox.list(WS, SES)[0].text == "a"


# --- move ---------------------------------------------------------------------------


def queued(outbox):
    return [e.text for e in outbox.list(WS, SES)]


def test_move_reorders_queued_prompts(outbox, signals_log):
    _a, b, c = (accept(outbox, k) for k in "abc")
    assert outbox.move(WS, SES, c.id, to="next") is MoveResult.MOVED
    assert queued(outbox) == ["c", "a", "b"]
    assert signals_log.calls["updated"][-1][1]["state"] == "moved"
    assert outbox.move(WS, SES, c.id, to="last") is MoveResult.MOVED
    assert queued(outbox) == ["a", "b", "c"]
    assert outbox.move(WS, SES, c.id, before=b.id) is MoveResult.MOVED
    assert queued(outbox) == ["a", "c", "b"]
    version = outbox.snapshot(WS, SES).version
    assert outbox.move(WS, SES, c.id, before=b.id) is MoveResult.MOVED  # already there
    assert outbox.snapshot(WS, SES).version == version
    sent = Sent()
    for _ in range(3):
        step(outbox, sent)
    assert sent.texts == ["a", "c", "b"]


def test_nothing_moves_ahead_of_the_prompt_in_flight(outbox):
    a, b, c = (accept(outbox, k) for k in "abc")
    blocking = BlockingDeliverer()

    async def main():
        try:
            task = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=blocking))
            await blocking.started.wait()
            assert await outbox.amove(WS, SES, c.id, to="next") is MoveResult.MOVED
            assert await outbox.amove(WS, SES, b.id, before=a.id) is MoveResult.BUSY
            blocking.release()
            await task
        finally:
            await outbox.aclose()

    asyncio.run(main())
    assert queued(outbox) == ["c", "b"]


def test_move_refuses_bad_input(outbox):
    a, b = accept(outbox, "a"), accept(outbox, "b")
    bad = ({}, {"to": "first"}, {"to": "next", "before": a.id}, {"before": b.id})
    for kwargs in (*bad, {"to": "NEXT"}, {"to": "Last"}, {"to": " next"}, {"to": ""}):
        with pytest.raises(InvalidContent):
            outbox.move(WS, SES, b.id, **kwargs)
    assert outbox.move(WS, SES, b.id, before="gone") is MoveResult.NOT_FOUND
    assert outbox.move(WS, SES, "gone", to="next") is MoveResult.NOT_FOUND
    assert queued(outbox) == ["a", "b"]


# --- cancel -------------------------------------------------------------------------


def test_cancel_removes_a_queued_prompt(outbox, signals_log):
    accept(outbox, "a")
    b = accept(outbox, "b")
    assert outbox.cancel(WS, SES, b.id) is CancelResult.REMOVED
    assert signals_log.calls["updated"][-1][1]["state"] == "cancelled"
    assert outbox.cancel(WS, SES, b.id) is CancelResult.NOT_FOUND
    assert queued(outbox) == ["a"]
    with pytest.raises(Duplicate):  # its key stays used, as after dismiss
        accept(outbox, "b")


def test_concurrent_edits_never_lose_one(outbox):
    from django_outbox.core.plans import Cmd

    entry = accept(outbox, "a", model={"id": "m1"})

    def racing(plan):
        """Drive ``plan``, letting another edit land right after its first read."""
        effect, raced = plan.send(None), False
        while True:
            answer = yield effect
            if not raced and isinstance(effect, Cmd):
                raced = True
                assert outbox.edit(WS, SES, entry.id, model={"id": "m2"}) is EditResult.UPDATED
            try:
                effect = plan.send(answer)
            except StopIteration as stop:
                return stop.value

    result = outbox._run(racing(outbox._edit_plan(WS, SES, entry.id, "mine", None, None)))
    assert result is EditResult.UPDATED
    [edited] = outbox.list(WS, SES)
    assert (edited.text, edited.model) == ("mine", {"id": "m2"})


def test_cancel_of_a_prompt_a_dead_worker_left_staged_is_in_flight(outbox):
    from tests.support.helpers import make_entry

    staged = make_entry("left behind", status=Status.DELIVERING, attempts=0)
    outbox.seed_entry_for_test(WS, SES, staged.to_json())
    assert outbox.cancel(WS, SES, staged.id) is CancelResult.IN_FLIGHT
    assert outbox.edit(WS, SES, staged.id, text="x") is EditResult.BUSY
    assert outbox.move(WS, SES, staged.id, to="last") is MoveResult.BUSY
    assert [(e.id, e.text) for e in outbox.list(WS, SES)] == [(staged.id, "left behind")]


def test_seeding_an_entry_already_staged_or_queued_is_refused(outbox):
    # seed_entry_for_test places an entry where it would be; the same ID twice, in the queue
    # or in staging (a dead worker's delivery), is refused and changes nothing.
    from tests.support.helpers import make_entry

    staged = make_entry("left behind", status=Status.DELIVERING, attempts=0)
    queued = make_entry("waiting")
    outbox.seed_entry_for_test(WS, SES, staged.to_json())
    outbox.seed_entry_for_test(WS, SES, queued.to_json())
    for entry in (staged, queued):
        with pytest.raises(ValueError, match="already queued"):
            outbox.seed_entry_for_test(WS, SES, entry.to_json())
    assert sorted(e.id for e in outbox.list(WS, SES)) == sorted([staged.id, queued.id])


# --- merge --------------------------------------------------------------------------


class Parts:
    """A deliverer that records the parts of each message it was handed, and fails the
    way it is told (None: delivered)."""

    def __init__(self, *raises):
        self.messages = []
        self.raises = list(raises)

    async def __call__(self, entry, **kwargs):
        self.messages.append(list(entry.parts or (entry.text,)))
        error = self.raises.pop(0) if self.raises else None
        if error is not None:
            raise error


def drain(outbox, deliverer, steps=10):
    """Step the session until nothing is due (owed signals fired included)."""
    for _ in range(steps):
        if not step(outbox, deliverer):
            return
    raise AssertionError("the session never went idle")


def test_merge_prompts_behind_a_turn_go_as_one_message(outbox, signals_log):
    a = accept(outbox, "a")
    blocking = BlockingDeliverer()
    ids = {}

    async def main():
        try:
            task = asyncio.create_task(outbox.adeliver_once(WS, SES, deliverer=blocking))
            await blocking.started.wait()
            for key in ("b", "c", "d"):
                e = await outbox.aaccept(
                    WS, SES, user_id="u", client_message_id=key, text=key, if_busy="merge"
                )
                ids[key] = e.id
            e = await outbox.aaccept(WS, SES, user_id="u", client_message_id="e", text="e")
            ids["e"] = e.id
            blocking.release()
            await task
        finally:
            await outbox.aclose()

    asyncio.run(main())
    parts = Parts()
    drain(outbox, parts)
    assert parts.messages == [["b", "c", "d"], ["e"]]
    assert outbox.list(WS, SES) == []
    assert sorted(signals_log.ids("delivered")) == sorted([a.id, *ids.values()])


def test_every_prompt_of_a_merged_message_is_announced_as_it_goes_out(outbox, signals_log):
    """A merged message's prompts are handed to the agent together, so each of them is
    announced staged and updated as delivering when the claim takes it, not only the
    first (docs/howto/steering.md#merging; docs/reference/signals.md)."""
    first = accept(outbox, "a", if_busy="merge")
    others = [accept(outbox, key, if_busy="merge") for key in ("b", "c")]
    parts = Parts()
    assert step(outbox, parts)
    assert parts.messages == [["a", "b", "c"]]
    merged = [first.id, *(e.id for e in others)]
    assert signals_log.ids("staged") == merged
    updates = signals_log.calls["updated"]
    delivering = [e.id for e, kwargs in updates if kwargs["state"] == "delivering"]
    assert delivering == merged


@pytest.mark.parametrize("receivers", ["entry_delivered-too", "watchers-only"])
def test_every_prompt_of_a_merged_message_is_shown_sent_once_it_is_delivered(outbox, receivers):
    """Watchers (``entry_updated``, the WebSocket's source) see each prompt of a merged
    message ``sent``, not only the first: a page would show the others delivering forever
    (docs/howto/steering.md#merging). Stepped as the worker steps (carrying each claim on):
    with an ``entry_delivered`` receiver the delivery is settled on its own, with watchers
    only together with the next claim."""
    from django_outbox import signals
    from django_outbox.core.step import Claimed

    seen: list[tuple[str, str]] = []
    carried: list[bool] = []

    def updated(sender, entry, state, **kwargs):
        seen.append((entry.id, state))

    def delivered(sender, entry, **kwargs):
        pass

    async def work(parts):
        carry = None
        try:
            for _ in range(10):
                took, carry = await outbox.astep(WS, SES, parts, carry, more=lambda: True)
                carried.append(isinstance(carry, Claimed))
                if not took:
                    return
            raise AssertionError("the session never went idle")
        finally:
            if carry is not None:
                await outbox.arelease(WS, SES, carry)
            await outbox.aclose()

    connected = [(signals.entry_updated, updated)]
    if receivers == "entry_delivered-too":
        connected.append((signals.entry_delivered, delivered))
    for signal, receiver in connected:
        signal.connect(receiver, weak=False)
    try:
        merged = [accept(outbox, key, if_busy="merge").id for key in ("a", "b", "c")]
        accept(outbox, "d")  # a queue prompt behind: the next claim has something to take
        parts = Parts()
        asyncio.run(work(parts))
    finally:
        for signal, receiver in connected:
            signal.disconnect(receiver)
    assert parts.messages == [["a", "b", "c"], ["d"]]
    # The settle path each case is about: with the next claim only without a receiver.
    assert carried[0] is (receivers == "watchers-only"), carried
    sent = [entry_id for entry_id, state in seen if state == "sent"]
    assert sent[:3] == merged and len(sent) == 4, seen


def test_a_merge_prompt_past_its_expiry_is_not_merged_and_ends_the_run(make_outbox):
    """A merge prompt that expired while it waited is never sent, not even inside another
    prompt's message: the run behind the head stops at it, and it ends expired."""
    clock = Clock()
    outbox = make_outbox(clock=clock)
    accept(outbox, "b", if_busy="merge")
    late = accept(outbox, "c", if_busy="merge", expires_after=1)
    accept(outbox, "d", if_busy="merge")
    clock.now = T0 + 5
    parts = Parts()
    drain(outbox, parts)
    assert parts.messages == [["b"], ["d"]]
    assert [(e.id, str(e.status)) for e in outbox.list(WS, SES)] == [(late.id, "expired")]


def test_a_queue_prompt_is_never_merged_and_order_holds(outbox):
    accept(outbox, "a")
    accept(outbox, "b", if_busy="merge")
    accept(outbox, "c", if_busy="merge")
    accept(outbox, "d")
    accept(outbox, "e", if_busy="merge")
    parts = Parts()
    drain(outbox, parts)
    assert parts.messages == [["a"], ["b", "c"], ["d"], ["e"]]


def test_a_merged_message_with_an_unknown_outcome_is_verified_once_for_all(
    make_outbox, signals_log
):
    from django_outbox import Verdict
    from django_outbox.errors import AmbiguousError

    verified = []

    async def verify(entry, **kwargs):
        verified.append(entry.text)
        return Verdict.DELIVERED

    outbox = make_outbox(verifier=verify, verify_delay=0)
    b = accept(outbox, "b", if_busy="merge")
    c = accept(outbox, "c", if_busy="merge")
    parts = Parts(AmbiguousError("cut"))
    step(outbox, parts)
    assert [(e.status, e.merged_into) for e in outbox.list(WS, SES)] == [
        (Status.VERIFYING, b.id),
        (Status.VERIFYING, b.id),
    ]
    drain(outbox, parts)
    assert parts.messages == [["b", "c"]]  # never sent again
    assert verified == ["b"]
    assert set(signals_log.ids("delivered")) == {b.id, c.id}
    assert outbox.list(WS, SES) == []


def test_a_merged_message_proven_absent_is_sent_again_for_all(make_outbox):
    from django_outbox import Verdict
    from django_outbox.errors import AmbiguousError

    async def verify(entry, **kwargs):
        return Verdict.ABSENT

    outbox = make_outbox(verifier=verify, verify_delay=0, retry_backoff=0.001, max_backoff=0.001)
    accept(outbox, "b", if_busy="merge")
    accept(outbox, "c", if_busy="merge")
    parts = Parts(AmbiguousError("cut"))
    step(outbox, parts)
    step(outbox, parts)  # the verification: absent for both
    after = outbox.list(WS, SES)
    assert [(e.status, e.attempts, e.merged_into) for e in after] == [
        (Status.PENDING, 1, None),
        (Status.PENDING, 1, None),
    ]
    outbox.retry(WS, SES, after[0].id)
    outbox.retry(WS, SES, after[1].id)
    drain(outbox, parts)
    assert parts.messages == [["b", "c"], ["b", "c"]]
    assert outbox.list(WS, SES) == []


def test_a_failed_merged_message_counts_an_attempt_for_each(make_outbox):
    outbox = make_outbox(max_attempts=1)
    accept(outbox, "b", if_busy="merge")
    accept(outbox, "c", if_busy="merge")
    step(outbox, Parts(RuntimeError("refused")))
    assert [(e.text, e.status, e.reason) for e in outbox.list(WS, SES)] == [
        ("b", Status.ERROR, "max_attempts"),
        ("c", Status.ERROR, "max_attempts"),
    ]


def test_a_merge_prompt_still_waiting_out_its_backoff_is_not_merged(make_outbox):
    """The run behind a merge head takes only prompts that are due (docs/howto/steering.md,
    "Merging"): one still waiting out its retry backoff keeps its own time."""
    outbox = make_outbox(retry_backoff=3600, max_backoff=3600)
    b = accept(outbox, "b", if_busy="merge")
    accept(outbox, "c", if_busy="merge")
    parts = Parts(RuntimeError("refused"))
    step(outbox, parts)  # failed: both wait an hour
    assert outbox.retry(WS, SES, b.id) is RetryResult.UPDATED  # b now, c keeps its hour
    step(outbox, parts)
    assert parts.messages == [["b", "c"], ["b"]]
    assert [(e.text, str(e.status)) for e in outbox.list(WS, SES)] == [("c", "pending")]


def test_a_merged_delivery_a_dead_worker_left_is_verified_for_all(make_outbox, signals_log):
    from django_outbox import Verdict
    from django_outbox.core.plans import Cmd, iter_once

    verified = []

    async def verify(entry, **kwargs):
        verified.append(entry.text)
        return Verdict.DELIVERED

    outbox = make_outbox(verifier=verify, verify_delay=0)
    b = accept(outbox, "b", if_busy="merge")
    c = accept(outbox, "c", if_busy="merge")
    kind, claimed, _ = outbox._run(outbox._claim_plan(WS, SES, "dead-worker", []))
    assert kind == "deliver" and claimed.parts == ("b", "c")
    # The worker died; its lease is gone.
    outbox._run(iter_once(Cmd(("DEL", outbox.keys.session(WS, SES).lock))))
    parts = Parts()
    drain(outbox, parts)
    assert parts.messages == [] and verified == ["b"]
    assert set(signals_log.ids("delivered")) == {b.id, c.id}


def test_each_prompt_of_a_merged_message_counts_in_the_history(make_outbox):
    from django_outbox.core.worker import Worker

    outbox = make_outbox(user_accepts_per_minute=0)
    for key in ("a", "b", "c"):
        accept(outbox, key, if_busy="merge")

    async def run():
        worker = Worker(outbox, Parts(), concurrency=1, tick=0.05, stop=asyncio.Event(),
                        once=True)  # fmt: skip
        await worker.run()
        await outbox.aclose()

    asyncio.run(run())
    assert outbox.list(WS, SES) == []
    history = outbox.history(minutes=2, workspace_id=WS)
    assert history.total("d") == 3 and sum(history.latency_counts()) == 3
    # One step at a time (a settle of its own, then the owed signals): counted the same.
    for key in ("d", "e"):
        accept(outbox, key, if_busy="merge")

    async def steps():
        try:
            while await outbox.adeliver_once(WS, SES, deliverer=Parts()):
                pass
            await outbox.aflush_history(outbox.history_counter)
        finally:
            await outbox.aclose()

    asyncio.run(steps())
    assert outbox.history(minutes=2, workspace_id=WS).total("d") == 5


def test_an_edit_is_held_to_max_text_bytes_in_utf8_bytes(make_outbox):
    # The edited text meets accept's bound (MAX_TEXT_BYTES, counted in UTF-8 bytes): exactly
    # the bound is taken, one byte over is refused and the prompt keeps its text
    # (docs/howto/steering.md#edit).
    from django_outbox.errors import ContentTooLarge

    outbox = make_outbox(max_text_bytes=1024)
    entry = accept(outbox, "a")
    with pytest.raises(ContentTooLarge):
        outbox.edit(WS, SES, entry.id, text="\u00e9" * 512 + "x")  # 1025 bytes
    assert outbox.list(WS, SES)[0].text == "a"
    assert outbox.edit(WS, SES, entry.id, text="\u00e9" * 512) is EditResult.UPDATED
    assert outbox.list(WS, SES)[0].text == "\u00e9" * 512


def test_an_edit_is_held_to_the_model_allow_list(make_outbox):
    from django_outbox.errors import ModelNotAllowed

    outbox = make_outbox(models=("anthropic/*",))
    entry = accept(outbox, "a", model={"providerID": "anthropic", "modelID": "claude"})
    with pytest.raises(ModelNotAllowed):
        outbox.edit(WS, SES, entry.id, model={"providerID": "openai", "modelID": "gpt-5"})
    assert outbox.list(WS, SES)[0].model == {"providerID": "anthropic", "modelID": "claude"}
    assert outbox.edit(WS, SES, entry.id, text="only the text") is EditResult.UPDATED


def test_every_steering_change_counts_once_in_the_history_and_no_change_never(outbox):
    """Edit, move (to the end, to next, before another) and cancel each count one
    operator change ('x') in the per-minute history (docs/howto/observe.md); a move to
    where the prompt already stands changes nothing and counts nothing."""
    a, b, c = accept(outbox, "a"), accept(outbox, "b"), accept(outbox, "c")
    assert outbox.edit(WS, SES, a.id, text="a2") is EditResult.UPDATED
    assert outbox.move(WS, SES, a.id, to="last") is MoveResult.MOVED
    assert outbox.move(WS, SES, a.id, to="next") is MoveResult.MOVED
    assert outbox.move(WS, SES, c.id, before=b.id) is MoveResult.MOVED
    assert outbox.cancel(WS, SES, b.id) is CancelResult.REMOVED
    assert queued(outbox) == ["a2", "c"]
    assert outbox.move(WS, SES, c.id, to="last") is MoveResult.MOVED  # already there
    assert outbox.history(minutes=2, workspace_id=WS).total("x") == 5
