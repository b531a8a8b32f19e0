"""accept(): dedupe, cap, bad input, Valkey failures (README "The Python API");
seed_entry_for_test(), which goes through the same accept script."""

import contextlib
import json
import time

import pytest
import redis

from django_outbox import Entry, Status
from django_outbox.core.entry import format_time, new_entry_id
from django_outbox.core.keys import dedupe_marker, user_digest
from django_outbox.core.scripts import accept_argv
from django_outbox.errors import (
    Duplicate,
    IdempotencyConflict,
    InvalidIdentifier,
    OutboxFull,
    OutboxUnavailable,
)
from tests.support.helpers import aaccept, accept
from tests.support.hostile import HOSTILE_MODEL, HOSTILE_TEXT
from tests.support.valkey import ValkeyProcess, free_port, wait_until


def test_accept_returns_pending_entry_and_lists_it(outbox):
    entry = accept(outbox, user="u1", model={"provider": "x"})
    assert entry.status is Status.PENDING and entry.attempts == 0
    assert entry.user_id == "u1" and entry.client_message_id == "k1"
    assert outbox.list("w1", "s1") == [entry]


def test_content_round_trips_exactly_through_valkey(outbox, r):
    accept(outbox, text=HOSTILE_TEXT, model=HOSTILE_MODEL)
    listed = outbox.list("w1", "s1")[0]
    assert listed.text.encode() == HOSTILE_TEXT.encode()
    assert listed.model == HOSTILE_MODEL
    stored = r.lrange("outboxq:{w1}:s1", 0, -1)[0]
    assert '"big":12345678901234567' in stored and '"a":[]' in stored and '"b":{}' in stored


def test_fifo_order(outbox):
    ids = [accept(outbox, key=f"k{i}", text=f"m{i}").id for i in range(5)]
    assert [e.id for e in outbox.list("w1", "s1")] == ids


def test_user_id_may_be_an_int(outbox):
    assert outbox.accept("w1", "s1", user_id=7, client_message_id="k", text="t").user_id == "7"


def test_duplicate_answers_the_original_id(outbox):
    first = accept(outbox)
    with pytest.raises(Duplicate) as info:
        accept(outbox)
    assert info.value.accepted_id == first.id
    assert len(outbox.list("w1", "s1")) == 1


def test_duplicate_ignores_model_key_order(outbox):
    first = accept(outbox, model={"a": 1, "b": 2})
    with pytest.raises(Duplicate) as info:
        accept(outbox, model={"b": 2, "a": 1})
    assert info.value.accepted_id == first.id


def test_same_key_other_text_or_model_conflicts_and_keeps_the_original(outbox):
    first = accept(outbox, text="a")
    with pytest.raises(IdempotencyConflict):
        accept(outbox, text="b")
    with pytest.raises(IdempotencyConflict):
        accept(outbox, text="a", model={"m": 1})
    assert [e.text for e in outbox.list("w1", "s1")] == ["a"]
    assert outbox.list("w1", "s1")[0].id == first.id


def test_keys_are_scoped_per_session(outbox):
    # k4 used in ws1/s1, ws1/s2 and ws2/s1 -> three separate entries
    ids = {
        accept(outbox, ws=ws, ses=ses, key="k4").id
        for ws, ses in [("w1", "s1"), ("w1", "s2"), ("w2", "s1")]
    }
    assert len(ids) == 3


def test_cap(make_outbox, r):
    outbox = make_outbox(cap=2)
    accept(outbox, key="a")
    accept(outbox, key="b")
    with pytest.raises(OutboxFull):
        accept(outbox, key="c")
    assert r.get("outboxdedupe:{w1}:s1:c") is None
    # a refused key is free: once there is room the same key is accepted
    outbox.dismiss("w1", "s1", outbox.list("w1", "s1")[0].id)
    assert accept(outbox, key="c").client_message_id == "c"


def test_dismissed_keys_stay_deduplicated(outbox):
    # dismiss m1, POST its key again within DEDUPE_TTL -> the original ID, nothing new
    first = accept(outbox)
    outbox.dismiss("w1", "s1", first.id)
    with pytest.raises(Duplicate) as info:
        accept(outbox)
    assert info.value.accepted_id == first.id
    assert outbox.list("w1", "s1") == []


def test_cleanup_frees_keys(outbox):
    # accept k1, cleanup_workspace, accept k1 again -> accepted as new
    first = accept(outbox)
    assert outbox.cleanup_workspace("w1") > 0
    again = accept(outbox)
    assert again.id != first.id


def test_too_large_then_valid_with_the_same_key(outbox, r):
    # POST k2 with text too large, then k2 with valid text -> accepted
    with pytest.raises(ValueError, match="102401 UTF-8 bytes"):
        accept(outbox, key="k2", text="x" * 102_401)
    assert r.keys("*") == []
    assert accept(outbox, key="k2", text="x" * 102_400).text == "x" * 102_400


BAD_CONTENT = [
    dict(text=""),
    dict(text="😀" * 30_000),
    dict(text="\udc80 lone"),
    dict(text=None),
    dict(text=["x"]),
    dict(text="ok", model="gpt"),
    dict(text="ok", model=["a"]),
    dict(text="ok", model={"x": "y" * 20_000}),
    dict(text="ok", key=""),
    dict(text="ok", key="x" * 129),
    dict(text="ok", key="new\nline"),
    dict(text="ok", user_id=None),
]


@pytest.mark.parametrize("kwargs", BAD_CONTENT)
def test_bad_content_raises_value_error_and_writes_nothing(outbox, r, kwargs):
    kwargs = dict(kwargs)
    user_id = kwargs.pop("user_id", "u1")
    with pytest.raises(ValueError):
        outbox.accept(
            "w1", "s1", user_id=user_id, client_message_id=kwargs.pop("key", "k"), **kwargs
        )
    assert r.keys("*") == []


@pytest.mark.parametrize(
    ("ws", "ses"),
    [
        ("a}:{b", "c"),
        ("a", "b}:{c"),
        ("a:b", "c"),
        ("a", "b:c"),
        ("s1\n", "s"),
        ("", "s"),
        ("x" * 300, "s"),
        ("*", "s"),
        ("[x]", "s"),
        ("w", "*"),
    ],
)
def test_identifiers_that_could_alias_keys_are_refused(outbox, r, ws, ses):
    with pytest.raises(InvalidIdentifier):
        outbox.accept(ws, ses, user_id="u", client_message_id="k", text="t")
    with pytest.raises(InvalidIdentifier):
        outbox.list(ws, ses)
    assert r.keys("*") == []


def test_cleanup_never_acts_as_a_pattern(outbox):
    accept(outbox)
    with pytest.raises(InvalidIdentifier):
        outbox.cleanup_workspace("*")
    assert len(outbox.list("w1", "s1")) == 1


def test_unreachable_valkey_is_unavailable():
    from django_outbox.outbox import Outbox

    outbox = Outbox(url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(OutboxUnavailable):
        accept(outbox)
    outbox.close()


def test_down_then_back_accepts_the_same_key(tmp_path):
    # POST k3 while Valkey is down (503), again after it is back -> 202
    from django_outbox.outbox import Outbox

    server = ValkeyProcess(tmp_path).start()
    outbox = Outbox(url=server.url)
    try:
        server.stop()
        with pytest.raises(OutboxUnavailable):
            accept(outbox, key="k3")
        server.start()
        assert accept(outbox, key="k3").client_message_id == "k3"
    finally:
        outbox.close()
        server.stop()


def test_out_of_memory_is_unavailable_and_writes_nothing(tmp_path):
    # a noeviction Valkey at maxmemory refuses the accept; nothing is stored
    from django_outbox.outbox import Outbox

    server = ValkeyProcess(tmp_path).start()
    outbox = Outbox(url=server.url)
    client = redis.Redis.from_url(server.url)
    try:
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 200_000)
        with pytest.raises(redis.OutOfMemoryError):
            for i in range(100_000):
                client.set(f"filler:{i}", "x" * 1000)
        keys_before = client.dbsize()
        with pytest.raises(OutboxUnavailable, match=r"(?i)memory"):
            accept(outbox, text="x" * 5000)
        assert client.dbsize() == keys_before
        assert client.keys("outbox*") == []
        client.config_set("maxmemory", 0)
        assert accept(outbox, text="x" * 5000).text == "x" * 5000
    finally:
        client.close()
        outbox.close()
        server.stop()


def test_lost_reply_replay_recognises_its_own_write(outbox, r):
    # a lost reply at the script level: running the very same accept twice is not a duplicate
    entry = accept(outbox)
    keys = outbox.keys.session("w1", "s1")
    raw = r.lrange(keys.queue, 0, -1)[0]
    name = dedupe_marker(entry.user_id, "k1")
    marker_key = outbox.keys.dedupe("w1", "s1", name)
    fingerprint = r.get(marker_key).split()[1]
    argv = accept_argv(raw, entry.id, fingerprint, 25, 60_000, name, user_digest(entry.user_id))
    again = outbox.run_script("accept", "w1", "s1", argv, extra_keys=[marker_key])
    assert again[0] == b"own"
    assert r.llen(keys.queue) == 1


def test_wait_aof_refused_without_aof_is_unavailable_but_accepted(make_outbox, r):
    outbox = make_outbox(wait_aof=True, wait_timeout=0.2)
    with pytest.raises(OutboxUnavailable) as info:
        accept(outbox)
    assert info.value.accepted is True
    with pytest.raises(Duplicate):
        accept(outbox)


def test_wait_aof_with_aof_on(tmp_path):
    from django_outbox.outbox import Outbox

    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="everysec").start()
    outbox = Outbox(url=server.url, wait_aof=True)
    try:
        assert accept(outbox).status is Status.PENDING
    finally:
        outbox.close()
        server.stop()


@pytest.mark.standalone
def test_wait_replicas_without_replicas_is_unavailable(make_outbox):
    outbox = make_outbox(wait_replicas=1, wait_timeout=0.1)
    with pytest.raises(OutboxUnavailable, match="replicas"):
        accept(outbox)


@pytest.mark.standalone
async def test_an_unreplicated_claim_does_not_reach_the_agent(make_outbox):
    """With WAIT_REPLICAS the claim must reach the replicas before the agent is called:
    a claim lost in a failover would make the entry look untried and it would be
    sent again unverified. Unacknowledged, the entry goes back pending as a
    failure in which nothing was attempted (transientFails), and nothing is sent."""
    sent = []

    async def deliver(entry, **kwargs):
        sent.append(entry.id)

    outbox = make_outbox(wait_replicas=1, wait_timeout=0.05, retry_backoff=0)
    with pytest.raises(OutboxUnavailable) as caught:
        await outbox.aaccept("w1", "s1", user_id="u", client_message_id="k", text="t")
    assert caught.value.accepted
    assert await outbox.adeliver_once("w1", "s1", deliver)
    [entry] = await outbox.alist("w1", "s1")
    assert sent == []
    assert (entry.status, entry.transient_fails, entry.attempts) == (Status.PENDING, 1, 0)
    assert "did not acknowledge the claim" in entry.last_error
    await outbox.aclose()


async def test_async_twin(outbox):
    entry = await outbox.aaccept("w1", "s1", user_id="u", client_message_id="k", text="t")
    assert [e.id for e in await outbox.alist("w1", "s1")] == [entry.id]
    with pytest.raises(Duplicate):
        await outbox.aaccept("w1", "s1", user_id="u", client_message_id="k", text="t")
    await outbox.aclose()


def test_entry_json_on_the_wire_parses(outbox):
    entry = accept(outbox)
    assert json.loads(json.dumps(entry.to_dict()))["id"] == entry.id


# --- seed_entry_for_test: a harness's way in, through the same accept script ----------


async def test_a_malformed_seed_is_refused_and_a_failed_head_stays_in_valkey(make_outbox, r):
    """Seeding checks the stored entry's types (strict), so the queue never holds an
    entry the scripts cannot split, and a failed delivery puts its entry back.

    The interleaving that once lost a message: settle.lua removed the staged entry
    (LREM staging) *before* insert_ordered() decoded the other queue entries; when one
    of them could not be split, the script raised after the LREM and Valkey does not
    roll back: the message was in neither list. seed_entry_for_test accepted a state
    member holding an object (Entry.from_dict checked no types for
    reason/lastError/parkedFrom); with a "clientMessageID" member inside it, split()
    cut the entry there and cjson failed. Claim still worked (strict find_head stops
    at the first due entry), so: accept A; seed B (later, malformed); claim A; the
    delivery fails; settle errors.
    """

    async def failing(entry, **kwargs):
        raise RuntimeError("agent said 500")

    outbox = make_outbox()
    a = await aaccept(outbox, "A")
    b = {
        "id": new_entry_id(),
        "status": "error",
        "reason": {"code": "x", "clientMessageID": "y"},
        "acceptedAt": format_time(int((time.time() + 1) * 1_000_000)),
        "clientMessageID": "B",
        "userID": "u",
        "text": "B",
    }
    with pytest.raises(ValueError, match="reason must be a string"):
        await outbox.aseed_entry_for_test("w1", "s1", json.dumps(b))  # refused, nothing stored
    assert [e.id for e in await outbox.alist("w1", "s1")] == [a.id]
    with contextlib.suppress(Exception):
        await outbox.adeliver_once("w1", "s1", deliverer=failing)
    await outbox.aclose()
    keys = outbox.keys.session("w1", "s1")
    stored = r.lrange(keys.queue, 0, -1) + r.lrange(keys.staging, 0, -1)
    assert any(json.loads(raw)["id"] == a.id for raw in stored), "A vanished from Valkey"


async def test_seeding_an_entry_id_already_queued_is_refused_so_it_is_delivered_once(
    make_outbox, signals_log
):
    """seed_entry_for_test refuses an entry ID that is already queued: one entry ID is
    delivered, and fires entry_delivered, once.

    What it once did: it pushed the JSON as-is without checking that its ID was new
    (accept.lua with cap=0 skips every check), so the same entry could be in the queue
    twice - or in staging and the queue. Each copy was claimed, delivered and settled
    on its own: the deliverer got the same entry twice and entry_delivered fired twice
    for one entry ID. (The crash-recovery code dedupes by ID, recover_staged(); seeding
    did not.)
    """
    outbox = make_outbox()
    raw = Entry(
        id=new_entry_id(),
        client_message_id="k1",
        user_id="u",
        text="once",
        accepted_at=format_time(int(time.time() * 1_000_000)),
        status=Status.PENDING,
    ).to_json()
    await outbox.aseed_entry_for_test("w1", "s1", raw)
    with pytest.raises(ValueError, match="already queued"):
        await outbox.aseed_entry_for_test("w1", "s1", raw)  # a harness re-seeding the same fixture
    sent = []

    async def deliver(entry, **kwargs):
        sent.append(entry.id)

    for _ in range(4):
        await outbox.adeliver_once("w1", "s1", deliverer=deliver)
    await outbox.aclose()
    assert len(sent) == 1 and len(signals_log.ids("delivered")) == 1


def test_the_model_allow_list_refuses_other_models(make_outbox):
    """``models`` (``OUTBOX["MODELS"]``): None takes any valid selector; a tuple of
    names or patterns takes only what matches; an empty one takes no model at all."""
    from django_outbox.errors import ModelNotAllowed
    from tests.support.helpers import SES, WS

    sonnet = {"providerID": "anthropic", "modelID": "claude-sonnet-4"}
    open_outbox = make_outbox(models=None)
    accept(open_outbox, "a", model={"providerID": "x", "modelID": "y"})
    strict = make_outbox(models=("anthropic/*",))
    accept(strict, "b", model=sonnet)
    with pytest.raises(ModelNotAllowed) as refused:
        accept(strict, "c", model={"providerID": "openai", "modelID": "gpt-5"})
    assert isinstance(refused.value, ValueError) and refused.value.name == "openai/gpt-5"
    with pytest.raises(ModelNotAllowed):
        accept(make_outbox(models=()), "d", model=sonnet)
    accept(make_outbox(models=()), "e")  # no model: always taken
    assert [e.client_message_id for e in strict.list(WS, SES)] == ["a", "b", "e"]


@pytest.mark.standalone
def test_wait_replicas_met_exactly_by_one_live_replica_is_acknowledged(tmp_path):
    # WAIT_REPLICAS = 1 with exactly one replica linked: the accept is acknowledged,
    # not answered 503 (the bound is "at least", docs/howto/valkey.md).
    from django_outbox.outbox import Outbox

    primary = ValkeyProcess(tmp_path / "primary").start()
    replica = ValkeyProcess(tmp_path / "replica").start()
    client = redis.Redis.from_url(replica.url, decode_responses=True)
    outbox = Outbox(url=primary.url, wait_replicas=1, wait_timeout=5)
    try:
        client.replicaof("127.0.0.1", primary.port)
        wait_until(lambda: client.info("replication").get("master_link_status") == "up")
        assert accept(outbox).status is Status.PENDING
    finally:
        outbox.close()
        client.close()
        replica.stop()
        primary.stop()


def test_a_users_counts_are_kept_under_the_24_digit_digest_of_its_id(outbox, r):
    # The digest names the user's dedupe markers and its field of the workspace's users
    # HASH: its width is part of the stored layout, so a new width would orphan every
    # marker and count written before an upgrade.
    import hashlib

    outbox.accept("w1", "s1", user_id="alice", client_message_id="k", text="t")
    digest = hashlib.sha256(b"alice").hexdigest()[:24]
    assert list(r.hkeys(outbox.keys.users("w1"))) in ([digest], [digest.encode()])
    assert r.exists(f"{outbox.keys.prefix}dedupe:{{w1}}:s1:{digest}:k")


def test_wait_aof_on_a_server_that_never_fsyncs_is_unavailable_but_accepted(tmp_path):
    # appendonly yes but appendfsync no: the server writes its AOF and leaves the fsync to
    # the OS, so WAITAOF answers "0 fsynced locally" and the accept, stored, is not
    # acknowledged as durable (docs/howto/valkey.md#what-each-setting-keeps).
    from django_outbox.outbox import Outbox

    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="no").start()
    client = redis.Redis.from_url(server.url, decode_responses=True)
    outbox = Outbox(url=server.url, wait_aof=True, wait_timeout=0.2)
    try:
        # The AOF the server makes as it starts is fsynced once; after it, nothing is.
        persistence = client.info("persistence")
        wait_until(lambda: not int(client.info("persistence")["aof_rewrite_in_progress"]))
        assert persistence["aof_enabled"] == 1
        with contextlib.suppress(OutboxUnavailable):
            accept(outbox, "warm-up")
        with pytest.raises(OutboxUnavailable, match="AOF") as info:
            accept(outbox)
        assert info.value.accepted is True
        with pytest.raises(Duplicate):
            accept(outbox)
    finally:
        outbox.close()
        client.close()
        server.stop()
