"""``manage.py outbox edit|move|cancel`` (docs/howto/steering.md): output and exit codes
(0 done, 1 not found, 2 refused)."""

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.support.helpers import SES, WS, accept


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()


def exit_code(*args: str) -> int:
    with pytest.raises(CommandError) as raised:
        run(*args)
    return raised.value.returncode


def test_edit_move_cancel_from_the_shell(outbox):
    a, b = accept(outbox, "a"), accept(outbox, "b")
    version = outbox.snapshot(WS, SES).version
    assert "Edited" in run("edit", WS, SES, a.id, "--text", "a2", "--model", '{"id": "m"}')
    assert exit_code("edit", WS, SES, a.id, "--text", "x", "--if-version", str(version)) == 2
    assert exit_code("edit", WS, SES, a.id, "--model", "not json") == 2
    assert exit_code("edit", WS, SES, a.id) == 2  # nothing to edit
    assert "Moved" in run("move", WS, SES, b.id, "--to", "next")
    assert exit_code("move", WS, SES, b.id, "--before", "gone") == 1
    assert [(e.text, e.model) for e in outbox.list(WS, SES)] == [("b", None), ("a2", {"id": "m"})]
    assert "Cancelled" in run("cancel", WS, SES, b.id)
    assert exit_code("cancel", WS, SES, b.id) == 1
    assert [e.text for e in outbox.list(WS, SES)] == ["a2"]


def test_the_shell_records_its_operator_on_what_it_changes(outbox):
    a, b = accept(outbox, "a"), accept(outbox, "b")
    run("edit", WS, SES, a.id, "--text", "a2")
    run("move", WS, SES, b.id, "--to", "next")
    moved, edited = outbox.list(WS, SES)
    assert moved.moved_by.startswith("cli") and edited.edited_by.startswith("cli")
    assert edited.edited_by == moved.moved_by
