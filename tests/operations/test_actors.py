"""Who changed an entry: every edit, move, cancel and Stop records its actor, written by
the script that makes the change (docs/explanation/storage.md#who-changed-an-entry)."""

import json

import pytest

from django_outbox import CancelResult, EditResult, InterruptResult, MoveResult, SendNowResult
from django_outbox.core.actors import changes_of, cli_actor, staff_actor, user_actor
from django_outbox.errors import InvalidContent
from django_outbox.signals import entry_updated
from tests.support.helpers import SES, WS, accept

ACTOR_MEMBERS = ("editedBy", "movedBy", "cancelledBy", "stoppedBy")


async def _no_abort(entry, *, workspace_id, session_id):
    """An aborter that is never called here: no worker holds the lease."""


def stored(outbox, entry_id):
    """The entry's stored JSON as a dict (the raw list item, as the scripts wrote it)."""
    key = outbox.keys.session(WS, SES).queue
    for raw in outbox.client.lrange(key, 0, -1):
        data = json.loads(raw)
        if data["id"] == entry_id:
            return data
    raise AssertionError(f"{entry_id} is not queued")


def claim_head(outbox):
    """Put the head of the queue in flight under a live lease; returns its ID."""
    kind, claimed, _ = outbox._run(outbox._claim_plan(WS, SES, "holder", []))
    assert kind == "deliver"
    return claimed.id


def test_an_entry_nobody_changed_stores_no_actor(outbox):
    entry = accept(outbox, "a")
    assert not set(ACTOR_MEMBERS) & set(stored(outbox, entry.id))
    assert changes_of(outbox.list(WS, SES)[0]) == []


def test_edit_and_move_record_their_actor_in_the_stored_entry(outbox):
    a, b = accept(outbox, "a"), accept(outbox, "b")
    assert outbox.edit(WS, SES, a.id, text="a2", actor="user:7") is EditResult.UPDATED
    assert outbox.move(WS, SES, b.id, to="next", actor="staff:1") is MoveResult.MOVED
    assert stored(outbox, a.id)["editedBy"] == "user:7"
    assert stored(outbox, b.id)["movedBy"] == "staff:1"
    assert "editedBy" not in stored(outbox, b.id)
    first, second = outbox.list(WS, SES)
    assert (first.id, first.moved_by, second.edited_by) == (b.id, "staff:1", "user:7")
    assert changes_of(second) == [("edited", "user:7")]
    # The last actor is the one kept; a move before another entry records it too.
    outbox.move(WS, SES, a.id, before=b.id, actor="user:8")
    assert outbox.list(WS, SES)[0].moved_by == "user:8"


def test_a_move_that_changes_nothing_records_nothing(outbox):
    a = accept(outbox, "a")
    accept(outbox, "b")
    assert outbox.move(WS, SES, a.id, to="next", actor="user:7") is MoveResult.MOVED
    assert "movedBy" not in stored(outbox, a.id)


def test_the_python_api_records_system_when_no_actor_is_named(outbox):
    a = accept(outbox, "a")
    outbox.edit(WS, SES, a.id, text="a2")
    assert outbox.list(WS, SES)[0].edited_by == "system"


def test_a_cancel_reports_the_removed_entry_with_its_actor(outbox):
    a = accept(outbox, "a")
    events = []

    def receiver(entry, state, **kwargs):
        events.append((state, entry))

    entry_updated.connect(receiver)
    try:
        assert outbox.cancel(WS, SES, a.id, actor="user:7") is CancelResult.REMOVED
    finally:
        entry_updated.disconnect(receiver)
    [(state, entry)] = events
    assert (state, entry.id, entry.cancelled_by) == ("cancelled", a.id, "user:7")
    assert entry.to_dict()["cancelledBy"] == "user:7"
    assert outbox.list(WS, SES) == []


def test_a_stop_records_who_stopped_the_turn_and_a_second_stop_keeps_the_first(make_outbox):
    outbox = make_outbox(aborter=_no_abort)
    a = accept(outbox, "a")
    accept(outbox, "b")
    assert claim_head(outbox) == a.id
    result = outbox.interrupt(WS, SES, entry_id=a.id, actor="user:7")
    assert result is InterruptResult.CUT
    assert outbox.cut(WS, SES, a.id, actor="staff:1") is InterruptResult.ALREADY
    [in_flight] = [e for e in outbox.list(WS, SES) if e.id == a.id]
    assert (in_flight.interrupted, in_flight.stopped_by) == (True, "user:7")


def test_send_now_records_the_move_and_the_cut(make_outbox):
    outbox = make_outbox(aborter=_no_abort)
    a = accept(outbox, "a")
    accept(outbox, "b")
    c = accept(outbox, "c")
    claim_head(outbox)
    assert outbox.send_now(WS, SES, c.id, actor="user:9") is SendNowResult.CUT
    entries = {e.id: e for e in outbox.list(WS, SES)}
    assert (entries[c.id].moved_by, entries[a.id].stopped_by) == ("user:9", "user:9")


def test_accept_interrupting_is_the_accepting_users_own_act(make_outbox):
    outbox = make_outbox(aborter=_no_abort)
    a = accept(outbox, "a")
    claim_head(outbox)
    entry, result = outbox.accept_interrupting(
        WS, SES, user_id="42", client_message_id="now", text="now"
    )
    assert result is SendNowResult.CUT
    entries = {e.id: e for e in outbox.list(WS, SES)}
    assert (entries[entry.id].moved_by, entries[a.id].stopped_by) == ("user:42", "user:42")


@pytest.mark.parametrize("actor", ["", None, 7, "u" * 300])
def test_a_malformed_actor_is_refused_before_anything_changes(outbox, actor):
    a = accept(outbox, "a")
    with pytest.raises(InvalidContent):
        outbox.edit(WS, SES, a.id, text="x", actor=actor)
    with pytest.raises(InvalidContent):
        outbox.cancel(WS, SES, a.id, actor=actor)
    assert [(e.text, e.edited_by) for e in outbox.list(WS, SES)] == [("a", None)]


def test_actor_helpers():
    assert user_actor(42) == "user:42"
    assert staff_actor("1") == "staff:1"
    assert cli_actor().startswith("cli")
