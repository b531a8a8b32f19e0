"""What "Valkey unavailable" means on the paths few outages walk
(docs/howto/valkey.md#what-each-setting-keeps): a replica cut from its primary answers
MASTERDOWN, which is "not now" like READONLY or LOADING, never an error of the caller's;
and waiting out an outage never sleeps past its patience or longer than its longest
delay."""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis._parsers.base import BaseParser

from django_outbox.core.errors import OutboxUnavailable
from django_outbox.core.service import Outbox
from django_outbox.core.unavailable import (
    UNAVAILABLE_REPLIES,
    as_unavailable,
    classified,
    retry_unavailable,
)
from django_outbox.testing import ValkeyServer, free_port


@pytest.mark.standalone
def test_a_replica_cut_from_its_primary_is_unavailable_not_an_error(tmp_path):
    # A replica told not to serve stale data answers every read with MASTERDOWN while
    # its primary is away: a snapshot there must be "Valkey unavailable" (a 503 the
    # client retries), never a ResponseError (a 500).
    with ValkeyServer(tmp_path / "replica", replica_serve_stale_data="no") as server:
        client = redis.Redis.from_url(server.url)
        outbox = Outbox(url=server.url)
        try:
            client.replicaof("127.0.0.1", free_port())  # a primary that never answers
            with pytest.raises(redis.exceptions.MasterDownError):
                client.get("anything")
            with pytest.raises(OutboxUnavailable, match="MasterDownError"):
                outbox.snapshot("w1", "s1")
        finally:
            outbox.close()
            client.close()


@pytest.mark.parametrize("code", UNAVAILABLE_REPLIES)
def test_every_not_now_reply_is_unavailable_as_redis_py_parses_it(code):
    # redis-py's parser turns some replies into their own class and cuts the code off the
    # message (TRYAGAIN becomes a TryAgainError saying only the rest): each must still be
    # "Valkey unavailable", for a single call and for a pipeline's answer alike.
    error = BaseParser.parse_error(f"{code} the server cannot take this now")
    assert isinstance(as_unavailable(error), OutboxUnavailable)
    assert isinstance(classified(error), OutboxUnavailable)


def test_a_callers_error_is_not_unavailable():
    error = BaseParser.parse_error("ERR wrong number of arguments for 'get' command")
    assert as_unavailable(error) is None
    assert classified(error) is error


def _failing_step():
    calls = []

    async def step():
        calls.append(1)
        raise OutboxUnavailable("Valkey unavailable: ConnectionError: refused")

    return step, calls


def test_waiting_out_an_outage_stops_within_its_patience():
    # Every delay slept is one that still ended before the patience ran out: the sum of
    # the delays is at most the patience, and the last error is raised then.
    step, calls = _failing_step()
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await asyncio.sleep(delay)

    async def run() -> None:
        await retry_unavailable(
            step, patience=0.45, first_delay=0.1, max_delay=0.2, what="a test", sleep=sleep
        )

    with pytest.raises(OutboxUnavailable, match="refused"):
        asyncio.run(run())
    assert slept and sum(slept) <= 0.45
    assert len(calls) == len(slept) + 1


def test_waiting_out_an_outage_doubles_its_delay_up_to_the_longest():
    step, _ = _failing_step()
    slept: list[float] = []

    async def sleep(delay: float) -> None:
        slept.append(delay)
        await asyncio.sleep(0)

    async def run() -> None:
        await retry_unavailable(
            step,
            patience=60.0,
            first_delay=0.01,
            max_delay=0.04,
            what="a test",
            sleep=sleep,
            give_up=lambda: len(slept) >= 6,
        )

    with pytest.raises(OutboxUnavailable):
        asyncio.run(run())
    assert slept == [0.01, 0.02, 0.04, 0.04, 0.04, 0.04]
