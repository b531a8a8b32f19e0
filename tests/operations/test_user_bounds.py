"""Per-user bounds (README "Security" → "Per-user bounds"): a user's queued
entries across the sessions of a workspace and accepts per minute are bounded, exactly
and atomically with the accept, and every path that removes an entry frees its count."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from redis.cluster import key_slot

from django_outbox import LEDGER_STATE_TURN_ENDED, DismissResult, Entry, Status, Verdict
from django_outbox.conf import outbox_settings
from django_outbox.core.config import Config, ConfigError
from django_outbox.core.entry import format_time, new_entry_id
from django_outbox.core.keys import user_digest
from django_outbox.core.service import Outbox
from django_outbox.errors import (
    Duplicate,
    OutboxError,
    OutboxFull,
    OutboxUnavailable,
    RateLimited,
)
from django_outbox.testing import ValkeyServer, wait_until
from tests.support.helpers import aaccept, accept
from tests.support.paths import ROOT

WS, SES = "w1", "s1"
TEXT = "x" * 40_000
T0 = 1_764_466_959.0  # seconds: a frozen clock for the rate tests


def count(r, user: str, ws: str = WS) -> int:
    """The user's queued entries in the workspace, as the bound counts them."""
    state = r.hget(f"outboxusers:{{{ws}}}", user_digest(user))
    return int(state.split()[0]) if state else 0


def noop(entry, *, workspace_id, session_id, attempt):
    return None


def step(outbox, deliverer=None, ses=SES) -> bool:
    """One adeliver_once from sync code, closing the loop's client before the loop ends."""

    async def main():
        try:
            return await outbox.adeliver_once(WS, ses, deliverer=deliverer)
        finally:
            await outbox.aclose()

    return asyncio.run(main())


def frozen(start: float = T0):
    """A settable clock: ``clock[0]`` is now, in seconds."""
    now = [start]
    return now, lambda: now[0]


def snapshot(r) -> dict:
    return {k: r.dump(k) for k in r.keys("*")}


# --- as reported ---------------------------------------------------------------------


@pytest.mark.standalone
def test_as_reported_one_user_cannot_fill_valkey_for_another_workspace(tmp_path):
    # A 40 MB Valkey and the default settings: mallory queues 40 KB prompts into session
    # after session of her workspace. She is refused (429) long before the server fills,
    # and a user of another workspace still gets through.
    with ValkeyServer(tmp_path / "valkey", maxmemory="40mb") as server:
        outbox = Outbox(url=server.url)
        client = redis.Redis.from_url(server.url)
        try:
            refused = None
            for i in range(2000):  # 80 MB: twice what the server holds
                try:
                    outbox.accept(
                        "team-a",
                        f"s{i // 25}",
                        user_id="mallory",
                        client_message_id=f"k{i}",
                        text=TEXT,
                    )
                except OutboxError as exc:
                    refused = exc
                    break
            assert isinstance(refused, OutboxFull | RateLimited), refused  # a 429
            used = client.info("memory")["used_memory"]
            assert used < 20 * 1024 * 1024
            for i in range(2000, 2500):  # she keeps trying: every attempt is refused whole
                with pytest.raises((OutboxFull, RateLimited)):
                    outbox.accept(
                        "team-a", f"t{i}", user_id="mallory", client_message_id=f"k{i}", text=TEXT
                    )
            assert client.info("memory")["used_memory"] < used + 1024 * 1024
            outbox.accept("team-b", "s0", user_id="bob", client_message_id="k0", text=TEXT)
        finally:
            outbox.close()
            client.close()


def test_as_reported_dismissing_does_not_let_a_user_accept_without_end(outbox):
    # Dismiss frees the session's CAP at once; every accept still leaves a marker for
    # DEDUPE_TTL, so the accept rate is bounded too (default settings).
    refused = None
    for i in range(200):
        try:
            entry = outbox.accept(WS, SES, user_id="mallory", client_message_id=f"k{i}", text="t")
        except OutboxError as exc:
            refused = exc
            break
        outbox.dismiss(WS, SES, entry.id)
    assert refused is not None and not isinstance(refused, OutboxUnavailable), refused


@pytest.mark.standalone
@pytest.mark.parametrize("bound", ["queued", "rate"])
def test_each_bound_alone_holds_before_valkey_fills(tmp_path, bound):
    # With only one bound on, a user's worst (40 KB prompts into new sessions; or accept
    # and dismiss at once) stays within what that bound promises: queued entries
    # x entry size, or accepts x (marker + session) bytes. The other workspace's user
    # gets through.
    settings = (
        {"user_max_queued": 100, "user_accepts_per_minute": 0}
        if bound == "queued"
        else {"user_max_queued": 0, "user_accepts_per_minute": 30}
    )
    with ValkeyServer(tmp_path / "valkey", maxmemory="40mb") as server:
        outbox = Outbox(url=server.url, **settings)
        client = redis.Redis.from_url(server.url)
        try:
            before = client.info("memory")["used_memory"]
            accepted = 0
            for i in range(2000):
                try:
                    entry = outbox.accept(
                        "team-a",
                        f"s{i // 25}" if bound == "queued" else f"s{i}",
                        user_id="mallory",
                        client_message_id=f"k{i}",
                        text=TEXT,
                    )
                except (OutboxFull, RateLimited) as exc:
                    assert isinstance(exc, OutboxFull if bound == "queued" else RateLimited)
                    break
                accepted += 1
                if bound == "rate":
                    outbox.dismiss("team-a", f"s{i}", entry.id)
            grown = client.info("memory")["used_memory"] - before
            held = sum(client.memory_usage(k) or 0 for k in client.keys("*{team-a}*"))
            if bound == "queued":
                assert accepted == 100
                assert held < 100 * 42_000  # a queued 40 KB prompt, and its marker
                assert grown < 100 * 50_000  # with the allocator's rounding
            else:
                assert accepted == 30
                assert held < 30 * 1_000  # markers and sessions, not the prompts
                assert grown < 4 * 1024 * 1024
            outbox.accept("team-b", "s0", user_id="bob", client_message_id="k0", text=TEXT)
        finally:
            outbox.close()
            client.close()


# --- the queued-entries bound --------------------------------------------------------


def test_a_user_cannot_queue_more_than_user_max_queued_across_sessions(make_outbox, r):
    outbox = make_outbox(user_max_queued=5, user_accepts_per_minute=0)
    for i in range(5):
        accept(outbox, f"k{i}", ses=f"s{i % 3}")
    with pytest.raises(OutboxFull) as info:
        accept(outbox, "k5", ses="s9")  # a new session does not help
    assert (info.value.scope, info.value.cap) == ("user", 5)
    assert "5 entries queued in the workspace" in str(info.value)
    assert count(r, "u") == 5
    assert outbox.list(WS, "s9") == []
    # the session CAP still answers as before
    small = make_outbox(cap=1, user_max_queued=5)
    with pytest.raises(OutboxFull) as info:
        accept(small, "k6", ses="s0")
    assert (info.value.scope, info.value.cap) == ("session", 1)


def test_two_users_are_independent(make_outbox, r):
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=2)
    accept(outbox, "a1", user="alice")
    accept(outbox, "a2", user="alice")
    with pytest.raises(OutboxFull):
        accept(outbox, "a3", user="alice")
    # bob shares alice's session and workspace, not her bound
    accept(outbox, "b1", user="bob")
    accept(outbox, "b2", user="bob", ses="s2")
    assert (count(r, "alice"), count(r, "bob")) == (2, 2)
    assert len(outbox.list(WS, SES)) == 3


def test_the_bound_is_per_workspace(make_outbox):
    # Exact per (workspace, user): README "Per-user bounds" says what that means across
    # workspaces.
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0)
    accept(outbox, "k1")
    accept(outbox, "k2")
    with pytest.raises(OutboxFull):
        accept(outbox, "k3")
    accept(outbox, "k3", ws="w2")


def test_errors_and_parked_entries_count_until_they_leave(make_outbox, r):
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0, max_attempts=1)
    accept(outbox, "k1")

    def fails(entry, **kwargs):
        raise RuntimeError("no")

    assert step(outbox, fails)
    assert outbox.list(WS, SES)[0].status is Status.ERROR
    outbox.park_workspace(WS, "maintenance")
    accept(outbox, "k2")  # held as parked, and counted
    with pytest.raises(OutboxFull):
        accept(outbox, "k3")
    assert count(r, "u") == 2


# --- every removal path frees the count ----------------------------------------------


def fill_to_bound(outbox, r, n=2):
    entries = [accept(outbox, f"k{i}") for i in range(n)]
    with pytest.raises(OutboxFull):
        accept(outbox, "over")
    assert count(r, "u") == n
    return entries


def test_a_delivered_entry_frees_its_count(make_outbox, r, signals_log):
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0)
    first, _ = fill_to_bound(outbox, r)
    assert step(outbox, noop)
    assert signals_log.ids("delivered") == [first.id]
    assert count(r, "u") == 1
    accept(outbox, "over")
    with pytest.raises(OutboxFull):
        accept(outbox, "more")


async def test_a_delivered_entry_frees_its_count_before_its_signal_is_acknowledged(make_outbox, r):
    # The settle marks the entry delivered; a worker that stops before its release
    # leaves it staged with its signal owed, and it no longer counts for its user.
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0)
    first, _ = fill_to_bound(outbox, r)
    took, carry = await outbox.astep(WS, SES, noop)  # and never released
    assert took and carry == (carry[0], [first.id])
    assert r.llen("outboxd:{w1}:s1") == 1  # staged, delivered, signal owed
    assert count(r, "u") == 1
    await aaccept(outbox, "over")
    await outbox.aclose()


def test_a_dismissed_entry_frees_its_count(make_outbox, r):
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0)
    first, _ = fill_to_bound(outbox, r)
    assert outbox.dismiss(WS, SES, first.id) is DismissResult.REMOVED
    assert outbox.dismiss(WS, SES, first.id) is DismissResult.NOT_FOUND  # counted out once
    assert count(r, "u") == 1
    accept(outbox, "over")


def test_a_cancelled_prompt_frees_its_count(make_outbox, r):
    """Cancel takes a queued prompt out as dismiss does: it stops counting towards
    ``USER_MAX_QUEUED``, once, and the user may queue another (docs/howto/steering.md#cancel)."""
    from django_outbox import CancelResult

    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0)
    first, _ = fill_to_bound(outbox, r)
    assert outbox.cancel(WS, SES, first.id) is CancelResult.REMOVED
    assert outbox.cancel(WS, SES, first.id) is CancelResult.NOT_FOUND  # counted out once
    assert count(r, "u") == 1
    accept(outbox, "over")


def test_cleanup_frees_every_count_and_the_rate(make_outbox, r):
    _, clock = frozen()
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=3, clock=clock)
    accept(outbox, "a", ses="s1")
    accept(outbox, "b", ses="s2")
    accept(outbox, "c", ses="s2", user="bob")
    with pytest.raises(OutboxFull):
        accept(outbox, "d", ses="s3")
    assert outbox.cleanup_workspace(WS) >= 8
    assert [k for k in r.keys("*") if "{w1}" in k] == []
    # both counts are free, and so is the rate (one accept of three was left)
    accept(outbox, "a", ses="s1")
    accept(outbox, "b", ses="s2")
    assert count(r, "u") == 2


def test_a_ledger_completed_entry_frees_its_count(make_outbox, r, signals_log):
    def probe(**kwargs):
        return LEDGER_STATE_TURN_ENDED

    def fails(entry, **kwargs):
        raise RuntimeError("no")

    outbox = make_outbox(
        user_max_queued=2, user_accepts_per_minute=0, ledger_probe=probe, max_attempts=1
    )
    first, _ = fill_to_bound(outbox, r)
    assert step(outbox, fails)
    assert count(r, "u") == 2  # an error entry still counts
    assert outbox.sweep_workspace_parked_errors(WS) == 1
    assert count(r, "u") == 1
    accept(outbox, "over")
    assert step(outbox, noop)  # fires the owed signal
    assert signals_log.ids("delivered")[0] == first.id
    assert count(r, "u") == 2  # firing the owed signal counts nothing out again


@pytest.mark.parametrize("then", ["verified", "dismissed"])
def test_a_dead_holders_entry_frees_its_count_once_recovered_and_delivered(
    make_outbox, r, valkey, then
):
    # A worker SIGKILLed mid-delivery leaves the entry staged (still counted); once its
    # lease expires it is recovered as verifying, then verified delivered, or dismissed.
    outbox = make_outbox(
        user_max_queued=2,
        user_accepts_per_minute=0,
        verifier=lambda entry, **kwargs: Verdict.DELIVERED,
        verify_delay=0,
    )
    first = accept(outbox, "m1")
    accept(outbox, "m2")
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.children.crash", valkey, WS, SES, "1.0", "m1"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        wait_until(lambda: "m1:started" in r.lrange("test:log", 0, -1), 20)
    finally:
        child.kill()
        child.wait(10)
    assert count(r, "u") == 2
    wait_until(lambda: not r.exists("outboxlock:{w1}:s1"), 5, message="lease expires")
    if then == "dismissed":  # straight from the dead holder's staging
        assert outbox.dismiss(WS, SES, first.id) is DismissResult.REMOVED
    else:
        assert outbox.recover() == 1
        assert outbox.list(WS, SES)[0].status is Status.VERIFYING
        assert count(r, "u") == 2
        assert step(outbox, noop)  # verified: delivered (the verifier decides)
        assert [e.id for e in outbox.list(WS, SES)] != [first.id]
    assert count(r, "u") == 1
    accept(outbox, "over")


def test_seeded_entries_are_not_counted_and_counts_never_go_negative(make_outbox, r):
    outbox = make_outbox(user_max_queued=1, user_accepts_per_minute=0)
    entry = Entry(
        id=new_entry_id(),
        client_message_id="seeded",
        user_id="u",
        text="t",
        accepted_at=format_time(int(T0 * 1_000_000)),
    )
    outbox.seed_entry_for_test(WS, SES, entry.to_json())
    assert count(r, "u") == 0
    accept(outbox, "k1")
    assert outbox.dismiss(WS, SES, entry.id) is DismissResult.REMOVED
    assert count(r, "u") == 1  # the seeded entry was never counted in, nor out
    assert step(outbox, noop)
    assert not r.exists("outboxusers:{w1}")  # zero counts are deleted


def test_a_drifted_count_is_repaired_when_the_workspace_is_cleaned(make_outbox, r):
    # Counts change only inside the scripts that add and remove entries, so no crash
    # can drift them; an entry removed by hand can. cleanup_workspace starts over.
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=0)
    fill_to_bound(outbox, r)
    r.delete("outboxq:{w1}:s1")  # by hand, behind the outbox's back
    with pytest.raises(OutboxFull):
        accept(outbox, "over")
    outbox.cleanup_workspace(WS)
    accept(outbox, "k1")
    assert count(r, "u") == 1


# --- accepts per minute --------------------------------------------------------------


def test_accepts_per_minute_is_a_bucket_refilled_over_the_minute(make_outbox, r):
    now, clock = frozen()
    outbox = make_outbox(user_max_queued=0, user_accepts_per_minute=3, clock=clock)
    for i in range(3):  # a burst of 3
        accept(outbox, f"k{i}", ses=f"s{i}")
    with pytest.raises(RateLimited) as info:
        accept(outbox, "k3")
    assert (info.value.retry_after, info.value.limit) == (20, 3)  # one back every 20 s
    now[0] = T0 + 19.5
    with pytest.raises(RateLimited) as info:
        accept(outbox, "k3")
    assert info.value.retry_after == 1
    now[0] = T0 + 20
    accept(outbox, "k3")
    with pytest.raises(RateLimited) as info:
        accept(outbox, "k4")
    assert info.value.retry_after == 20
    now[0] = T0 + 200  # a minute idle: the whole burst again
    for i in range(3):
        accept(outbox, f"later{i}")
    with pytest.raises(RateLimited):
        accept(outbox, "later3")


def test_a_wait_that_is_not_whole_seconds_is_rounded_up(make_outbox, r):
    """7 accepts a minute give one back every 60/7 = 8.57 s: the caller is told 9, since
    one who waits 8 s is refused again."""
    now, clock = frozen()
    outbox = make_outbox(user_max_queued=0, user_accepts_per_minute=7, clock=clock)
    for i in range(7):
        accept(outbox, f"k{i}", ses=f"s{i}")
    with pytest.raises(RateLimited) as info:
        accept(outbox, "k7")
    assert (info.value.retry_after, info.value.limit) == (9, 7)
    now[0] = T0 + 8  # waiting the rounded-down time is not enough
    with pytest.raises(RateLimited) as info:
        accept(outbox, "k7")
    assert info.value.retry_after == 1
    now[0] = T0 + info.value.retry_after + 8
    accept(outbox, "k7")


def test_refused_accepts_do_not_use_up_the_rate(make_outbox, r):
    now, clock = frozen()
    outbox = make_outbox(user_max_queued=0, user_accepts_per_minute=2, clock=clock)
    accept(outbox, "k1")
    for _ in range(5):
        with pytest.raises(Duplicate):  # a resend is answered, never rate limited
            accept(outbox, "k1")
    accept(outbox, "k2")
    with pytest.raises(Duplicate):
        accept(outbox, "k2")
    now[0] = T0 + 29.9
    for _ in range(5):
        with pytest.raises(RateLimited) as info:
            accept(outbox, "k3")
        assert info.value.retry_after == 1
    now[0] = T0 + 30  # one accept back every 30 s, refusals or not
    accept(outbox, "k3")


def test_a_user_with_nothing_queued_and_a_full_bucket_is_forgotten(make_outbox, r):
    now, clock = frozen()
    outbox = make_outbox(user_max_queued=5, user_accepts_per_minute=30, clock=clock)
    entry = accept(outbox)
    assert r.hget("outboxusers:{w1}", user_digest("u")) == f"1 {int((T0 + 2) * 1e6)}"
    outbox.dismiss(WS, SES, entry.id)
    assert count(r, "u") == 0  # nothing queued, but the bucket is not full yet: kept
    entry = accept(outbox, "k2")
    now[0] = T0 + 4  # the bucket is full again when the entry leaves
    outbox.dismiss(WS, SES, entry.id)
    assert not r.exists("outboxusers:{w1}")


@pytest.mark.standalone
@pytest.mark.parametrize("bound", ["user_full", "rate_limited"])
def test_a_refused_accept_writes_nothing(make_outbox, r, bound):
    now, clock = frozen()
    outbox = make_outbox(user_max_queued=2, user_accepts_per_minute=2, clock=clock)
    accept(outbox, "k1")
    if bound == "user_full":
        accept(outbox, "k2", ses="s2")
        now[0] = T0 + 60
    else:
        first = accept(outbox, "k2", ses="s2")
        outbox.dismiss(WS, "s2", first.id)
    before = snapshot(r)
    with pytest.raises(OutboxFull if bound == "user_full" else RateLimited):
        accept(outbox, "k3", ses="s3")
    assert snapshot(r) == before  # no marker, no entry, no count, no rate state


# --- concurrency ---------------------------------------------------------------------


@pytest.mark.parametrize("bound", ["queued", "rate"])
def test_parallel_accepts_by_one_user_never_exceed_the_bound(make_outbox, r, bound):
    # Eight clients, each its own connection pool, race 240 accepts of one user into 24
    # sessions: the check and the count are one script, so exactly the bound gets in.
    _, clock = frozen()
    settings = (
        {"user_max_queued": 37, "user_accepts_per_minute": 0}
        if bound == "queued"
        else {"user_max_queued": 0, "user_accepts_per_minute": 23}
    )
    clients = [make_outbox(clock=clock, **settings) for _ in range(8)]
    start = threading.Barrier(len(clients))

    def run(n: int) -> list[str]:
        outcomes = []
        start.wait()
        for i in range(30):
            try:
                accept(clients[n], f"c{n}-{i}", ses=f"s{(n * 30 + i) % 24}")
                outcomes.append("ok")
            except (OutboxFull, RateLimited) as exc:
                outcomes.append(type(exc).__name__)
        return outcomes

    with ThreadPoolExecutor(len(clients)) as pool:
        outcomes = [o for result in pool.map(run, range(len(clients))) for o in result]
    limit = 37 if bound == "queued" else 23
    assert outcomes.count("ok") == limit
    assert len(outcomes) == 240
    queued = sum(len(clients[0].list(WS, f"s{i}")) for i in range(24))
    assert queued == limit
    assert count(r, "u") == limit


async def test_parallel_async_accepts_never_exceed_the_bound(make_outbox, r):
    outbox = make_outbox(user_max_queued=10, user_accepts_per_minute=0)

    async def one(i):
        try:
            await aaccept(outbox, f"k{i}", ses=f"s{i % 7}")
            return True
        except OutboxFull:
            return False

    results = await asyncio.gather(*(one(i) for i in range(100)))
    assert sum(results) == 10
    assert count(r, "u") == 10
    await outbox.aclose()


# --- Valkey Cluster ------------------------------------------------------------------


@pytest.mark.cluster
async def test_the_bounds_hold_on_a_cluster_with_every_key_in_the_workspace_slot(
    cluster_outbox, monkeypatch
):
    outbox = cluster_outbox(user_max_queued=2, user_accepts_per_minute=3)
    calls: list[tuple[str, list[str]]] = []
    real = outbox._aevalsha

    async def recording(client, name, keys, args):
        calls.append((name, list(keys)))
        return await real(client, name, keys, args)

    monkeypatch.setattr(outbox, "_aevalsha", recording)
    first = await aaccept(outbox, "k1")
    await aaccept(outbox, "k2", ses="s2")
    with pytest.raises(OutboxFull):
        await aaccept(outbox, "k3", ses="s3")
    assert await outbox.adeliver_once(WS, SES, deliverer=noop)
    await aaccept(outbox, "k3", ses="s3")
    assert await outbox.adismiss(WS, "s2", (await outbox.alist(WS, "s2"))[0].id)
    with pytest.raises(RateLimited):  # three accepts within the minute
        await aaccept(outbox, "k4", ses="s4")
    await aaccept(outbox, "b1", user="bob")
    assert [e.id for e in await outbox.alist(WS, SES)] != [first.id]
    assert await outbox.acleanup_workspace(WS) > 0
    await aaccept(outbox, "k4", ses="s4")  # cleanup freed the count and the rate
    names = {name for name, _ in calls}
    assert {"accept", "claim", "settle_delivered", "dismiss", "cleanup"} <= names
    for name, keys in calls:
        if name != "index":
            assert len({key_slot(k.encode()) for k in keys}) == 1, (name, keys)
    await outbox.aclose()


# --- the API ---------------------------------------------------------------------------


@pytest.fixture
def staff_client(django_user_model):
    from rest_framework.test import APIClient

    client = APIClient()
    client.force_login(
        django_user_model.objects.create_user("root", is_staff=True, is_superuser=True)
    )
    return client


def post(client, cmid: str, ses: str = "s1"):
    url = f"/outbox/api/workspaces/alice/sessions/{ses}/messages/"
    return client.post(
        url, json.dumps({"clientMessageID": cmid, "text": "hi"}), content_type="application/json"
    )


@pytest.mark.standalone  # the test settings' outbox is a standalone one
@pytest.mark.django_db
def test_api_user_bound_429_with_retry_after_and_scope(staff_client):
    with override_settings(OUTBOX={"USER_MAX_QUEUED": 2, "USER_ACCEPTS_PER_MINUTE": 0}):
        assert post(staff_client, "a").status_code == 202
        assert post(staff_client, "b", "s2").status_code == 202
        response = post(staff_client, "c", "s3")
        assert response.status_code == 429
        assert response["Retry-After"] == "30"
        data = response.json()
        assert (data["code"], data["scope"]) == ("outbox_full", "user")
        assert "2 queued messages in this workspace" in data["detail"]
        assert post(staff_client, "a").status_code == 200  # a resend still answers


@pytest.mark.standalone  # the test settings' outbox is a standalone one
@pytest.mark.django_db
def test_api_session_cap_429_says_its_scope(staff_client):
    with override_settings(OUTBOX={"CAP": 1}):
        assert post(staff_client, "a").status_code == 202
        response = post(staff_client, "b")
        assert response.status_code == 429
        assert (response.json()["code"], response.json()["scope"]) == ("outbox_full", "session")


@pytest.mark.standalone  # the test settings' outbox is a standalone one
@pytest.mark.django_db
def test_api_rate_limited_429_with_the_seconds_to_wait(staff_client, r):
    with override_settings(OUTBOX={"USER_ACCEPTS_PER_MINUTE": 2}):
        assert post(staff_client, "a").status_code == 202
        assert post(staff_client, "b").status_code == 202
        before = snapshot(r)
        response = post(staff_client, "c")
        assert response.status_code == 429
        assert response["Retry-After"] in ("29", "30")  # one accept back every 30 s
        assert response.json()["code"] == "rate_limited"
        assert "2 messages to this workspace within a minute" in response.json()["detail"]
        assert snapshot(r) == before


@pytest.mark.standalone  # the test settings' outbox is a standalone one
@pytest.mark.django_db
def test_api_retry_after_rounds_a_fractional_wait_up(staff_client):
    """At 7 a minute the wait is 8.57 s: ``Retry-After`` says 9 (8 would be refused)."""
    with override_settings(OUTBOX={"USER_ACCEPTS_PER_MINUTE": 7, "USER_MAX_QUEUED": 0}):
        started = time.monotonic()
        for i in range(7):
            assert post(staff_client, f"k{i}", f"s{i}").status_code == 202
        response = post(staff_client, "k7")
        elapsed = time.monotonic() - started
        assert response.status_code == 429
        assert response.json()["code"] == "rate_limited"
        # 60/7 s less the time the burst took, rounded up: 9 on any machine that sent
        # the burst within half a second
        assert math.ceil(60 / 7 - elapsed) <= int(response["Retry-After"]) <= 9
        if elapsed < 0.5:
            assert response["Retry-After"] == "9"


@pytest.mark.standalone  # the test settings' outbox is a standalone one
@pytest.mark.django_db
def test_api_entries_do_not_show_the_user_digest(staff_client, r):
    entry = post(staff_client, "a").json()
    assert "userDigest" not in entry
    listed = staff_client.get("/outbox/api/workspaces/alice/sessions/s1/messages/").json()
    assert "userDigest" not in listed["entries"][0]
    [raw] = r.lrange("outboxq:{alice}:s1", 0, -1)
    assert json.loads(raw)["userDigest"] == user_digest(entry["userID"])


# --- settings ------------------------------------------------------------------------


def test_defaults_and_zero_or_none_turn_a_bound_off(make_outbox):
    config = Config()
    assert (config.user_max_queued, config.user_accepts_per_minute) == (100, 30)
    off = Config.from_mapping({"user_max_queued": None, "user_accepts_per_minute": 0})
    assert (off.user_max_queued, off.user_accepts_per_minute) == (0, 0)
    outbox = make_outbox(user_max_queued=None, user_accepts_per_minute=None, cap=1000)
    for i in range(150):
        accept(outbox, f"k{i}")


@pytest.mark.parametrize("value", [-1, 1.5, "30", True])
@pytest.mark.parametrize("key", ["USER_MAX_QUEUED", "USER_ACCEPTS_PER_MINUTE"])
def test_an_invalid_bound_is_a_config_error_and_a_system_check(key, value):
    with pytest.raises(ConfigError, match=key):
        Config.from_mapping({key.lower(): value})
    with override_settings(OUTBOX={key: value}):
        with pytest.raises(ImproperlyConfigured, match=key):
            outbox_settings()
        errors = checks.run_checks(tags=["outbox"])
        assert [e.id for e in errors if key in e.msg] == ["django_outbox.E001"]


# --- cost ----------------------------------------------------------------------------


@pytest.mark.standalone
def test_the_bounds_cost_two_commands_per_accept_on_or_off(make_outbox, r):
    # INFO commandstats: an accept into an existing session ran 19.25 commands before the
    # bounds (README "Capacity"); the user's state adds one HGET and one HSET, kept even
    # with both bounds off so that turning one on is exact at once; the per-minute history
    # (README "Dashboard") one HINCRBY into the workspace's HASH and one into the total.
    # Every accept looks for expired dedupe markers to prune (one ZCOUNT; the removal
    # itself, a ZREMRANGEBYRANK, only when there are some: lib/indices.lua prune_markers).
    def commands_per_accept(outbox, ws) -> float:
        accept(outbox, "warm", ws=ws)
        r.config_resetstat()
        for i in range(40):
            accept(outbox, f"k{i}", ws=ws)
        stats = r.info("commandstats")
        skip = ("config",)
        return sum(v["calls"] for n, v in stats.items() if not any(s in n for s in skip)) / 40

    off = commands_per_accept(
        make_outbox(cap=100, user_max_queued=0, user_accepts_per_minute=0), "a"
    )
    on = commands_per_accept(
        make_outbox(cap=100, user_max_queued=100, user_accepts_per_minute=100), "b"
    )
    assert on == off <= 19.25, (off, on)
