"""Outbox.arun: the delivery loop in one process (README "The worker")."""

import asyncio
import logging
import time

import pytest

from django_outbox import Status, Verdict
from django_outbox.errors import AmbiguousError
from tests.support.helpers import NO_USER_BOUNDS, BlockingDeliverer, wait_for

WS = "w1"


async def test_run_delivers_fifo_per_session_in_parallel(make_outbox):
    log = []
    active = {}
    peak_per_session = 0
    peak_total = 0

    async def deliver(entry, *, workspace_id, session_id, attempt):
        nonlocal peak_per_session, peak_total
        active[session_id] = active.get(session_id, 0) + 1
        peak_per_session = max(peak_per_session, active[session_id])
        peak_total = max(peak_total, sum(active.values()))
        await asyncio.sleep(0.005)
        log.append((session_id, entry.text))
        active[session_id] -= 1

    outbox = make_outbox(deliverer=deliver)
    for i in range(30):
        await outbox.aaccept(WS, f"s{i % 5}", user_id="u", client_message_id=f"k{i}", text=f"{i}")
    stats = await outbox.arun(once=True, concurrency=8, heartbeat=False)
    assert len(log) == 30 and stats.steps == 30
    for ses in {s for s, _ in log}:
        texts = [int(t) for s, t in log if s == ses]
        assert texts == sorted(texts)
    assert peak_per_session == 1 and peak_total > 1
    await outbox.aclose()


async def test_accept_wakes_an_idle_worker_before_the_tick(make_outbox):
    delivered = asyncio.Event()
    seen = []

    async def deliver(entry, **kwargs):
        seen.append(time.monotonic())
        delivered.set()

    worker_box = make_outbox(deliverer=deliver)
    client_box = make_outbox()
    stop = asyncio.Event()
    run = asyncio.create_task(worker_box.arun(tick=30, stop=stop, heartbeat=False))
    await asyncio.sleep(0.2)  # the worker is idle in BLMPOP
    accepted = time.monotonic()
    await client_box.aaccept(WS, "s1", user_id="u", client_message_id="k", text="t")
    await asyncio.wait_for(delivered.wait(), 5)
    assert seen[0] - accepted < 1.0  # far below the 30 s tick
    stop.set()
    await run
    await worker_box.aclose()
    await client_box.aclose()


async def test_backoff_is_found_by_the_tick(make_outbox):
    calls = []

    async def deliver(entry, **kwargs):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("first try fails")

    outbox = make_outbox(deliverer=deliver, retry_backoff=0.3, max_backoff=1)
    await outbox.aaccept(WS, "s1", user_id="u", client_message_id="k", text="t")
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(tick=0.05, stop=stop, heartbeat=False))
    await wait_for(lambda: _done(outbox), 10, interval=0.005)
    assert len(calls) == 2 and calls[1] - calls[0] >= 0.3
    stop.set()
    await run
    await outbox.aclose()


async def _done(outbox):
    return await outbox.alist(WS, "s1") == []


async def test_stop_lets_in_flight_deliveries_finish_within_grace(make_outbox):
    started = asyncio.Event()
    finished = []

    async def deliver(entry, **kwargs):
        started.set()
        await asyncio.sleep(0.3)
        finished.append(entry.text)

    outbox = make_outbox(deliverer=deliver)
    await outbox.aaccept(WS, "s1", user_id="u", client_message_id="a", text="a")
    await outbox.aaccept(WS, "s1", user_id="u", client_message_id="b", text="b")
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, grace=5, heartbeat=False))
    await started.wait()
    stop.set()
    await run
    assert finished == ["a"]  # the second is not claimed after stop
    assert [e.text for e in await outbox.alist(WS, "s1")] == ["b"]
    await outbox.aclose()


async def test_grace_expiry_cancels_and_the_entry_is_verified_later(make_outbox):
    hang = BlockingDeliverer()  # never released: cancelled when the grace expires

    async def verify(entry, **kwargs):
        return Verdict.DELIVERED

    outbox = make_outbox(deliverer=hang, verifier=verify)
    await outbox.aaccept(WS, "s1", user_id="u", client_message_id="a", text="a")
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop, grace=0.1, heartbeat=False))
    await hang.started.wait()
    stop.set()
    await asyncio.wait_for(run, 5)
    assert (await outbox.alist(WS, "s1"))[0].status is Status.VERIFYING
    await outbox.aclose()


async def test_stale_staging_is_recovered_while_running(make_outbox, r):
    # A dead holder's staged entry comes back when its lease expires, without a restart.
    async def verify(entry, **kwargs):
        return Verdict.DELIVERED

    async def deliver(entry, **kwargs):
        raise AssertionError("must be verified, not resent")

    outbox = make_outbox(deliverer=deliver, verifier=verify, verify_delay=0)
    entry = await outbox.aaccept(WS, "s1", user_id="u", client_message_id="a", text="a")
    await outbox.aload_scripts()
    await outbox._arun(outbox._claim_plan(WS, "s1", "dead-worker"))  # staged under a lease
    r.pexpire("outboxlock:{w1}:s1", 300)
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(tick=0.05, stop=stop, heartbeat=False))
    await wait_for(lambda: _done(outbox), 10, interval=0.005)
    stop.set()
    await run
    assert entry.id
    await outbox.aclose()


async def test_heartbeat_is_published_and_removed(make_outbox, r):
    outbox = make_outbox(deliverer=lambda *a, **k: None)
    stop = asyncio.Event()
    run = asyncio.create_task(outbox.arun(stop=stop))
    await wait_for(lambda: _has_worker(r), 5, interval=0.005)
    (worker_id,) = r.zrange("outboxworkers", 0, -1)
    record = r.get(f"outboxworker:{worker_id}")
    assert '"pid"' in record and '"in_flight"' in record
    stop.set()
    await run
    assert r.zrange("outboxworkers", 0, -1) == []
    await outbox.aclose()


async def lease_owner_while_delivering(outbox, agent: BlockingDeliverer, worker_id: str) -> str:
    """The owner the session's lease names while a worker called ``worker_id`` delivers
    one prompt of ``outbox`` to ``agent`` (its deliverer); the worker is stopped after."""
    from django_outbox.core.worker import Worker

    await outbox.aaccept(WS, "s1", user_id="u", client_message_id="a", text="a")
    stop = asyncio.Event()
    worker = Worker(outbox, None, concurrency=1, tick=30, stop=stop, worker_id=worker_id)
    run = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(agent.started.wait(), 5)
        return (await outbox.asnapshot(WS, "s1")).lease.owner
    finally:
        agent.release()
        stop.set()
        await asyncio.wait_for(run, 10)


async def test_a_lease_names_a_worker_whose_name_has_dots_whole(make_outbox):
    # A worker is named by its host by default, and a host name is often dotted
    # (web-1.example.com): the snapshot's lease names the whole worker, not its first label.
    agent = BlockingDeliverer()
    outbox = make_outbox(deliverer=agent)
    owner = await lease_owner_while_delivering(outbox, agent, "web-1.example.com")
    assert owner == "web-1.example.com"
    await outbox.aclose()


async def _has_worker(r):
    return bool(r.zrange("outboxworkers", 0, -1))


async def test_a_workers_leases_name_the_worker_not_the_shared_outbox(make_outbox):
    # Two workers may share one Outbox: each names itself in its own lease tokens, and
    # neither renames the outbox (whose own steps keep naming the process).
    agent = BlockingDeliverer()
    outbox = make_outbox(deliverer=agent)
    owner = outbox.owner
    assert await lease_owner_while_delivering(outbox, agent, "w-7") == "w-7"
    assert outbox.owner == owner
    await outbox.aclose()


async def test_a_worker_runs_the_registered_duties_beside_the_loop(make_outbox, caplog):
    # Every `interval` seconds, a failed pass logged and the next one on time; at the stop
    # its finish. A once run makes no passes of a duty that is not `burst`, but finishes it.
    from django_outbox.core.duties import Duty
    from django_outbox.core.worker import Worker

    passes, finished = [], []

    async def flaky():
        passes.append(time.monotonic())
        if len(passes) == 1:
            raise RuntimeError("refused")

    async def finish():
        finished.append(len(passes))

    outbox = make_outbox(deliverer=lambda *a, **k: None)
    outbox.duties.append(Duty("flaky", 0.02, flaky, finish=finish))
    stop = asyncio.Event()
    worker = Worker(outbox, None, concurrency=1, tick=30, stop=stop, heartbeat=False)
    with caplog.at_level(logging.WARNING, "django_outbox.worker"):
        run = asyncio.create_task(worker.run())
        await wait_for(lambda: len(passes) >= 3, 5, message="passes go on after a failure")
        stop.set()
        await run
    assert finished == [len(passes)]
    assert f"outbox worker {worker.id}: flaky failed: refused" in caplog.text
    passes.clear()
    finished.clear()
    await Worker(outbox, None, concurrency=1, tick=30, stop=asyncio.Event(), once=True).run()
    assert passes == [] and finished == [0]
    with pytest.raises(ValueError, match="interval"):
        Duty("never", 0, flaky)
    await outbox.aclose()


async def test_ambiguous_then_verified_by_the_loop(make_outbox, signals_log):
    async def deliver(entry, **kwargs):
        raise AmbiguousError("cut")

    async def verify(entry, **kwargs):
        return Verdict.DELIVERED

    outbox = make_outbox(deliverer=deliver, verifier=verify, verify_delay=0)
    entry = await outbox.aaccept(WS, "s1", user_id="u", client_message_id="a", text="a")
    await outbox.arun(once=True, heartbeat=False)
    assert await outbox.alist(WS, "s1") == []
    assert signals_log.ids("delivered") == [entry.id]
    await outbox.aclose()


def test_worker_refuses_a_concurrency_below_one_or_a_tick_of_zero():
    from django_outbox.core.worker import Worker
    from django_outbox.outbox import Outbox

    outbox = Outbox(url="redis://127.0.0.1:1/0", deliverer=lambda *a, **k: None)
    with pytest.raises(ValueError, match="concurrency"):
        Worker(outbox, None, concurrency=0, tick=1, stop=asyncio.Event())
    with pytest.raises(ValueError, match="tick"):
        Worker(outbox, None, concurrency=1, tick=0, stop=asyncio.Event())


@pytest.mark.standalone
async def test_many_concurrent_deliveries_share_a_bounded_pool(make_outbox, signals_log):
    # 300 sessions at once with a pool of 16 connections: callers wait for a
    # connection instead of failing a settle (which would leave a delivered
    # entry to verification, or with no verifier, to an unverifiable error).
    async def deliver(entry, **kwargs):
        await asyncio.sleep(0.01)

    outbox = make_outbox(
        deliverer=deliver, client_options={"max_connections": 16}, **NO_USER_BOUNDS
    )  # "u" stands in for many users
    for i in range(300):
        await outbox.aaccept(WS, f"s{i}", user_id="u", client_message_id="a", text="a")
        await outbox.aaccept(WS, f"s{i}", user_id="u", client_message_id="b", text="b")
    stats = await outbox.arun(once=True, concurrency=300, heartbeat=False)
    assert stats.errors == 0 and stats.steps == 600
    assert len(signals_log.ids("delivered")) == 600
    await outbox.aclose()


async def _idle_then_woken(make_outbox, idle: float, **worker_options) -> int:
    """A worker (tick 30 s) on an outbox made with ``worker_options`` idles ``idle`` seconds,
    then an accept must wake it within 5 s; returns the errors it counted."""
    delivered = asyncio.Event()

    async def deliver(entry, **kwargs):
        delivered.set()

    worker_box = make_outbox(deliverer=deliver, **worker_options)
    client_box = make_outbox()
    stop = asyncio.Event()
    from django_outbox.core.worker import Worker

    worker = Worker(worker_box, None, concurrency=4, tick=30, stop=stop, heartbeat=False)
    run = asyncio.create_task(worker.run())
    await asyncio.sleep(idle)
    await client_box.aaccept(WS, "s1", user_id="u", client_message_id="k", text="t")
    await asyncio.wait_for(delivered.wait(), 5)
    stop.set()
    await run
    await worker_box.aclose()
    await client_box.aclose()
    return worker.stats.errors


async def test_a_long_tick_does_not_time_out_the_wake_wait(make_outbox):
    # BLMPOP must block for less than the client's socket timeout (5 s by default; 3 s here,
    # so the wait below is shorter), whatever the tick.
    socket_timeout = 3.0
    # Idle longer than the socket timeout.
    options = {"client_options": {"socket_timeout": socket_timeout}}
    assert await _idle_then_woken(make_outbox, socket_timeout + 0.5, **options) == 0


@pytest.mark.parametrize("where", ["url", "client_options"])
async def test_an_idle_worker_with_a_short_socket_timeout_counts_no_errors(
    make_outbox, valkey, where
):
    """A socket_timeout shorter than the wake wait's 2 s block (in the URL, docs/howto/
    valkey.md "Timeouts in the URL", or in the client options): the idle worker's waits
    must not time out on the socket and count as errors, and an accept still wakes it."""
    socket_timeout = 0.5
    if where == "url":
        sep = "&" if "?" in valkey else "?"
        options = {"url": f"{valkey}{sep}socket_timeout={socket_timeout}"}
    else:
        options = {"client_options": {"socket_timeout": socket_timeout}}
    # Several waits, and their retries, idle.
    assert await _idle_then_woken(make_outbox, 10 * socket_timeout, **options) == 0


@pytest.mark.standalone
async def test_start_up_waits_for_valkey_to_come_back(tmp_path, make_outbox):
    from tests.support.valkey import ValkeyProcess

    server = ValkeyProcess(tmp_path).start()
    delivered = asyncio.Event()

    async def deliver(entry, **kwargs):
        delivered.set()

    try:  # a failure must not leave the server running past the test
        outbox = make_outbox(url=server.url, deliverer=deliver)
        await outbox.aaccept(WS, "s1", user_id="u", client_message_id="k", text="t")
        server.kill()
        stop = asyncio.Event()
        run = asyncio.create_task(outbox.arun(stop=stop, tick=0.1, heartbeat=False))
        await asyncio.sleep(0.5)  # the worker is retrying its start-up
        assert not run.done()
        await asyncio.to_thread(server.start)  # same port; nothing persisted, so accept again
        await outbox.aaccept(WS, "s1", user_id="u", client_message_id="k", text="t")
        await asyncio.wait_for(delivered.wait(), 10)
        stop.set()
        await run
        await outbox.aclose()
    finally:
        server.stop()


@pytest.mark.standalone  # empties the standalone wake list; 2,500 connections on a cluster
async def test_a_full_scan_page_is_followed_at_once_not_at_the_next_tick(make_outbox, r):
    """A worker starting on a backlog (no wake items, a long tick) reads due sessions in
    pages of SCAN_LIMIT; a page of mostly new work is followed by another scan at once,
    so 2,500 waiting sessions all start within a moment, not one page per tick."""
    from django_outbox.core.worker import SCAN_LIMIT, Worker

    started = set()
    release = asyncio.Event()

    async def deliver(entry, *, session_id, **kwargs):
        started.add(session_id)
        await release.wait()

    outbox = make_outbox(deliverer=deliver, **NO_USER_BOUNDS)  # "u" stands in for many
    sessions = 2 * SCAN_LIMIT + 500
    pipe_calls = [
        outbox.aaccept(WS, f"s{i}", user_id="u", client_message_id="k", text="t")
        for i in range(sessions)
    ]
    await asyncio.gather(*pipe_calls)
    r.delete(outbox.keys.wake)  # only the scan can find them
    stop = asyncio.Event()
    worker = Worker(outbox, None, concurrency=sessions, tick=30, stop=stop, heartbeat=False)
    run = asyncio.create_task(worker.run())
    await wait_for(lambda: len(started) == sessions, timeout=15, interval=0.005)
    assert worker.stats.scans >= 3  # three pages, well before the 30 s tick
    release.set()
    stop.set()
    await run
    await outbox.aclose()


async def test_events_nobody_listens_to_are_not_built(make_outbox, signals_log, monkeypatch):
    """The Django outbox builds an event only for a watched session or a signal with
    receivers: the worker then skips parsing entries just to drop them."""
    from django_outbox.outbox import Outbox as DjangoOutbox

    outbox = make_outbox(deliverer=lambda entry, **kwargs: None)
    assert outbox.listening("delivered", watched=False)  # signals_log is a receiver
    signals_log.close()
    assert not outbox.listening("delivered", watched=False)
    assert outbox.listening("delivered", watched=True)
    seen = []

    async def aemit(self, event):
        seen.append(event.kind)

    monkeypatch.setattr(DjangoOutbox, "aemit", aemit)
    await outbox.aaccept(WS, "s1", user_id="u", client_message_id="k", text="t")
    assert seen == []
    assert await outbox.adeliver_once(WS, "s1")
    assert seen == []
    await outbox.aclose()


@pytest.mark.standalone
async def test_a_busy_worker_leaves_wake_items_for_workers_with_room(make_outbox, r):
    # A worker whose slots are all taken takes no more from the wake list, so
    # several workers share a backlog evenly instead of one hoarding a whole LPOP batch.
    agent = BlockingDeliverer()
    worker_box = make_outbox(deliverer=agent)
    stop = asyncio.Event()
    run = asyncio.create_task(worker_box.arun(tick=30, stop=stop, heartbeat=False, concurrency=1))
    await asyncio.sleep(0.2)  # the worker is idle in BLMPOP
    for i in range(3):
        await worker_box.aaccept(WS, f"s{i}", user_id="u", client_message_id="k", text=f"{i}")
    await asyncio.wait_for(agent.started.wait(), 5)
    await asyncio.sleep(0.2)  # time to (wrongly) take more
    assert r.llen(worker_box.keys.wake) == 2 and agent.calls == ["0"]
    agent.release()
    await wait_for(lambda: len(agent.calls) == 3, message="the rest delivered")
    stop.set()
    await asyncio.wait_for(run, 10)
    await worker_box.aclose()


@pytest.mark.standalone
async def test_a_delivery_nobody_listens_to_costs_one_script(make_outbox, r):
    # With no entry_delivered to fire in between, a delivery is settled together
    # with the session's next claim (settle_next.lua): one script per message, not two.
    delivered = []

    async def deliver(entry, **kwargs):
        delivered.append(entry.text)

    outbox = make_outbox(deliverer=deliver, **NO_USER_BOUNDS)
    for i in range(10):
        await outbox.aaccept(WS, "s1", user_id="u", client_message_id=f"k{i}", text=f"{i}")
    r.config_resetstat()
    stats = await outbox.arun(once=True, concurrency=1, heartbeat=False)
    scripts = r.info("commandstats")["cmdstat_evalsha"]["calls"]
    assert delivered == [str(i) for i in range(10)] and stats.steps == 10
    assert await outbox.alist(WS, "s1") == []
    keys = outbox.keys.session(WS, "s1")
    assert not r.exists(keys.lock, keys.staging, keys.queue)
    # One claim, ten settles that claim the next (the last finds nothing and releases),
    # and four reads of the start-up's recovery and scan: 1 + 10 + 4 (25 before: a
    # settle and a claim per message).
    assert scripts <= 1 + 10 + 4, scripts
    await outbox.aclose()
