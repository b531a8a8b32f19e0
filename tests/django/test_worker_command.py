"""``manage.py outbox_worker``'s refusals before it starts: flags out of range, and a
Valkey it cannot reach, said without the URL's password
(docs/reference/commands.md#outbox_worker)."""

from __future__ import annotations

import asyncio
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_outbox.core.heartbeats import WorkerHeartbeat
from tests.support.valkey import free_port, wait_until


def refusal(*args: str) -> str:
    with pytest.raises(CommandError) as refused:
        call_command("outbox_worker", *args, stdout=io.StringIO(), stderr=io.StringIO())
    return str(refused.value)


@pytest.mark.parametrize(
    "args, said",
    [
        (("--tick", "0"), "--tick must be positive"),
        (("--tick", "-1"), "--tick must be positive"),
        (("--concurrency", "0"), "--concurrency must be at least 1"),
        (("--grace", "-0.5"), "--grace must not be negative"),
    ],
)
def test_a_flag_out_of_range_is_refused_before_anything_starts(valkey, args, said):
    assert refusal(*args) == said


def test_an_unreachable_valkey_is_said_without_its_password(monkeypatch, settings):
    from django_outbox import conf
    from django_outbox.outbox import reset_outbox

    url = f"redis://:hunter2-not-real@127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("OUTBOX_VALKEY_URL", url)
    settings.OUTBOX = {
        **settings.OUTBOX,
        "VALKEY_URL": url,
        "DELIVERER": "tests.support.scenarios.nothing",
    }
    conf.reset()
    reset_outbox()
    said = refusal("--once")
    assert "is unreachable after 5 attempts" in said
    assert "hunter2-not-real" not in said


def test_the_health_probe_lists_live_workers_only(valkey, r):
    """``--check`` exits 0 and lists each live worker with its pid and sessions in
    flight; a worker whose heartbeat expired (silent, still indexed) is not live."""
    from django_outbox.outbox import get_outbox

    outbox = get_outbox()

    async def beat(worker_id: str, ttl: float) -> None:
        record = WorkerHeartbeat(worker_id, 0.0, host="h", pid=7, in_flight=2, concurrency=4)
        try:
            await outbox.abeat(record, ttl)
        finally:
            await outbox.aclose()

    asyncio.run(beat("silent-worker", 0.2))
    wait_until(lambda: not r.exists(outbox.keys.heartbeat("silent-worker")), 10, message="expiry")
    with pytest.raises(CommandError, match="no live outbox worker") as refused:
        call_command("outbox_worker", "--check", stdout=io.StringIO())
    assert refused.value.returncode == 1

    asyncio.run(beat("live-worker", 30))
    out = io.StringIO()
    call_command("outbox_worker", "--check", stdout=out)
    assert out.getvalue() == "live: live-worker pid=7 in_flight=2\n"
