"""A cut recorded just before Valkey is SIGKILLed and restarted from its AOF: the mark on
the entry and the holder's signal survive, the turn is still cut, and the prompt ends
verified, never sent twice (docs/howto/cutting.md)."""

from __future__ import annotations

import asyncio

import pytest

from django_outbox import InterruptResult, Verdict
from tests.support.helpers import wait_for
from tests.support.valkey import ValkeyProcess

pytestmark = pytest.mark.slow
WS, SES = "w1", "s1"


async def test_a_cut_survives_a_valkey_restart_and_still_ends_verified(
    tmp_path, make_outbox, signals_log
):
    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="always").start()
    transcript: list[str] = []
    turn_over = asyncio.Event()
    aborts: list[str] = []

    async def deliver(entry, *, workspace_id, session_id, attempt):
        transcript.append(entry.id)
        turn_over.clear()
        await turn_over.wait()  # a turn that never ends on its own

    async def abort(entry, *, workspace_id, session_id):
        aborts.append(entry.id)
        turn_over.set()

    async def verify(entry, **kwargs):
        return Verdict.DELIVERED if entry.id in transcript else Verdict.ABSENT

    outbox = make_outbox(
        url=server.url,
        deliverer=deliver,
        verifier=verify,
        aborter=abort,
        lock_ttl=3,
        verify_delay=0,
        retry_backoff=0.05,
        max_backoff=0.2,
    )
    try:
        entry = await outbox.aaccept(WS, SES, user_id="u", client_message_id="k1", text="x")
        step = asyncio.ensure_future(outbox.adeliver_once(WS, SES))
        await wait_for(lambda: transcript, timeout=10)
        assert await outbox.ainterrupt(WS, SES) is InterruptResult.CUT
        server.kill()  # before the holder's next look at its cut signal
        server.start()  # same port, same AOF
        await asyncio.wait_for(step, 30)  # the holder saw the cut after all and aborted
        assert aborts == [entry.id]
        (listed,) = await outbox.alist(WS, SES)
        assert (listed.id, listed.interrupted) == (entry.id, True)
        await wait_for(lambda: outbox.adeliver_once(WS, SES), timeout=30)  # the verification
        assert signals_log.ids("delivered") == [entry.id]
        delivered = signals_log.calls["delivered"][0][0]
        assert delivered.interrupted is True
        assert transcript == [entry.id]  # never sent again
        assert await outbox.alist(WS, SES) == []
    finally:
        await outbox.aclose()
        server.stop()
