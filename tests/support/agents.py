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
    first_line = entry.text.partition("\n")[0]
    async with r.pipeline(transaction=True) as persist:  # the agent persists atomically
        persist.sadd("test:sent", entry.id)
        persist.rpush("test:log", f"{session_id} {first_line}")
        await persist.execute()
    try:
        await asyncio.sleep(float(os.environ.get("OUTBOX_TEST_TURN", "0")))
        if roll < faults.get("ambiguous", 0):
            raise AmbiguousError("injected: connection cut mid-turn")
    finally:
        if (await r.get(key) or b"").decode() == me:
            await r.delete(key)


async def verify(entry, *, workspace_id, session_id):
    await _log_call("verify", entry, session_id, "-", "-")
    sent = await _client().sismember("test:sent", entry.id)
    return Verdict.DELIVERED if sent else Verdict.ABSENT


def record_delivered(sender, entry, **kwargs):
    import redis as sync_redis

    client = sync_redis.Redis.from_url(_recorder_url())
    client.rpush("test:delivered", f"{entry.id} {entry.delivered_at}")
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
    ``"<pid> <entry>"`` in ``test:aborts``."""
    r = _client()
    await r.set(f"test:aborted:{session_id}", 1)
    await r.rpush("test:aborts", f"{os.getpid()} {entry.id}")
