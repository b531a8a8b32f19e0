"""A test agent for worker processes, recording everything in Valkey.

The deliverer persists the message before "the turn" (like opencode): it adds
the entry ID to ``test:sent`` and logs ``<ses> <text>`` to ``test:log``, then
sleeps ``OUTBOX_TEST_TURN`` seconds. The verifier reads ``test:sent`` — so a
worker killed mid-turn is verified, never blindly resent. One-in-flight per
session is checked with ``test:inflight:<ses>`` (holder PID and entry): a second
delivery while a *live* process holds it is recorded in ``test:violations``.
``OUTBOX_TEST_FAULTS`` ("fail=0.1,ambiguous=0.1,transient=0.1") injects faults.

Only the first line of a text is logged (the fault suite sends 40 KB prompts whose first
line is their number). ``OUTBOX_TEST_RECORDER_URL`` sends every record to another Valkey
(the fault suite's full server refuses the agent's own writes); it defaults to the outbox's.
With ``OUTBOX_TEST_CALLS`` set, every call is also logged to ``test:calls`` as
``"<deliver|verify> <ses> <entry> <attempt> <pid> <Valkey time, us> <outcome>"`` (outcome:
``transient``, ``fail`` or ``sent`` for a delivery, ``-`` for a verification).
"""

from __future__ import annotations

import asyncio
import os
import random

import redis.asyncio

from django_outbox import Verdict
from django_outbox.errors import AmbiguousError, TransientDeliveryError

_clients: dict[int, redis.asyncio.Redis] = {}


def _recorder_url() -> str:
    return os.environ.get("OUTBOX_TEST_RECORDER_URL") or os.environ["OUTBOX_VALKEY_URL"]


def _client() -> redis.asyncio.Redis:
    loop = asyncio.get_running_loop()
    key = id(loop)
    if key not in _clients:
        _clients[key] = redis.asyncio.Redis.from_url(_recorder_url())
    return _clients[key]


#: Appends ARGV[1] .. " " .. the server's time (us) .. " " .. ARGV[2] to KEYS[1].
_STAMPED = """
local t = redis.call('TIME')
return redis.call('RPUSH', KEYS[1], ARGV[1] .. ' ' .. t[1] .. string.format('%06d', t[2])
  .. ' ' .. ARGV[2])
"""


async def _log_call(kind: str, entry, session_id: str, attempt, outcome: str) -> None:
    if os.environ.get("OUTBOX_TEST_CALLS"):
        what = f"{kind} {session_id} {entry.id} {attempt} {os.getpid()}"
        await _client().eval(_STAMPED, 1, "test:calls", what, outcome)


def _faults() -> dict[str, float]:
    spec = os.environ.get("OUTBOX_TEST_FAULTS", "")
    return {k: float(v) for k, v in (p.split("=") for p in spec.split(",") if p)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def deliver(entry, *, workspace_id, session_id, attempt):
    r = _client()
    faults = _faults()
    roll = random.random()
    if roll < faults.get("transient", 0):
        await _log_call("deliver", entry, session_id, attempt, "transient")
        raise TransientDeliveryError("injected: connection refused")
    roll -= faults.get("transient", 0)
    if roll < faults.get("fail", 0):
        await _log_call("deliver", entry, session_id, attempt, "fail")
        raise RuntimeError("injected: HTTP 500")
    roll -= faults.get("fail", 0)
    await _log_call("deliver", entry, session_id, attempt, "sent")
    key = f"test:inflight:{session_id}"
    me = f"{os.getpid()} {entry.id}"
    holder = await r.get(key)
    if holder is not None:
        pid = int(holder.split()[0])
        if pid != os.getpid() and _alive(pid):
            await r.rpush("test:violations", f"{session_id}: {me} while {holder.decode()}")
    await r.set(key, me)
    async with r.pipeline(transaction=True) as persist:  # the agent persists atomically
        persist.sadd("test:sent", entry.id)
        for text in entry.parts or (entry.text,):  # every prompt of a merged delivery
            persist.rpush("test:log", f"{session_id} {text.partition(chr(10))[0]}")
        await persist.execute()
    try:
        await asyncio.sleep(float(os.environ.get("OUTBOX_TEST_TURN", "0")))
        if roll < faults.get("ambiguous", 0):
            raise AmbiguousError("injected: connection cut mid-turn")
    finally:
        if (await r.get(key) or b"").decode() == me:
            await r.delete(key)


deliver.outbox_capabilities = frozenset({"merge"})  # it logs every part of a merged delivery


async def deliver_text_only(entry, *, workspace_id, session_id, attempt):
    """A deliverer written before merging existed: it sends ``entry.text`` alone and
    declares no ``outbox_capabilities``, so merge prompts for it are refused at accept."""
    await _client().rpush("test:log", f"{session_id} {entry.text}")


async def verify(entry, *, workspace_id, session_id):
    await _log_call("verify", entry, session_id, "-", "-")
    sent = await _client().sismember("test:sent", entry.id)
    return Verdict.DELIVERED if sent else Verdict.ABSENT


def record_delivered(sender, entry, **kwargs):
    """Records ``"<entry ID> <deliveredAt>"`` in ``test:delivered`` (and the ID in
    ``test:interrupted`` for an entry whose turn was cut). While the recording Valkey
    restarts (the steering row restarts it) it tries again for up to 10 s."""
    import time

    import redis as sync_redis

    client = sync_redis.Redis.from_url(_recorder_url())
    try:
        for _ in range(200):
            try:
                with client.pipeline(transaction=True) as record:
                    record.rpush("test:delivered", f"{entry.id} {entry.delivered_at}")
                    if getattr(entry, "interrupted", False):  # delivered, its turn cut
                        record.rpush("test:interrupted", entry.id)
                    record.execute()
                return
            except sync_redis.ConnectionError:
                time.sleep(0.05)
    finally:
        client.close()


async def noop(entry, *, workspace_id, session_id, attempt):
    """A deliverer that delivers instantly and writes nothing (OUTBOX_TEST_DELIVERER)."""


async def fail_first(entry, *, workspace_id, session_id, attempt):
    """Fails attempt 1 and delivers attempt 2; records ``"<attempt> <Valkey time, us>"``
    in ``test:attempts`` (Valkey's clock: the worker's own may be skewed on purpose)."""
    r = _client()
    seconds, micros = await r.time()
    await r.rpush("test:attempts", f"{attempt} {seconds * 1_000_000 + micros}")
    if attempt == 1:
        raise RuntimeError("injected: the first attempt fails")


async def deliver_until_aborted(entry, *, workspace_id, session_id, attempt):
    """A turn that never ends on its own (opencode without a model): records the entry in
    ``test:sent`` (and ``test:log``) as :func:`deliver` does, then runs until :func:`abort`
    sets ``test:aborted:<ses>`` (OUTBOX_TEST_DELIVERER; docs/howto/cutting.md)."""
    r = _client()
    await r.delete(f"test:aborted:{session_id}")
    async with r.pipeline(transaction=True) as persist:
        persist.sadd("test:sent", entry.id)
        persist.rpush("test:log", f"{session_id} {entry.text.partition(chr(10))[0]}")
        await persist.execute()
    while not await r.exists(f"test:aborted:{session_id}"):
        await asyncio.sleep(0.01)


async def abort(entry, *, workspace_id, session_id):
    """OUTBOX["ABORTER"] of the test agent: ends the session's turn and records
    ``"<pid> <entry>"`` in ``test:aborts`` (and the entry ID in ``test:aborted-ids``), in
    one transaction; while the store restarts it tries again for up to 5 s, then fails."""
    r = _client()
    for _ in range(100):
        try:
            async with r.pipeline(transaction=True) as record:
                record.set(f"test:aborted:{session_id}", 1)
                record.rpush("test:aborts", f"{os.getpid()} {entry.id}")
                record.sadd("test:aborted-ids", entry.id)
                await record.execute()
            return
        except redis.exceptions.ConnectionError:
            await asyncio.sleep(0.05)
    raise RuntimeError("the agent's store is unavailable: the turn was not aborted")


#: What :func:`deliver_abortable` persists, atomically: ARGV[2] (the entry ID) in
#: ``test:sent``, ``"<ses> <entry ID>"`` in ``test:received``, and the same in
#: ``test:after-cut`` when :func:`abort` was called for that entry before (a cut entry
#: sent again).
_RECEIVE = """
redis.call('SADD', 'test:sent', ARGV[2])
redis.call('RPUSH', 'test:received', ARGV[1] .. ' ' .. ARGV[2])
if redis.call('SISMEMBER', 'test:aborted-ids', ARGV[2]) == 1 then
  redis.call('RPUSH', 'test:after-cut', ARGV[1] .. ' ' .. ARGV[2])
end
"""


async def deliver_abortable(entry, *, workspace_id, session_id, attempt):
    """A turn of ``OUTBOX_TEST_TURN`` seconds that :func:`abort` ends early (the fault
    suite's steering row, docs/howto/cutting.md), after a random 0 to
    ``OUTBOX_TEST_SEND_DELAY`` seconds of "connecting" (a cut then stops the send). Persists
    before the turn, as :func:`deliver` does: the entry ID in ``test:sent`` and
    ``"<ses> <entry ID>"`` in ``test:received`` (every message the agent got, in order; in
    ``test:after-cut`` too when its turn was aborted before), and checks one in flight per
    session the same way (``test:violations``). It answers as an honest agent whose store
    is restarting: transient before anything is taken, ambiguous when the persisting
    write's answer is lost; once persisted, the turn goes on."""
    r = _client()
    key = f"test:inflight:{session_id}"
    me = f"{os.getpid()} {entry.id}"
    try:
        holder = await r.get(key)
        if holder is not None:
            pid = int(holder.split()[0])
            if pid != os.getpid() and _alive(pid):
                await r.rpush("test:violations", f"{session_id}: {me} while {holder.decode()}")
        await r.set(key, me)
        await r.delete(f"test:aborted:{session_id}")
    except redis.exceptions.RedisError as exc:
        raise TransientDeliveryError(f"agent store unavailable: {exc}") from exc
    try:
        # Connecting: a cut that lands here stops the send; the agent never has the message.
        delay = float(os.environ.get("OUTBOX_TEST_SEND_DELAY", "0"))
        await asyncio.sleep(random.uniform(0, delay))
        try:
            await r.eval(_RECEIVE, 0, session_id, entry.id)
        except redis.exceptions.RedisError as exc:
            raise AmbiguousError(f"agent store: {exc}") from exc
        deadline = asyncio.get_running_loop().time() + float(os.environ["OUTBOX_TEST_TURN"])
        while asyncio.get_running_loop().time() < deadline:
            try:
                if await r.exists(f"test:aborted:{session_id}"):
                    return  # the turn ended by the abort: the agent has the message
            except redis.exceptions.RedisError:
                pass  # the turn goes on
            await asyncio.sleep(0.01)
    finally:  # the turn ends when the in-flight mark is gone (the store may be restarting)
        for _ in range(200):
            try:
                if (await r.get(key) or b"").decode() == me:
                    await r.delete(key)
                break
            except redis.exceptions.RedisError:
                await asyncio.sleep(0.05)
