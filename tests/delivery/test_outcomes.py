"""The outcome table at its edges: a timed-out call stays unknown
whatever the deliverer does next, and no exception text can break a step."""

from __future__ import annotations

import asyncio
import threading

import pytest

from django_outbox import Status, Verdict
from django_outbox.core.rules import MAX_ERROR_CHARS, clean_text, describe_error
from django_outbox.errors import AmbiguousError, TransientDeliveryError

WS, SES = "w1", "s1"
FAST = dict(retry_backoff=0.05, max_backoff=0.2, verify_delay=0, verify_backoff=0.05)


@pytest.fixture
async def make_outbox(make_outbox):
    """The conftest factory, with each outbox's async clients closed at teardown."""
    made = []

    def build(**kwargs):
        made.append(make_outbox(**kwargs))
        return made[-1]

    yield build
    for outbox in made:
        await outbox.aclose()


async def accept(outbox, key="k1"):
    return await outbox.aaccept(WS, SES, user_id="u", client_message_id=key, text=key)


async def only_entry(outbox):
    (entry,) = await outbox.alist(WS, SES)
    return entry


class Stored:
    """What the agent stored: a deliverer appends here before it misbehaves."""

    def __init__(self):
        self.texts = []


# --- once DELIVERY_TIMEOUT has passed, the outcome is unknown -------------------------


def swallowing(stored, then):
    """A deliverer that stores the prompt, waits past the timeout, swallows the
    cancellation and then does ``then()``: return (None) or raise what it gives."""

    async def deliver(entry, *, workspace_id, session_id, attempt):
        stored.texts.append(entry.text)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass
        error = then()
        if error is not None:
            raise error

    return deliver


@pytest.mark.parametrize(
    "then",
    [
        lambda: None,  # returns normally: the case as reported
        lambda: RuntimeError("agent said no"),  # a "definitive failure" after the deadline
        lambda: TransientDeliveryError("connect refused"),  # "nothing was sent" after it
    ],
    ids=["returns", "raises-failure", "raises-transient"],
)
async def test_a_deliverer_that_swallows_the_timeout_leaves_the_outcome_unknown(
    make_outbox, signals_log, then
):
    stored = Stored()
    outbox = make_outbox(deliverer=swallowing(stored, then), delivery_timeout=0.2, **FAST)
    await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    entry = await only_entry(outbox)
    # Without a verifier an unknown outcome is never resent: error/unverifiable.
    assert (entry.status, entry.reason) == (Status.ERROR, "unverifiable"), entry
    assert entry.last_error.startswith("timed out after 0.2s")
    assert signals_log.ids("delivered") == []
    assert stored.texts == ["k1"]


async def test_with_a_verifier_the_swallowed_timeout_is_verified_not_resent(
    make_outbox, signals_log
):
    stored = Stored()
    verdicts = []

    async def verify(entry, *, workspace_id, session_id):
        verdicts.append(entry.id)
        return Verdict.DELIVERED if entry.text in stored.texts else Verdict.ABSENT

    outbox = make_outbox(
        deliverer=swallowing(stored, lambda: None), verifier=verify, delivery_timeout=0.2, **FAST
    )
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert (await only_entry(outbox)).status is Status.VERIFYING
    assert signals_log.ids("delivered") == []
    assert await outbox.adeliver_once(WS, SES)  # the verifier decides
    assert verdicts == [entry.id]
    assert await outbox.alist(WS, SES) == []
    assert signals_log.ids("delivered") == [entry.id]
    assert stored.texts == ["k1"]  # sent once


async def test_a_sync_deliverer_that_returns_after_the_timeout_is_unknown(make_outbox):
    release = threading.Event()
    calls = []

    def deliver(entry, *, workspace_id, session_id, attempt):
        calls.append(attempt)
        release.wait(5)

    outbox = make_outbox(deliverer=deliver, delivery_timeout=0.2, **FAST)
    await accept(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.sleep(0.5)  # past DELIVERY_TIMEOUT; the thread is still "sending"
    assert not step.done()  # the lease is kept while the thread runs (no second send)
    release.set()
    assert await step
    entry = await only_entry(outbox)
    assert (entry.status, entry.reason, calls) == (Status.ERROR, "unverifiable", [1])


async def test_a_swallowed_shutdown_cancellation_is_recorded_as_ambiguous(make_outbox, signals_log):
    started = asyncio.Event()

    async def deliver(entry, *, workspace_id, session_id, attempt):
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return  # pretends it finished

    outbox = make_outbox(deliverer=deliver, delivery_timeout=60, **FAST)
    await accept(outbox)
    step = asyncio.create_task(outbox.adeliver_once(WS, SES))
    await asyncio.wait_for(started.wait(), 5)
    step.cancel()
    with pytest.raises(asyncio.CancelledError):
        await step
    entry = await only_entry(outbox)
    # recorded as an unknown outcome (verified next), never as sent
    assert (entry.status, entry.last_error) == (Status.VERIFYING, "cancelled")
    assert signals_log.ids("delivered") == []


async def test_a_delivery_within_the_timeout_is_still_delivered(make_outbox, signals_log):
    async def deliver(entry, *, workspace_id, session_id, attempt):
        await asyncio.sleep(0.05)

    outbox = make_outbox(deliverer=deliver, delivery_timeout=2, **FAST)
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    assert await outbox.alist(WS, SES) == []
    assert signals_log.ids("delivered") == [entry.id]


# --- no exception text can break a step -----------------------------------------------


class BadStr(Exception):
    def __str__(self):
        raise ValueError("no str for you")

    def __repr__(self):
        raise ValueError("no repr either")


class Loud(str):
    """A message that is a str subclass whose own __str__ raises."""

    def __str__(self):
        raise RuntimeError("loud")


@pytest.mark.parametrize(
    "error, expected",
    [
        (RuntimeError("\udcff"), "RuntimeError: \ufffd"),  # the case as reported
        (RuntimeError("reply: b'\\xff' -> " + b"\xffok".decode(errors="surrogateescape")),
         "RuntimeError: reply: b'\\xff' -> \ufffdok"),
        (BadStr(), "BadStr: <unprintable BadStr>"),
        (RuntimeError(Loud("quiet\udcff")), None),
        (RuntimeError("x" * 10_000), None),  # bounded
    ],
    ids=["lone-surrogate", "surrogateescape-reply", "str-and-repr-raise", "str-subclass", "long"],
)  # fmt: skip
async def test_a_failure_with_hostile_text_is_recorded_like_any_failure(
    make_outbox, error, expected
):
    async def deliver(entry, *, workspace_id, session_id, attempt):
        raise error

    outbox = make_outbox(deliverer=deliver, **FAST)
    await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)  # no exception escapes the step
    entry = await only_entry(outbox)
    assert (entry.status, entry.attempts) == (Status.PENDING, 1)
    assert entry.next_attempt_at is not None  # backoff, as for any failure
    if expected is not None:
        assert entry.last_error == expected
    assert len(entry.last_error) <= MAX_ERROR_CHARS
    assert "\udcff" not in entry.last_error
    # the lease was released: the next attempt is not blocked for LOCK_TTL
    assert (await outbox.asnapshot(WS, SES)).lease is None


@pytest.mark.parametrize(
    "error",
    [AmbiguousError("\udcff"), TransientDeliveryError("\udcff"), AmbiguousError(BadStr())],
    ids=["ambiguous", "transient", "ambiguous-wrapping-bad-str"],
)
async def test_outcome_errors_with_hostile_text_keep_their_outcome(make_outbox, error):
    async def deliver(entry, *, workspace_id, session_id, attempt):
        raise error

    outbox = make_outbox(deliverer=deliver, **FAST)
    await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)
    entry = await only_entry(outbox)
    if isinstance(error, AmbiguousError):
        assert (entry.status, entry.reason) == (Status.ERROR, "unverifiable")
    else:
        assert (entry.status, entry.attempts, entry.transient_fails) == (Status.PENDING, 0, 1)
    assert "\udcff" not in entry.last_error


async def test_a_verifier_with_hostile_text_is_inconclusive_not_stuck(make_outbox):
    async def deliver(entry, *, workspace_id, session_id, attempt):
        raise AmbiguousError("cut")

    class Weird:
        def __repr__(self):
            raise RuntimeError("no")

    answers = [RuntimeError("\udcff"), BadStr(), Weird()]

    async def verify(entry, *, workspace_id, session_id):
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    outbox = make_outbox(deliverer=deliver, verifier=verify, **FAST)
    await accept(outbox)
    assert await outbox.adeliver_once(WS, SES)  # ambiguous -> verifying
    for _ in range(3):
        await asyncio.sleep(0.3)  # past the verify backoff
        assert await outbox.adeliver_once(WS, SES)
        entry = await only_entry(outbox)
        assert entry.status is Status.VERIFYING
        assert "\udcff" not in (entry.last_error or "")
    assert entry.verify_attempts == 3


def test_clean_text_and_describe_error_never_raise_and_bound_their_output():
    assert clean_text("a\ud800b\udfffc", 100) == "a\ufffdb\ufffdc"
    assert clean_text("x" * 50, 10) == "x" * 9 + "\u2026"
    assert clean_text(b"\xff", 100) == "b'\\xff'"
    assert describe_error(BadStr()) == "BadStr: <unprintable BadStr>"
    assert describe_error(ValueError()) == "ValueError"
    assert describe_error(RuntimeError("m"), with_type=False) == "m"
