"""``manage.py outbox_worker``'s refusals before it starts: flags out of range, and a
Valkey it cannot reach, said without the URL's password
(docs/reference/commands.md#outbox_worker)."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support.valkey import free_port


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
