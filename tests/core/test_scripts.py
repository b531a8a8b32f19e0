"""Each Lua script on its own against a real valkey-server (README "How it is stored")."""

import json

import pytest

from django_outbox import Entry
from django_outbox.core.entry import format_time, new_entry_id, parse_time
from django_outbox.core.scripts import (
    load_scripts,
    read_source,
    renew_call,
    settle_next_argv,
)
from django_outbox.core.step import RECEIPT_TTL_MS
from tests.support import script_calls
from tests.support.script_calls import NOW, SES, WS, accept_args, call, seed


def test_cjson_damages_content_so_scripts_never_reencode_it(r):
    # The reason content is never decoded and re-encoded in Lua (pinned on this server).
    damaged = r.eval(
        "return cjson.encode(cjson.decode(ARGV[1]))", 0, '{"a":[],"b":12345678901234567}'
    )
    assert damaged != '{"a":[],"b":12345678901234567}'
    assert json.loads(damaged)["a"] == {}


def test_lua_time_functions_match_python(outbox, r):
    body = read_source("lib/time") + "\nreturn {iso(tonumber(ARGV[6])), parse_iso(ARGV[7])}"
    keys = outbox.keys.session(WS, SES).script_keys()
    for us in (0, 86_399_999_999, 951_782_400_000_001, NOW + 123_456, 4_102_444_799_999_999):
        iso, parsed = r.eval(body, len(keys), *keys, 0, NOW, SES, WS, "strict", us, format_time(us))
        assert iso == format_time(us)
        assert parsed == parse_time(format_time(us))


def test_every_script_carries_the_shebang():
    for script in load_scripts().values():
        assert script.text.startswith("#!lua")


class TestAccept:
    @pytest.mark.standalone
    def test_ok_writes_entry_marker_and_indices(self, outbox, r):
        e = Entry(
            id=new_entry_id(),
            client_message_id="k1",
            user_id="u",
            text="hi",
            accepted_at=format_time(NOW),
        )
        marker = outbox.keys.dedupe(WS, SES, "k1")
        # A new session's first version is now (us): above any version it had before.
        assert call(outbox, "accept", *accept_args(e), extra_keys=[marker]) == [
            "ok",
            NOW,
            0,
            format_time(NOW),  # acceptedAt: stamped by the script, on its clock
            "",  # not held: its workspace is not parked
        ]
        keys = outbox.keys.session(WS, SES)
        # seq: accept order; userDigest: counted for the accepting user until it leaves
        stored = (
            e.evolve(seq=NOW)
            .to_json()
            .replace(',"clientMessageID"', ',"userDigest":"u","clientMessageID"')
        )
        assert r.lrange(keys.queue, 0, -1) == [stored]
        assert r.get(marker) == f"{e.id} fp1"
        assert 59_000 < r.pttl(marker) <= 60_000
        assert r.zscore(keys.due, SES) == NOW // 1000
        assert r.zscore(outbox.keys.workspaces_due, WS) == NOW // 1000
        assert r.smembers(keys.sessions) == {SES}
        assert r.smembers(outbox.keys.workspaces) == {WS}
        assert r.zrange(keys.markers, 0, -1) == ["k1"]

    def test_refusals_write_nothing(self, outbox, r):
        e = Entry(
            id=new_entry_id(),
            client_message_id="k1",
            user_id="u",
            text="hi",
            accepted_at=format_time(NOW),
        )
        marker = outbox.keys.dedupe(WS, SES, "k1")
        call(outbox, "accept", *accept_args(e), extra_keys=[marker])
        before = {k: r.dump(k) for k in r.keys("*")}
        other = e.evolve(id=new_entry_id())
        assert call(outbox, "accept", *accept_args(other), extra_keys=[marker]) == [
            "duplicate",
            e.id,
        ]
        assert call(outbox, "accept", *accept_args(other, fp="fp2"), extra_keys=[marker]) == [
            "conflict",
            e.id,
        ]
        assert call(outbox, "accept", *accept_args(e), extra_keys=[marker]) == [
            "own",
            NOW,
            0,
            NOW,
            e.accepted_at,
            "",
        ]
        full = other.evolve(client_message_id="k2")
        m2 = outbox.keys.dedupe(WS, SES, "k2")
        assert call(outbox, "accept", *accept_args(full, cap=1), extra_keys=[m2]) == ["full"]
        assert {k: r.dump(k) for k in r.keys("*")} == before

    def test_an_entry_held_by_a_parked_workspace_is_answered_with_its_reason(self, outbox, r):
        """The caller learns the stored state from the answer (docs/explanation/lifecycle.md,
        "Parking a workspace"): the park reason, on the first answer and on a replay."""
        outbox.park_workspace(WS, "maint")
        e = Entry(
            id=new_entry_id(),
            client_message_id="k1",
            user_id="u",
            text="hi",
            accepted_at=format_time(NOW),
        )
        marker = outbox.keys.dedupe(WS, SES, "k1")
        first = call(outbox, "accept", *accept_args(e), extra_keys=[marker])
        assert (first[0], first[-1]) == ("ok", "maint")
        replay = call(outbox, "accept", *accept_args(e), extra_keys=[marker])
        assert (replay[0], replay[-1]) == ("own", "maint")
        stored = Entry.from_json(r.lindex(outbox.keys.session(WS, SES).queue, 0))
        assert (stored.status, stored.reason) == ("parked", "maint")


class TestClaim:
    def test_idle_when_empty(self, outbox, r):
        assert call(outbox, "claim", "tok", 30_000)[:1] == ["idle"]
        assert not r.exists(outbox.keys.session(WS, SES).lock)

    def test_stages_head_and_takes_lease(self, outbox, r):
        e = seed(outbox)
        kind, raw, version, _ = call(outbox, "claim", "tok", 30_000)
        keys = outbox.keys.session(WS, SES)
        staged = Entry.from_json(raw)
        assert kind == "deliver" and staged.id == e.id and staged.status == "delivering"
        assert staged.last_attempt_at == format_time(NOW)
        assert r.lrange(keys.queue, 0, -1) == [] and r.lrange(keys.staging, 0, -1) == [raw]
        assert r.get(keys.lock).split() == ["tok", str(NOW // 1000), e.id]
        assert r.zscore(keys.due, SES) > NOW // 1000 + 29_000  # looked at again at lease expiry
        assert version == NOW + 1  # seeded at NOW, then staged

    def test_busy_while_another_holds_the_lease(self, outbox):
        seed(outbox)
        call(outbox, "claim", "a", 30_000)
        kind, pttl = call(outbox, "claim", "b", 30_000)
        assert kind == "busy" and 0 < pttl <= 30_000

    def test_same_holder_gets_its_staged_entry_back(self, outbox):
        seed(outbox)
        first = call(outbox, "claim", "a", 30_000)
        again = call(outbox, "claim", "a", 30_000)
        assert again[0] == "deliver" and again[1] == first[1]

    def test_an_acknowledgement_never_drops_an_entry_still_being_delivered(self, outbox):
        """Only a delivered entry is acknowledged away (docs/explanation/lifecycle.md, "What
        happens to a message"): an acknowledgement naming the holder's own staged entry,
        not delivered yet, leaves it staged and handed back."""
        e = seed(outbox)
        first = call(outbox, "claim", "a", 30_000)
        again = call(outbox, "claim", "a", 30_000, e.id)
        assert again[0] == "deliver" and again[1] == first[1]

    def test_verifying_head_is_verified_not_staged(self, outbox, r):
        e = seed(outbox, status="verifying")
        kind, raw, *_ = call(outbox, "claim", "a", 30_000)
        assert kind == "verify" and Entry.from_json(raw).id == e.id
        assert r.llen(outbox.keys.session(WS, SES).queue) == 1

    def test_dead_holders_staging_is_recovered_as_verifying(self, outbox, r):
        e = seed(outbox, status="delivering")
        answer = call(outbox, "claim", "new", 30_000)
        assert answer[0] == "verify" and Entry.from_json(answer[1]).id == e.id
        assert Entry.from_json(answer[4]).status == "verifying"
        assert r.llen(outbox.keys.session(WS, SES).staging) == 0

    def test_strict_head_in_backoff_blocks_later_entries(self, outbox, r):
        later = format_time(NOW + 60_000_000)
        seed(outbox, accepted=NOW - 2, next_attempt_at=later, attempts=1)
        seed(outbox, accepted=NOW - 1)
        assert call(outbox, "claim", "a", 30_000)[0] == "idle"
        assert r.zscore(outbox.keys.session(WS, SES).due, SES) == (NOW + 60_000_000) // 1000

    def test_due_ordering_lets_a_due_entry_pass(self, make_outbox):
        outbox = make_outbox(ordering="due")
        later = format_time(NOW + 60_000_000)
        seed(outbox, accepted=NOW - 2, next_attempt_at=later, attempts=1)
        second = seed(outbox, accepted=NOW - 1)
        kind, raw, *_ = call(outbox, "claim", "a", 30_000)
        assert kind == "deliver" and Entry.from_json(raw).id == second.id

    def test_error_and_parked_entries_never_block(self, outbox):
        seed(outbox, accepted=NOW - 3, status="error", reason="max_attempts")
        seed(outbox, accepted=NOW - 2, status="parked", reason="x", parked_from="pending")
        third = seed(outbox, accepted=NOW - 1)
        kind, raw, *_ = call(outbox, "claim", "a", 30_000)
        assert kind == "deliver" and Entry.from_json(raw).id == third.id


def settle(outbox, token, entry_id, outcome, error="", now=NOW, max_attempts=5):
    return script_calls.settle(
        outbox, token, entry_id, outcome, error, now, max_attempts=max_attempts
    )


class TestSettle:
    def stage(self, outbox, **state):
        e = seed(outbox, **state)
        assert call(outbox, "claim", "tok", 30_000)[0] in ("deliver", "verify")
        return e

    def test_delivered_is_held_until_its_signal_is_acknowledged(self, outbox, r):
        e = self.stage(outbox)
        kind, raw, *_ = settle(outbox, "tok", e.id, "delivered")
        keys = outbox.keys.session(WS, SES)
        done = Entry.from_json(raw)
        assert kind == "removed" and done.id == e.id and done.delivered_at == format_time(NOW)
        assert outbox.list(WS, SES) == []  # gone from the queue at once
        assert r.exists(keys.lock) and r.llen(keys.staging) == 1  # signal owed, lease kept
        # The reply was lost and the holder asks again: it learns it did it.
        assert settle(outbox, "tok", e.id, "delivered") == ["replayed", "removed"]
        assert settle(outbox, "other", e.id, "delivered") == ["lost"]
        assert call(outbox, "release", "tok", e.id) == 1  # acknowledged
        assert not r.exists(keys.lock, keys.staging, keys.queue)
        # Empty, and (seeded) no dedupe marker holds it: due now, to be reclaimed.
        assert r.zscore(keys.due, SES) == NOW // 1000

    def test_owed_signal_goes_to_the_next_claimer(self, outbox, r):
        e = self.stage(outbox)
        settle(outbox, "tok", e.id, "delivered")
        assert call(outbox, "claim", "other", 30_000)[0] == "busy"  # holder still alive
        r.delete(outbox.keys.session(WS, SES).lock)  # the holder died before acknowledging
        answer = call(outbox, "claim", "next", 30_000)
        assert answer[0] == "owed" and Entry.from_json(answer[4]).id == e.id
        assert call(outbox, "release", "next", e.id) == 1
        assert call(outbox, "claim", "next", 30_000)[0] == "idle"

    def test_owed_signal_is_not_recovered_as_verifying(self, outbox, r):
        e = self.stage(outbox)
        settle(outbox, "tok", e.id, "delivered")
        r.delete(outbox.keys.session(WS, SES).lock)
        assert call(outbox, "recover")[2] == 0
        assert r.llen(outbox.keys.session(WS, SES).staging) == 1
        assert call(outbox, "dismiss", e.id, 0)[0] == "not_found"

    @pytest.mark.parametrize(
        ("outcome", "status", "attempts", "transient", "reason"),
        [
            ("failed", "pending", 1, 0, None),
            ("transient", "pending", 0, 1, None),
            ("prior_pending", "pending", 0, 1, None),
            ("ambiguous", "verifying", 0, 0, None),
            ("unverifiable", "error", 0, 0, "unverifiable"),
        ],
    )
    def test_delivery_outcomes(self, outbox, outcome, status, attempts, transient, reason):
        e = self.stage(outbox)
        kind, raw, *_ = settle(outbox, "tok", e.id, outcome, "boom")
        after = Entry.from_json(raw)
        assert kind == "updated"
        assert (after.status, after.attempts, after.transient_fails, after.reason) == (
            status,
            attempts,
            transient,
            reason,
        )
        assert after.last_error == "boom"
        listed = outbox.list(WS, SES)
        assert [x.id for x in listed] == [e.id] and listed[0].status == status

    def test_backoff_doubles_and_caps(self, make_outbox):
        outbox = make_outbox(retry_backoff=10, max_backoff=25)
        e = seed(outbox)
        gates = []
        for n in range(3):
            call(outbox, "claim", "tok", 30_000, now=NOW + n * 100_000_000)
            _, raw, *_ = settle(outbox, "tok", e.id, "failed", now=NOW + n * 100_000_000)
            gates.append(parse_time(Entry.from_json(raw).next_attempt_at) - (NOW + n * 100_000_000))
        assert gates == [10_000_000, 20_000_000, 25_000_000]

    def test_max_attempts_makes_an_error(self, outbox):
        e = self.stage(outbox, attempts=4)
        _, raw, *_ = settle(outbox, "tok", e.id, "failed")
        after = Entry.from_json(raw)
        assert (after.status, after.reason, after.attempts) == ("error", "max_attempts", 5)

    def test_transient_budget(self, make_outbox):
        outbox = make_outbox(max_transient_failures=2)
        e = seed(outbox, transient_fails=1)
        call(outbox, "claim", "tok", 30_000)
        _, raw, *_ = settle(outbox, "tok", e.id, "transient")
        after = Entry.from_json(raw)
        assert (after.status, after.reason, after.attempts) == ("error", "transient_exhausted", 0)

    @pytest.mark.parametrize(
        ("outcome", "status", "attempts", "verify_attempts", "reason"),
        [
            ("delivered", None, None, None, None),
            ("absent", "pending", 1, 0, None),
            ("inconclusive", "verifying", 0, 1, None),
            ("unverifiable", "error", 0, 0, "unverifiable"),
        ],
    )
    def test_verdicts(self, outbox, outcome, status, attempts, verify_attempts, reason):
        e = self.stage(outbox, status="verifying")
        answer = settle(outbox, "tok", e.id, outcome)
        if status is None:
            assert answer[0] == "removed" and outbox.list(WS, SES) == []
            return
        after = Entry.from_json(answer[1])
        assert (after.status, after.attempts, after.verify_attempts, after.reason) == (
            status,
            attempts,
            verify_attempts,
            reason,
        )

    def test_inconclusive_budget(self, make_outbox):
        outbox = make_outbox(max_verify_attempts=3)
        e = seed(outbox, status="verifying", verify_attempts=2)
        call(outbox, "claim", "tok", 30_000)
        _, raw, *_ = settle(outbox, "tok", e.id, "inconclusive")
        assert Entry.from_json(raw).reason == "unverifiable"

    def test_failed_entry_goes_back_in_accept_order(self, outbox):
        first = self.stage(outbox, accepted=NOW - 10)
        second = seed(outbox, accepted=NOW - 5)
        settle(outbox, "tok", first.id, "failed")
        assert [e.id for e in outbox.list(WS, SES)] == [first.id, second.id]

    def test_entry_parked_mid_delivery_stays_parked(self, outbox):
        e = self.stage(outbox)
        assert call(outbox, "park", "mode_transition", 0)[2] == 1
        _, raw, *_ = settle(outbox, "tok", e.id, "ambiguous")
        after = Entry.from_json(raw)
        assert (after.status, after.parked_from, after.reason) == (
            "parked",
            "verifying",
            "mode_transition",
        )


def settle_next(outbox, token, entry_id, *acknowledge, now=NOW):
    args = settle_next_argv(token, entry_id, outbox.config, RECEIPT_TTL_MS, 30_000, acknowledge)
    return call(outbox, "settle_next", *args, now=now)


class TestSettleNext:
    """settle_next.lua: a delivered-settle and the next claim as one transition."""

    def test_records_the_delivery_acknowledges_it_and_stages_the_next(self, outbox, r):
        first = seed(outbox, accepted=NOW - 2)
        second = seed(outbox, accepted=NOW - 1)
        assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
        kind, settled, claimed = settle_next(outbox, "tok", first.id, first.id)
        keys = outbox.keys.session(WS, SES)
        assert kind == "next" and settled[0] == "removed"
        assert Entry.from_json(settled[1]).delivered_at == format_time(NOW)
        assert claimed[0] == "deliver" and Entry.from_json(claimed[1]).id == second.id
        assert claimed[2] == settled[2] + 1  # one version per change, in order
        staged = r.lrange(keys.staging, 0, -1)
        assert [Entry.from_json(x).id for x in staged] == [second.id]  # the first acknowledged
        assert r.get(keys.lock).split() == ["tok", str(NOW // 1000), second.id]
        assert r.llen(keys.queue) == 0
        # The reply was lost and the holder asks again: the same next entry, nothing moved.
        again = settle_next(outbox, "tok", first.id, first.id)
        assert again[1] == ["replayed", "removed"] and again[2][:2] == claimed[:2]
        assert r.lrange(keys.staging, 0, -1) == staged

    def test_the_last_delivery_releases_the_lease(self, outbox, r):
        e = seed(outbox)
        call(outbox, "claim", "tok", 30_000)
        kind, settled, claimed = settle_next(outbox, "tok", e.id, e.id)
        keys = outbox.keys.session(WS, SES)
        assert (kind, settled[0], claimed[0]) == ("next", "removed", "idle")
        assert not r.exists(keys.lock, keys.staging, keys.queue)
        # Empty and no dedupe marker holds it (seeded): the claim reclaimed it at once.
        assert r.zscore(keys.due, SES) is None
        assert not r.sismember(keys.sessions, SES) and not r.exists(keys.version)

    def test_nothing_recorded_claims_nothing(self, outbox, r):
        e = seed(outbox)
        seed(outbox)
        call(outbox, "claim", "tok", 30_000)
        assert settle_next(outbox, "other", e.id, e.id) == ["lost"]
        keys = outbox.keys.session(WS, SES)
        assert r.get(keys.lock).split()[0] == "tok" and r.llen(keys.queue) == 1

    def test_a_holder_that_dies_after_it_leaves_the_next_entry_to_verification(self, outbox, r):
        first = seed(outbox, accepted=NOW - 2)
        second = seed(outbox, accepted=NOW - 1)
        call(outbox, "claim", "tok", 30_000)
        settle_next(outbox, "tok", first.id, first.id)
        r.delete(outbox.keys.session(WS, SES).lock)  # the holder died: its lease expired
        answer = call(outbox, "claim", "new", 30_000)
        # No owed signal (the first was acknowledged); the second may have been sent.
        assert answer[0] == "verify" and Entry.from_json(answer[1]).id == second.id
        assert Entry.from_json(answer[4]).status == "verifying"

    def test_a_settled_entry_the_caller_does_not_acknowledge_stays_owed(self, outbox, r):
        # The settle half takes the entry out of staging at once only when the same call
        # acknowledges it (its entry_delivered has nobody to wait for); otherwise it stays
        # there marked delivered, and the claim half answers that its signal is owed.
        first = seed(outbox, accepted=NOW - 2)
        seed(outbox, accepted=NOW - 1)
        call(outbox, "claim", "tok", 30_000)
        earlier = new_entry_id(NOW // 1000 - 5)  # acknowledged, but not the settled one
        kind, settled, claimed = settle_next(outbox, "tok", first.id, earlier)
        assert (kind, settled[0], claimed[0]) == ("next", "removed", "owed")
        assert Entry.from_json(claimed[4]).id == first.id
        staged = r.lrange(outbox.keys.session(WS, SES).staging, 0, -1)
        assert [Entry.from_json(x).delivered_at for x in staged] == [format_time(NOW)]

    @pytest.mark.standalone
    def test_the_claim_half_reads_nothing_the_settle_half_has_read(self, outbox, r):
        # One transition rather than two scripts back to back: the lease and the
        # staging list are read once, and the settled entry leaves staging without being
        # rewritten there first.
        first = seed(outbox, accepted=NOW - 2)
        seed(outbox, accepted=NOW - 1)
        call(outbox, "claim", "tok", 30_000)
        r.config_resetstat()
        assert settle_next(outbox, "tok", first.id, first.id)[2][0] == "deliver"
        calls = {k.removeprefix("cmdstat_"): v["calls"] for k, v in r.info("commandstats").items()}
        assert calls.get("lset", 0) == 0
        assert calls["lrange"] == 2  # staging, then the queue
        assert calls["get"] == 2  # the lease, then the watchers count

    def test_only_records_deliveries(self, outbox):
        e = seed(outbox)
        call(outbox, "claim", "tok", 30_000)
        args = settle_next_argv("tok", e.id, outbox.config, RECEIPT_TTL_MS, 30_000, [e.id])
        args[2] = "failed"
        with pytest.raises(Exception, match="only records delivered"):
            call(outbox, "settle_next", *args)


class TestRenewAndRelease:
    @pytest.mark.standalone
    def test_renew_extends_only_own_leases(self, outbox, r):
        seed(outbox)
        seed(outbox, ses="s2")
        call(outbox, "claim", "a", 1_000)
        call(outbox, "claim", "b", 1_000, ses="s2")
        k1, k2 = outbox.keys.session(WS, SES), outbox.keys.session(WS, "s2")
        keys, argv = renew_call(
            [outbox.keys.workspaces_due],
            NOW,
            60_000,
            [(k1.lock, k1.due, "a", SES, WS), (k2.lock, k2.due, "not-b", "s2", WS)],
        )
        assert argv == [1, NOW, "", "", "", 60_000, "a", SES, WS, "not-b", "s2", WS]
        result = outbox._evalsha(outbox.client, "renew", keys, argv)
        assert result == [1, 0]
        assert (
            r.zscore(outbox.keys.workspaces_due, WS)
            == r.zrange(k1.due, 0, 0, withscores=True)[0][1]
        )
        assert r.pttl(k1.lock) > 50_000 and r.pttl(k2.lock) <= 1_000
        assert r.zscore(k1.due, SES) == NOW // 1000 + 60_000

    def test_release_is_compare_and_delete(self, outbox, r):
        seed(outbox)
        call(outbox, "claim", "a", 30_000)
        assert call(outbox, "release", "b") == 0
        assert call(outbox, "release", "a") == 1
        assert not r.exists(outbox.keys.session(WS, SES).lock)


class TestSnapshotAndOperate:
    def test_snapshot(self, outbox):
        e = seed(outbox)
        version, queued, staged, lock, pttl, now, ended = call(outbox, "snapshot")
        assert (version, staged, lock, pttl, now, ended) == (NOW, [], None, -2, NOW, [])
        assert Entry.from_json(queued[0]).id == e.id

    def test_retry_and_dismiss_busy_vs_missing(self, outbox):
        e = seed(outbox)
        call(outbox, "claim", "tok", 30_000)
        assert call(outbox, "retry", e.id, "1", 0)[0] == "busy"
        assert call(outbox, "dismiss", e.id, 0)[0] == "busy"
        assert call(outbox, "dismiss", "nope", 0)[0] == "not_found"

    def test_retry_error_unverifiable_goes_to_verifying_with_a_verifier(self, outbox):
        e = seed(outbox, status="error", reason="unverifiable", attempts=2)
        result, _, count, _, raw = call(outbox, "retry", e.id, "1", 0)
        after = Entry.from_json(raw)
        assert (result, count, after.status, after.attempts, after.reason) == (
            "updated",
            1,
            "verifying",
            2,
            None,
        )

    def test_park_unpark_by_reason(self, outbox):
        seed(outbox, accepted=NOW - 2)
        seed(outbox, accepted=NOW - 1, status="verifying")
        assert call(outbox, "park", "a", 0)[2] == 2
        assert call(outbox, "unpark", "b", 0)[2] == 0
        assert call(outbox, "unpark", "a", 0)[2] == 2
        assert [e.status for e in outbox.list(WS, SES)] == ["pending", "verifying"]

    def test_recover_leaves_live_leases_alone(self, outbox):
        seed(outbox)
        call(outbox, "claim", "tok", 30_000)
        assert call(outbox, "recover")[2] == 0

    def test_ledger_ops_check_the_attempt(self, outbox):
        e = seed(outbox, status="error", reason="max_attempts", attempts=5)
        assert call(outbox, "ledger_rearm", e.id, 4, 0)[0] == "busy"
        assert call(outbox, "ledger_rearm", e.id, 5, 0)[0] == "updated"
        assert outbox.list(WS, SES)[0].status == "pending"


@pytest.mark.standalone
def test_cleanup_asks_again_when_markers_arrive(outbox, r):
    e = Entry(
        id=new_entry_id(),
        client_message_id="k1",
        user_id="u",
        text="hi",
        accepted_at=format_time(NOW),
    )
    call(outbox, "accept", *accept_args(e), extra_keys=[outbox.keys.dedupe(WS, SES, "k1")])
    assert call(outbox, "cleanup")[0] == "again"  # told about no markers: one exists
    done = call(outbox, "cleanup", "k1", extra_keys=[outbox.keys.dedupe(WS, SES, "k1")])
    # keys removed, then the session's last version and who watched, then what is gone
    # (its users HASH among them: the accepting user was counted)
    assert done[:4] == ["done", 7, NOW + 1, 0]
    assert [Entry.from_json(raw).id for raw in done[4:]] == [e.id]
    assert r.keys("*") == ["outboxwake"]  # wake-up hints are global, not workspace data


@pytest.mark.standalone
class TestStatuses:
    def test_counts_queued_and_staged_entries_by_stored_status(self, outbox):
        assert call(outbox, "statuses") == []
        seed(outbox)
        seed(outbox, status="error", attempts=1)
        seed(outbox, status="parked", reason="hold", parked_from="pending")
        seed(outbox, status="delivering")
        answer = call(outbox, "statuses")
        counts = dict(zip(answer[::2], answer[1::2], strict=True))
        assert counts == {"pending": 1, "error": 1, "parked": 1, "delivering": 1}

    def test_a_text_that_looks_like_state_is_not_read_as_state(self, outbox):
        text = '"},"status":"error","clientMessageID":"x","text":"'
        outbox.accept(WS, SES, user_id="u", client_message_id="k", text=text)
        assert call(outbox, "statuses") == ["pending", 1]


class TestSnapshotPreview:
    def texts(self, outbox, preview):
        _, queued, *_ = call(outbox, "snapshot", preview)
        return [Entry.from_json(raw) for raw in queued]

    @pytest.mark.parametrize(
        ("text", "preview", "expected"),
        [
            ("abcdef", 3, "abc"),
            ("abc", 3, "abc"),  # exactly the preview: as stored
            ("ab", 3, "ab"),
            ('a"b\\c\nd\u0001e', 8, 'a"b\\c\nd\u0001'),  # an escape is one character
            ("héé😀xyz", 4, "héé😀"),  # a UTF-8 sequence is one character
            (',"model":{"x":1},"text":"no', 12, ',"model":{"x'),
        ],
    )
    def test_texts_are_cut_to_the_first_characters(self, outbox, text, preview, expected):
        model = {"providerID": "p", "modelID": 'm",x'}
        outbox.accept(WS, SES, user_id="u", client_message_id="k1", text=text, model=model)
        outbox.accept(WS, SES, user_id="u", client_message_id="k2", text=text)
        with_model, without = self.texts(outbox, preview)
        assert (with_model.text, without.text) == (expected, expected)
        assert with_model.model == model and without.model is None
        whole = self.texts(outbox, 0)
        assert [e.text for e in whole] == [text, text]

    def test_staged_entries_are_cut_too(self, outbox):
        outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="x" * 50)
        assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
        _, _, staged, *_ = call(outbox, "snapshot", 10)
        assert Entry.from_json(staged[0]).text == "x" * 10


@pytest.mark.standalone  # the global indices of a standalone server
class TestAdminIndices:
    def test_every_session_is_indexed_once_until_cleanup(self, outbox, r):
        seed(outbox)
        seed(outbox)
        seed(outbox, ses="s2")
        assert r.zrange(outbox.keys.all_sessions, 0, -1) == ["w1 s1", "w1 s2"]
        call(outbox, "cleanup")
        assert r.zrange(outbox.keys.all_sessions, 0, -1) == ["w1 s2"]

    @pytest.mark.parametrize("status", ["error", "parked", "verifying"])
    def test_sessions_needing_attention(self, outbox, r, status):
        e = seed(outbox)
        assert r.zrange(outbox.keys.attention, 0, -1) == []
        call(outbox, "claim", "tok", 30_000)
        outcome = {"error": "unverifiable", "verifying": "ambiguous", "parked": "failed"}[status]
        if status == "parked":
            call(outbox, "park", "hold", 0)
        settle(outbox, "tok", e.id, outcome)
        assert r.zrange(outbox.keys.attention, 0, -1) == ["w1 s1"]
        call(outbox, "dismiss", e.id, 0)
        assert r.zrange(outbox.keys.attention, 0, -1) == []

    def test_a_verified_delivery_leaves_attention_at_once(self, outbox, r):
        # The settle moves the entry out of the queue: the session needs no eye any more,
        # even while the lease is still held for the entry_delivered acknowledgement.
        e = seed(outbox, status="verifying")
        assert call(outbox, "claim", "tok", 30_000)[0] == "verify"
        assert r.zrange(outbox.keys.attention, 0, -1) == ["w1 s1"]
        assert settle(outbox, "tok", e.id, "delivered")[0] == "removed"
        assert r.zrange(outbox.keys.attention, 0, -1) == []

    def test_a_delivered_settle_in_staging_leaves_every_index_as_it_was(self, outbox, r):
        # This settle reindexes nothing, so the indices must already be exact.
        first = seed(outbox, accepted=NOW - 2)
        seed(outbox, accepted=NOW - 1)
        assert call(outbox, "claim", "tok", 30_000)[0] == "deliver"
        keys = outbox.keys.session(WS, SES)

        def indices():
            return (
                r.zrange(keys.due, 0, -1, withscores=True),
                r.zrange(outbox.keys.workspaces_due, 0, -1, withscores=True),
                r.zrange(outbox.keys.attention, 0, -1),
                r.zrange(keys.attention, 0, -1),
            )

        before = indices()
        assert before[2] == ["w1 s1"]  # a pending entry waits behind the lease
        assert settle(outbox, "tok", first.id, "delivered", now=NOW + 5_000)[0] == "removed"
        assert indices() == before

    def test_pending_behind_a_lease_is_blocked(self, outbox, r):
        seed(outbox, accepted=NOW - 2)
        call(outbox, "claim", "tok", 30_000)
        assert r.zrange(outbox.keys.attention, 0, -1) == []  # in flight, nothing waits
        seed(outbox, accepted=NOW - 1)
        assert r.zrange(outbox.keys.attention, 0, -1) == ["w1 s1"]

    def test_accept_wakes_a_worker_only_when_due_now(self, outbox, r):
        seed(outbox, accepted=NOW - 2, attempts=1, next_attempt_at=format_time(NOW + 10**7))
        r.delete(outbox.keys.wake)
        e = Entry(
            id=new_entry_id(),
            client_message_id="k",
            user_id="u",
            text="t",
            accepted_at=format_time(NOW),
        )
        call(outbox, "accept", *accept_args(e), extra_keys=[outbox.keys.dedupe(WS, SES, "k")])
        assert r.lrange(outbox.keys.wake, 0, -1) == []  # strict: the head in backoff decides
        e2 = e.evolve(id=new_entry_id(), client_message_id="k2")
        call(
            outbox,
            "accept",
            *accept_args(e2),
            extra_keys=[outbox.keys.dedupe(WS, "s9", "k2")],
            ses="s9",
        )
        assert r.lrange(outbox.keys.wake, 0, -1) == ["w1 s9"]


async def test_a_pipeline_reloads_missing_scripts_and_reruns_only_those_calls(outbox, r):
    """After a restart the server has no scripts: the calls answered NOSCRIPT are sent
    again once their script is loaded; the calls that ran are not sent twice."""
    import inspect

    from django_outbox.core.plans import Cmd, Pipe, iter_once

    outbox.accept(WS, SES, user_id="u", client_message_id="k1", text="t")
    for run in (outbox._run, outbox._arun):
        r.script_flush()
        r.delete("test:ran")
        pipe = Pipe(
            [
                Cmd(("INCR", "test:ran")),
                outbox._session_eval("snapshot", WS, SES),
                Cmd(("INCR", "test:ran")),
            ]
        )
        answers = run(iter_once(pipe))
        if inspect.isawaitable(answers):  # the async driver
            answers = await answers
        assert answers[0] == 1 and answers[2] == 2  # each INCR ran once
        assert int(r.get("test:ran")) == 2
        assert outbox._snapshot_from(answers[1]).entries[0].client_message_id == "k1"
    await outbox.aclose()
