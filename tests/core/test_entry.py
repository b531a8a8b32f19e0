"""Entry: exact JSON round-trip, validation rules, timestamps and IDs (no Valkey needed)."""

import json
import time

import pytest

from django_outbox import Entry, Status
from django_outbox.core.entry import (
    CONTENT_MARKER,
    canonical_time,
    fingerprint,
    format_time,
    new_entry_id,
    parse_time,
)
from django_outbox.core.rules import (
    check_identifier,
    check_model,
    check_reason,
    check_user_id,
    validate_content,
)
from django_outbox.errors import ContentTooLarge, InvalidContent, InvalidIdentifier
from tests.support.hostile import HOSTILE_MODEL, HOSTILE_TEXT


def make(**kw):
    base = dict(
        id=new_entry_id(),
        client_message_id="k1",
        user_id="u1",
        text="hi",
        accepted_at=format_time(1_764_466_959_123_456),
    )
    base.update(kw)
    return Entry(**base)


def test_round_trip_keeps_model_and_text_exact():
    entry = make(text=HOSTILE_TEXT, model=HOSTILE_MODEL)
    back = Entry.from_json(entry.to_json())
    assert back == entry
    assert back.text.encode("utf-8") == HOSTILE_TEXT.encode("utf-8")
    assert json.dumps(back.model, sort_keys=True) == json.dumps(HOSTILE_MODEL, sort_keys=True)
    assert back.model["big"] == 12345678901234567
    assert back.model["a"] == [] and back.model["b"] == {}


def test_stored_form_puts_state_before_content():
    raw = make(model={"clientMessageID": 'x,"clientMessageID":'}).to_json()
    assert raw.startswith('{"id":')
    head, _, _ = raw.partition(CONTENT_MARKER)
    assert "text" not in head and '"status":"pending"' in head
    assert json.loads(raw)["model"] == {"clientMessageID": 'x,"clientMessageID":'}


def test_wire_dict_is_camel_case():
    entry = make(last_error="boom", verify_attempts=2, blocked_by_in_flight=True, in_flight_for=1.5)
    data = entry.to_dict()
    assert data["clientMessageID"] == "k1" and data["userID"] == "u1"
    assert data["acceptedAt"].endswith("Z") and data["verifyAttempts"] == 2
    assert data["blockedByInFlight"] is True and data["inFlightFor"] == 1.5
    assert "model" not in data and "transientFails" not in data


def test_from_dict_refuses_garbage():
    with pytest.raises(ValueError):
        Entry.from_json("[]")
    with pytest.raises(ValueError):
        Entry.from_dict({**make().to_dict(), "status": "bogus"})
    with pytest.raises(ValueError):
        Entry.from_dict({**make().to_dict(), "attempts": -1})
    with pytest.raises(ValueError):
        Entry.from_dict({**make().to_dict(), "surprise": 1})


def test_time_format_is_fixed_width_and_round_trips():
    for us in (0, 1, 999_999, 1_764_466_959_123_456, 4_102_444_800_000_000 - 1):
        text = format_time(us)
        assert len(text) == 27 and text.endswith("Z")
        assert parse_time(text) == us
    assert canonical_time("2026-11-30T02:42:39+01:00") == "2026-11-30T01:42:39.000000Z"


def test_entry_ids_sort_by_creation_and_fit_the_allow_list():
    ids = [new_entry_id(1_764_466_959_000) for _ in range(50)]
    assert ids == sorted(ids) and len(set(ids)) == 50
    for value in ids:
        assert len(value) == 26 and check_identifier("entry ID", value) == value


def test_entry_ids_made_in_one_millisecond_count_up_even_after_other_ids():
    # IDs made earlier in this process (at the real time) must not make the counter of
    # a millisecond start over: every ID of the same millisecond sorts after the last.
    new_entry_id()
    ms = int(time.time() * 1000) + 50  # after every ID made so far
    ids = [new_entry_id(ms) for _ in range(20)]
    assert ids == sorted(ids)
    assert len({value[:12] for value in ids}) == 20  # the time-and-counter part alone


@pytest.mark.parametrize(
    "bad", ["", "a}:{b", "a:b", "s1\n", "*", "[x]", "x" * 129, " a", "-a", "a b", None, 5]
)
def test_identifier_allow_list(bad):
    with pytest.raises(InvalidIdentifier):
        check_identifier("session ID", bad)


@pytest.mark.parametrize(
    ("text", "model", "cmid", "rule"),
    [
        ("", None, "k", "empty"),
        ("x" * 11, None, "k", "limit is 10"),
        ("😀" * 3, None, "k", "12 UTF-8 bytes"),
        ("\ud800", None, "k", "lone surrogate"),
        (None, None, "k", "string"),
        (123, None, "k", "string"),
        ("ok", "gpt", "k", "JSON object"),
        ("ok", ["a"], "k", "JSON object"),
        ("ok", {"x": "y" * 17000}, "k", "limit is 16384"),
        ("ok", {"x": float("nan")}, "k", "plain JSON"),
        ("ok", {"x": object()}, "k", "plain JSON"),
        ("ok", None, "", "clientMessageID"),
        ("ok", None, "k" * 129, "clientMessageID"),
        ("ok", None, "tab\t", "clientMessageID"),
        ("ok", None, "del\x7f", "clientMessageID"),
        ("ok", None, 5, "clientMessageID"),
    ],
)
def test_content_rules_name_the_rule(text, model, cmid, rule):
    with pytest.raises(InvalidContent, match=rule):
        validate_content(text, model, cmid, max_text_bytes=10)


def test_content_errors_are_value_errors_and_too_large_is_one():
    assert issubclass(InvalidContent, ValueError)
    assert issubclass(ContentTooLarge, InvalidContent)


@pytest.mark.parametrize("reason", ["", "  ", "\n\t", "x" * 201, None, 5])
def test_park_reason_rule_raises_invalid_content(reason):
    with pytest.raises(InvalidContent, match="at most 200 characters"):
        check_reason(reason)


def test_park_reason_and_user_id_rules_accept_the_limits():
    assert check_reason("x" * 200) == "x" * 200
    assert check_reason("\u00e9" * 200) == "\u00e9" * 200  # characters, not UTF-8 bytes
    assert check_user_id("u" * 255) == "u" * 255
    assert check_user_id(42) == "42"


@pytest.mark.parametrize("user_id", ["u" * 256, None, True, 1.5])
def test_user_id_rule_raises_invalid_content(user_id):
    with pytest.raises(InvalidContent, match="user_id"):
        check_user_id(user_id)


def test_malformed_stored_entry_is_not_a_content_error():
    """A stored entry that does not parse is corrupt data, not a client's input: it must not
    look like InvalidContent, or the API would answer it 400 instead of 500."""
    with pytest.raises(ValueError) as info:
        Entry.from_dict({"id": "e1", "clientMessageID": "k", "status": "nope"})
    assert not isinstance(info.value, InvalidContent)


def test_limit_is_inclusive():
    validate_content("x" * 10, {"m": [1]}, "k", max_text_bytes=10)


def test_fingerprint_ignores_model_key_order_only():
    assert fingerprint("a", {"x": 1, "y": 2}) == fingerprint("a", {"y": 2, "x": 1})
    assert fingerprint("a", None) != fingerprint("b", None)
    assert fingerprint("a", None) != fingerprint("a", {})


def test_status_values():
    assert [s.value for s in Status] == [
        "pending",
        "delivering",
        "verifying",
        "error",
        "parked",
        "expired",
    ]


def test_size_rules_raise_content_too_large():
    from django_outbox.core.errors import ContentTooLarge

    with pytest.raises(ContentTooLarge) as info:
        validate_content("x" * 11, None, "k", max_text_bytes=10)
    assert (info.value.what, info.value.size, info.value.limit) == ("text", 11, 10)
    with pytest.raises(ContentTooLarge):
        validate_content("x", {"m": "y" * 17_000}, "k", max_text_bytes=10)


def test_model_depth_is_bounded():
    deep = {"a": []}
    for _ in range(40):
        deep = {"a": [deep]}
    with pytest.raises(InvalidContent, match="deeper than 32"):
        validate_content("x", deep, "k", max_text_bytes=10)
    ok = {"a": [[[{"b": [1]}]]]}
    validate_content("x", ok, "k", max_text_bytes=10)


def test_model_depth_check_survives_100k_levels():
    """The depth walk recurses at most MAX_MODEL_DEPTH + 1 levels, whatever the input."""
    deep: object = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(InvalidContent, match="deeper than 32"):
        check_model({"m": deep})


def test_stored_form_omits_zero_counters():
    assert '"verifyAttempts"' not in make().to_json()
    assert '"transientFails"' not in make().to_json()


@pytest.mark.parametrize(
    "text, model",
    [
        ("hello", None),
        ('quote " backslash \\ slash / NUL \x00 RTL \u202e ZWJ \u200d 🙂', None),
        ("t", {"a": [], "b": {}, "n": 12345678901234567, "u": "é"}),
    ],
)
def test_fresh_entry_json_is_to_json_of_a_fresh_entry(text, model):
    from django_outbox.core.entry import fresh_entry_json

    entry = Entry(
        id=new_entry_id(),
        client_message_id="k-1",
        user_id="42",
        text=text,
        model=model,
        accepted_at=format_time(1_764_466_959_123_456),
    )
    assert (
        fresh_entry_json(entry.id, entry.accepted_at, "k-1", "42", text, model) == entry.to_json()
    )


@pytest.mark.parametrize(
    "member, value",
    [
        ("attempts", True),  # a boolean is not a count, though Python calls it an int
        ("holds", False),
        ("verifyAttempts", 1.5),  # a fractional count is refused, never truncated
        ("interrupted", 1),  # a flag is a JSON boolean, not a number equal to one
        ("acceptedAt", "2026-13-01T00:00:00.000000Z"),  # the fixed-width form, month 13
        ("nextAttemptAt", "2026-02-30T00:00:00.000000Z"),
    ],
)
def test_a_stored_entry_with_a_member_of_the_wrong_kind_is_refused(member, value):
    """A stored entry is read strictly (docs/explanation/storage.md): a member of the wrong
    type or an impossible date is corrupt data, refused with ``ValueError``."""
    with pytest.raises(ValueError):
        Entry.from_dict({**make().to_dict(), member: value})


def test_a_stored_entry_with_whole_counts_written_as_floats_reads_as_integers():
    entry = Entry.from_dict({**make().to_dict(), "attempts": 2.0, "holds": 1.0})
    assert (entry.attempts, entry.holds) == (2, 1)
    assert type(entry.attempts) is int and type(entry.holds) is int


def test_a_timestamp_in_lowercase_z_reads_as_utc():
    """RFC 3339 allows ``z`` as well as ``Z`` (docs/reference/python.md: any offset)."""
    assert parse_time("2026-11-30T01:42:39.123456z") == parse_time("2026-11-30T01:42:39.123456Z")
    assert canonical_time("2026-11-30T01:42:39z") == "2026-11-30T01:42:39.000000Z"


def test_a_session_lease_held_for_zero_seconds_is_still_reported():
    """``inFlightFor`` is present whenever the entry waits behind a lease, even one just
    taken (0.0 seconds): a client tells "blocked" from "not blocked" by it."""
    data = make(blocked_by_in_flight=True, in_flight_for=0.0).to_dict()
    assert data["inFlightFor"] == 0.0
    assert "inFlightFor" not in make().to_dict()
