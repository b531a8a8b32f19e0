"""One-line rules of the delivery spine's Lua scripts that the wider tables do not walk:
a replayed claim of a merged delivery, the delivered-only settle, the wake list's cap,
and client content that looks like state (docs/explanation/storage.md, "The Lua scripts";
docs/explanation/lifecycle.md, "What happens to a message"; docs/howto/steering.md).

Each test runs the real scripts on a real valkey-server."""

import pytest

from django_outbox import Entry
from django_outbox.core.entry import format_time, new_entry_id
from django_outbox.core.scripts import (
    index_hint_argv,
    load_scripts,
    read_source,
    settle_argv,
)
from django_outbox.core.step import RECEIPT_TTL_MS
from django_outbox.errors import SessionBusy
from tests.support.helpers import accept
from tests.support.script_calls import (
    NOW,
    SES,
    WS,
    accept_args,
    call,
    seed,
    settle,
    stored_entry,
)


def ids(raws):
    return [Entry.from_json(raw).id for raw in raws]


def test_a_holder_asking_again_gets_every_member_of_its_merged_delivery_back(outbox):
    """A holder that lost the claim's reply and claims again under the same lease gets its
    staged delivery back whole: the head and every merged member behind it."""
    head = accept(outbox, "b", if_busy="merge")
    members = [accept(outbox, key, if_busy="merge") for key in ("c", "d")]
    first = call(outbox, "claim", "tok", 30_000)
    assert first[0] == "deliver"
    assert ids(first[1:2] + first[4:]) == [head.id] + [m.id for m in members]
    again = call(outbox, "claim", "tok", 30_000)
    assert again[0] == "deliver"
    assert ids(again[1:2] + again[4:]) == [head.id] + [m.id for m in members]
    staged = [Entry.from_json(raw) for raw in again[1:2] + again[4:]]
    assert {e.merged_into for e in staged} == {head.id}
    assert {e.last_attempt_at for e in staged} == {staged[0].last_attempt_at} != {None}


def test_a_merge_prompt_alone_is_delivered_as_itself(outbox):
    """A merge prompt with no merge prompt behind it is an ordinary delivery: it is not
    marked as the head of a merged message (docs/howto/steering.md#merging)."""
    accept(outbox, "b", if_busy="merge")
    accept(outbox, "c")  # a queue prompt ends the run
    answer = call(outbox, "claim", "tok", 30_000)
    assert answer[0] == "deliver" and answer[4:] == []
    assert Entry.from_json(answer[1]).merged_into is None


def test_the_delivered_only_settle_refuses_every_other_outcome(outbox, r):
    """settle_delivered runs on a server at maxmemory because a delivery frees memory; any
    other outcome would write there, so it is refused and nothing changes."""
    e = seed(outbox)
    assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
    keys = outbox.keys.session(WS, SES)
    staged = r.lrange(keys.staging, 0, -1)
    for outcome in ("failed", "absent", "transient", "ambiguous"):
        args = settle_argv("tok", e.id, outcome, "boom", outbox.config, RECEIPT_TTL_MS)
        with pytest.raises(Exception, match="only records delivered"):
            call(outbox, "settle_delivered", *args)
        assert r.lrange(keys.staging, 0, -1) == staged
        assert r.get(keys.lock).split()[0] == "tok"
    args = settle_argv("tok", e.id, "delivered", "", outbox.config, RECEIPT_TTL_MS)
    assert call(outbox, "settle_delivered", *args)[0] == "removed"


@pytest.mark.standalone  # the wake list is a global key of a standalone server
def test_the_wake_list_stops_at_its_cap(outbox, r):
    """Wake items only cut latency (workers find due work through the due index), so the
    list is bounded: at 10 000 items an accept adds none; below, it adds its one."""
    cap = 10_000
    r.delete(outbox.keys.wake)
    r.rpush(outbox.keys.wake, *(["w0 old"] * (cap - 1)))
    accept(outbox, "k1", ses="s1")
    assert r.llen(outbox.keys.wake) == cap
    assert r.lindex(outbox.keys.wake, -1) == f"{WS} s1"
    accept(outbox, "k2", ses="s2")
    assert r.llen(outbox.keys.wake) == cap
    assert r.lindex(outbox.keys.wake, -1) == f"{WS} s1"


@pytest.mark.standalone  # the global attention index of a standalone server
def test_a_model_that_looks_like_state_needs_no_operator(outbox, r):
    """Only an entry's state members decide whether its session needs an operator's eye
    (docs/howto/observe.md): a pending entry waiting out its backoff whose client model
    holds "status": "error" does not."""
    model = {"providerID": "p", "modelID": "m", "status": "error"}
    seed(outbox, attempts=1, next_attempt_at=format_time(NOW + 60_000_000), model=model)
    assert call(outbox, "claim", "tok", 30_000)[0] == "idle"
    assert r.zrange(outbox.keys.attention, 0, -1) == []
    seed(outbox, status="error", reason="max_attempts", attempts=5)
    assert call(outbox, "claim", "tok", 30_000)[0] == "idle"
    assert r.zrange(outbox.keys.attention, 0, -1) == [f"{WS} {SES}"]


def test_an_error_entry_whose_model_looks_pending_leaves_the_session_free(outbox):
    """if_busy="reject" refuses only while something is pending, in flight or being
    verified (docs/howto/steering.md#busy-sessions): an error entry waits for a person, so
    its client model holding "status": "pending" does not make the session busy."""
    model = {"providerID": "p", "modelID": "m", "status": "pending"}
    seed(outbox, status="error", reason="max_attempts", attempts=5, model=model)
    entry = accept(outbox, "k1", if_busy="reject")
    assert entry.mode == "reject"
    with pytest.raises(SessionBusy):
        accept(outbox, "k2", if_busy="reject")


def test_entries_stored_without_a_sequence_number_go_back_in_accepted_order(outbox, r):
    """Entries an older version stored carry no seq: recovery puts a staged one back by
    its acceptedAt instead, in front of the first entry accepted after it."""
    keys = outbox.keys.session(WS, SES)

    first, second, third = (
        stored_entry(NOW - 3),
        stored_entry(NOW - 2, "delivering"),
        stored_entry(NOW - 1),
    )
    assert "seq" not in second.to_json()
    r.rpush(keys.queue, first.to_json(), third.to_json())
    r.rpush(keys.staging, second.to_json())
    assert call(outbox, "claim", "new", 30_000)[0] == "deliver"  # the first, pending
    order = [Entry.from_json(raw) for raw in r.lrange(keys.queue, 0, -1)]
    assert [(e.id, e.status) for e in order] == [(second.id, "verifying"), (third.id, "pending")]


def test_a_claim_that_expires_the_head_reports_it_and_moves_the_version(outbox):
    """A head past its expiresAt ends expired in the claim that finds it: the claim's reply
    carries it (watchers are told from it) under a new session version, even when nothing
    is left to deliver (docs/howto/steering.md#expiry)."""
    e = seed(outbox, expires_at=format_time(NOW - 1))
    before = call(outbox, "snapshot")[0]
    answer = call(outbox, "claim", "tok", 30_000)
    assert answer[0] == "idle" and answer[2] == before + 1
    [ended] = [Entry.from_json(raw) for raw in answer[4:]]
    assert (ended.id, ended.status) == (e.id, "expired")


def test_recovery_keeps_a_delivered_entry_whose_signal_is_still_owed(outbox, r):
    """Recovering a gone holder's staging moves its undelivered entries back to the queue
    as verifying; a delivered one whose entry_delivered is still owed stays staged for the
    next claimer to fire (docs/explanation/lifecycle.md, "What happens to a message")."""
    keys = outbox.keys.session(WS, SES)
    done = seed(outbox, status="delivering", accepted=NOW - 2)
    seed(outbox, status="delivering", accepted=NOW - 1)
    first = r.lindex(keys.staging, 0)
    delivered = Entry.from_json(first).evolve(delivered_at=format_time(NOW)).to_json()
    r.lset(keys.staging, 0, delivered)
    answer = call(outbox, "recover")
    assert answer[0] == "ok" and answer[2] == 1
    assert r.lrange(keys.staging, 0, -1) == [delivered]
    [back] = [Entry.from_json(raw) for raw in r.lrange(keys.queue, 0, -1)]
    assert back.status == "verifying" and back.id != done.id
    claim = call(outbox, "claim", "tok", 30_000)
    assert claim[0] == "owed" and ids(claim[4:]) == [done.id]


def test_recovery_never_queues_an_entry_twice(outbox, r):
    """An entry found both staged and queued (written by an interrupted older version) is
    recovered once: the queue keeps the copy it has."""
    keys = outbox.keys.session(WS, SES)
    e = seed(outbox)
    r.rpush(keys.staging, r.lindex(keys.queue, 0))
    call(outbox, "recover")
    assert ids(r.lrange(keys.queue, 0, -1)) == [e.id]
    assert r.llen(keys.staging) == 0


def test_a_parked_entry_its_holder_left_staged_is_verified_when_released(outbox, r):
    """A workspace parked while a delivery was in flight holds the staged entry parked; if
    its holder is gone, recovery queues it still parked, but released to verification,
    never to a blind resend (docs/explanation/lifecycle.md, "Parking a workspace")."""
    keys = outbox.keys.session(WS, SES)
    e = seed(outbox, status="delivering")
    call(outbox, "park", "maint", 0)
    assert Entry.from_json(r.lindex(keys.staging, 0)).status == "parked"
    call(outbox, "recover")
    [back] = [Entry.from_json(raw) for raw in r.lrange(keys.queue, 0, -1)]
    assert (back.id, back.status, back.parked_from) == (e.id, "parked", "verifying")


def test_the_server_clock_keeps_its_microseconds(outbox):
    """With no injected clock a script reads Valkey's TIME, seconds and microseconds
    (docs/explanation/ordering.md): a timestamp is not cut to the whole second."""
    seen = {call(outbox, "snapshot", now=0)[5] % 1_000_000 for _ in range(5)}
    assert seen != {0}


def test_expired_dedupe_markers_are_pruned_from_the_session_list(make_outbox, r):
    """The markers ZSET only lists marker keys for cleanup; their own PX expires the keys,
    and the expired members are pruned on one accept in sixteen, so the list stays as
    long as the dedupe window's accepts (docs/explanation/storage.md)."""
    clock = [1_764_466_959.0]
    outbox = make_outbox(
        dedupe_ttl=1, user_max_queued=0, user_accepts_per_minute=0, clock=lambda: clock[0]
    )
    markers = outbox.keys.session(WS, SES).markers
    accept(outbox, "k0")
    clock[0] += 2  # k0's marker has expired
    for n in range(1, 17):  # sixteen versions: one of them prunes
        accept(outbox, f"k{n}")
    names = r.zrange(markers, 0, -1)
    assert len(names) == 16 and not any(name.endswith(":k0") for name in names)


async def test_opening_a_counted_socket_again_at_the_bound_is_not_refused(outbox, r):
    """Opening a socket is safe to send twice (a reply lost on the way): a socket already
    counted is counted again, not refused, even when its user holds the bound; a new one
    is refused (docs/reference/websocket.md)."""
    assert await outbox.aopen_socket("alice", "one", ttl=30, limit=2)
    assert await outbox.aopen_socket("alice", "two", ttl=30, limit=2)
    assert await outbox.aopen_socket("alice", "two", ttl=30, limit=2)
    assert not await outbox.aopen_socket("alice", "three", ttl=30, limit=2)
    assert sorted(r.zrange(outbox.keys.sockets("alice"), 0, -1)) == ["one", "two"]
    await outbox.aclose()


class TestShardIndex:
    """index.lua, the cluster shard's half of a HINT (docs/howto/cluster.md), run on its
    own: its KEYS share one hash tag, so any server runs it."""

    KEYS = [f"ix:{{s0}}:{name}" for name in ("wsdue", "ws", "wake", "all", "attn", "attnver")]

    def hint(self, r, *, due=-1, wake=0, attention=-1, new=0, gone=0, version=1, now_ms=5, cap=3):
        text = load_scripts()["index"].text
        args = index_hint_argv(WS, SES, (due, wake, attention, new, gone, 0, version), now_ms, cap)
        return r.eval(text, len(self.KEYS), *self.KEYS, *args)

    def test_the_wake_list_stops_at_the_cap_it_is_given(self, r):
        wake = self.KEYS[2]
        r.rpush(wake, "a", "b")
        self.hint(r, wake=1)
        assert r.llen(wake) == 3
        self.hint(r, wake=1)
        assert r.lrange(wake, 0, -1) == ["a", "b", f"{WS} {SES}"]

    def test_a_replayed_new_session_keeps_when_it_was_first_seen(self, r):
        self.hint(r, new=1, now_ms=5)
        self.hint(r, new=1, now_ms=9)  # a replay reports the session as new again
        assert r.zscore(self.KEYS[3], f"{WS} {SES}") == 5

    def test_a_deleted_session_leaves_the_attention_index(self, r):
        self.hint(r, new=1, attention=1, version=3)
        assert r.zrange(self.KEYS[4], 0, -1) == [f"{WS} {SES}"]
        self.hint(r, gone=1, version=4)
        assert [r.exists(k) for k in self.KEYS[3:]] == [0, 0, 0]

    def test_a_hint_that_empties_the_workspace_asks_for_a_recheck(self, r):
        """Dropping an emptied workspace from the shard's SET races with an accept into a new
        session: the reply asks the caller to re-add it if one appeared meanwhile."""
        text = load_scripts()["index"].text
        args = index_hint_argv(WS, SES, (-1, 0, -1, 0, 1, 1, 2), 5, 3)
        assert r.eval(text, len(self.KEYS), *self.KEYS, *args) == "recheck"
        args = index_hint_argv(WS, SES, (-1, 0, -1, 0, 1, 0, 3), 5, 3)
        assert r.eval(text, len(self.KEYS), *self.KEYS, *args) == "ok"


def test_the_scripts_write_a_state_as_the_python_codec_does(r):
    """Scripts re-encode only the state members, in one fixed order shared with
    core/entry.py (docs/explanation/storage.md): zero counters are left out, and a cut
    entry's interrupted comes before userDigest, which the scripts keep last."""
    body = read_source("lib/entry") + "\nlocal st, content = split(ARGV[1])\n"
    body += "st.holds, st.transientFails = 0, 0\nst.userDigest = ARGV[2]\n"
    body += "return join(st, content)"
    entry = stored_entry(
        status="delivering",
        key="k",
        attempts=1,
        holds=2,
        transient_fails=1,
        interrupted=True,
    )
    stored = entry.evolve(holds=0, transient_fails=0).to_json()
    marker = stored.index(',"clientMessageID":')
    expected = stored[:marker] + ',"userDigest":"d"' + stored[marker:]
    assert r.eval(body, 0, entry.to_json(), "d") == expected


def test_a_replayed_accept_of_an_entry_being_delivered_answers_as_the_first_did(outbox):
    """A resend after a lost reply is answered 'own' with the entry's place (seq) and
    acceptedAt, also once a worker has staged it (docs/explanation/idempotency.md)."""
    e = Entry(id=new_entry_id(), client_message_id="k1", user_id="u", text="t", accepted_at="")
    marker = [outbox.keys.dedupe(WS, SES, "k1")]
    first = call(outbox, "accept", *accept_args(e), extra_keys=marker)
    assert first[0] == "ok"
    assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
    replay = call(outbox, "accept", *accept_args(e), extra_keys=marker)
    assert replay[0] == "own" and (replay[3], replay[4]) == (first[1], first[3])


def test_a_claim_refused_by_a_lease_moves_the_session_to_the_lease_expiry(outbox, r):
    """A claimer that finds another holder's lease reindexes the session: a stale early
    score becomes the lease's expiry, so workers stop looking before then."""
    seed(outbox)
    assert call(outbox, "claim", "a", 30_000)[0] == "deliver"
    due = outbox.keys.session(WS, SES).due
    r.zadd(due, {SES: NOW // 1000})  # stale: as if an older index said "due now"
    assert call(outbox, "claim", "b", 30_000)[0] == "busy"
    assert r.zscore(due, SES) > NOW // 1000 + 29_000


@pytest.mark.standalone  # the global attention index of a standalone server
def test_a_session_needing_attention_keeps_the_time_it_started_to(outbox, r):
    """The attention index is scored by when the session first needed an eye (the admin
    shows how long it has waited): later reindexes leave that time alone."""
    seed(outbox, accepted=NOW - 2)
    assert call(outbox, "claim", "a", 30_000)[0] == "deliver"
    seed(outbox, accepted=NOW - 1)  # pending behind the lease
    assert r.zscore(outbox.keys.attention, f"{WS} {SES}") == NOW // 1000
    assert call(outbox, "claim", "b", 30_000, now=NOW + 5_000_000)[0] == "busy"
    assert r.zscore(outbox.keys.attention, f"{WS} {SES}") == NOW // 1000


def test_cleanup_reports_only_the_entries_it_takes_from_their_sender(outbox):
    """Cleanup answers with the entries it removed before they were delivered (watchers
    are told they are gone); a delivered one whose signal was still owed is not among
    them: it reached the agent (docs/howto/valkey.md)."""
    delivered = seed(outbox, accepted=NOW - 2)
    waiting = seed(outbox, accepted=NOW - 1)
    assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
    assert settle(outbox, "tok", delivered.id, "delivered")[0] == "removed"
    done = call(outbox, "cleanup")
    assert done[0] == "done" and ids(done[4:]) == [waiting.id]


TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(("text", "preview"), [("abcdef", 3), ("abc", 3), ("ab", 3)])
def test_a_preview_keeps_the_members_after_the_text(outbox, text, preview):
    """A snapshot's preview cuts only the text; the rest of each entry is as stored
    (README "Admin"), the trace context of an entry without a model included."""
    seed(outbox, key="k1", text=text, traceparent=TRACEPARENT)
    _, [raw], *_ = call(outbox, "snapshot", preview)
    shown = Entry.from_json(raw)
    assert (shown.text, shown.traceparent) == (text[:preview], TRACEPARENT)
