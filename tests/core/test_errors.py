"""The outbox's errors as a Python caller reads them: the message of each refusal names
the bound that was reached, and a deliverer's outcome error keeps its cause
(docs/reference/python.md, docs/howto/deliverer.md). No Valkey needed."""

import pytest

from django_outbox.errors import (
    AmbiguousError,
    HoldDeliveryError,
    OutboxFull,
    RateLimited,
    TransientDeliveryError,
)


def test_a_full_outbox_says_which_bound_was_reached():
    session, user = OutboxFull(25), OutboxFull(100, scope="user")
    assert (session.scope, session.cap) == ("session", 25)
    assert str(session) == "session outbox is full (25 entries)"
    assert (user.scope, user.cap) == ("user", 100)
    assert str(user) == "this user already has 100 entries queued in the workspace"


def test_a_rate_limit_says_the_limit_and_when_to_retry():
    refused = RateLimited(retry_after=20, limit=3)
    assert (refused.retry_after, refused.limit) == (20, 3)
    assert str(refused).endswith(
        "accepted 3 messages into the workspace within a minute; retry in 20 s"
    )


@pytest.mark.parametrize("outcome", [AmbiguousError, TransientDeliveryError])
def test_an_outcome_error_keeps_its_message_and_its_cause_apart(outcome):
    shown, cause = ValueError("what the agent said"), OSError("connection reset")
    error = outcome(shown, err=cause)
    assert str(error) == "what the agent said"
    assert error.err is cause and error.__cause__ is cause
    alone = outcome(cause)
    assert (str(alone), alone.err) == ("connection reset", cause)


def test_a_hold_of_zero_seconds_means_at_once():
    assert HoldDeliveryError("busy", retry_after=0).retry_after == 0.0
    assert HoldDeliveryError("busy", retry_after=2).retry_after == 2.0


@pytest.mark.parametrize("bad", [10**400, -1, float("inf")])
def test_a_hold_too_long_for_a_float_is_refused_like_an_infinite_one(bad):
    """An int past the float range (a Retry-After of 400 digits) breaks the rule
    "a finite number of seconds" with ValueError, not OverflowError."""
    with pytest.raises(ValueError, match="retry_after must be a finite number"):
        HoldDeliveryError("busy", retry_after=bad)
