"""Each backoff tunable reaches the settle script as the one it names
(core/scripts.py settle_argv; docs/reference/settings.md): a tunable sent in another's place
only shows where the two differ, which the shared test settings never make them."""

from django_outbox import Entry
from django_outbox.core.entry import parse_time
from tests.support.script_calls import NOW, call, seed, settle


def settle_with(outbox, entry_id, outcome, **tunables):
    return settle(outbox, "tok", entry_id, outcome, **tunables)


def test_an_inconclusive_verification_waits_at_most_max_verify_backoff(outbox):
    e = seed(outbox, status="verifying")
    assert call(outbox, "claim", "tok", 30_000)[0] == "verify"
    kind, raw, *_ = settle_with(
        outbox,
        e.id,
        "inconclusive",
        verify_backoff=10.0,
        max_verify_backoff=1.0,
        retry_backoff=20.0,
        max_backoff=100.0,
    )
    after = Entry.from_json(raw)
    assert kind == "updated" and after.status == "verifying"
    assert parse_time(after.next_attempt_at) - NOW == 1_000_000


def test_a_transient_failure_waits_at_most_max_backoff(outbox):
    e = seed(outbox)
    assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
    kind, raw, *_ = settle_with(
        outbox,
        e.id,
        "transient",
        retry_backoff=20.0,
        max_backoff=3.0,
        verify_backoff=10.0,
        max_verify_backoff=1.0,
    )
    after = Entry.from_json(raw)
    assert kind == "updated" and after.status == "pending"
    assert parse_time(after.next_attempt_at) - NOW == 3_000_000
