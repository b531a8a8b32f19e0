"""What an operator reads of a refused ``Origin`` (docs/reference/websocket.md#origins):
the log line of a refusal is cut at exactly ``MAX_LOGGED_ORIGIN`` characters and carries
no raw control character (no forged log lines). Through the validator itself, as channels
calls it (which local origins ``DEBUG`` admits: tests/django/ws/test_refusals.py)."""

from __future__ import annotations

import pytest

from django_outbox.ws.origin import MAX_LOGGED_ORIGIN
from tests.support.ws_session import origin_refusal_line


@pytest.mark.parametrize(("extra", "cut"), [(0, False), (1, True)])
async def test_a_refused_origin_is_logged_whole_up_to_exactly_the_limit(extra, cut, caplog):
    """An ``Origin`` of exactly ``MAX_LOGGED_ORIGIN`` characters is logged whole; one
    character more is cut there and marked with ``...``."""
    prefix = "https://"
    origin = prefix + "a" * (MAX_LOGGED_ORIGIN - len(prefix) + extra)
    line = await origin_refusal_line(origin.encode(), caplog)
    shown = line.split("Origin '", 1)[1].rsplit("' is not allowed", 1)[0]
    if cut:
        assert shown == origin[:MAX_LOGGED_ORIGIN] + "..."
    else:
        assert shown == origin


async def test_control_characters_of_a_refused_origin_cannot_forge_a_log_line(caplog):
    """A CR/LF (or any control character) in the header is logged escaped: the line stays
    one line and a reader sees what was sent."""
    line = await origin_refusal_line(b"https://evil.example\r\nINFO forged entry\x1b[31m", caplog)
    assert "\n" not in line and "\r" not in line and "\x1b" not in line
    assert "evil.example\\r\\nINFO forged entry\\x1b[31m" in line
