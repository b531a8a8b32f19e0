"""What an operator reads of a refused ``Origin`` and which local origins ``DEBUG``
admits (docs/reference/websocket.md#origins): the log line of a refusal is cut at
exactly ``MAX_LOGGED_ORIGIN`` characters, carries no raw control character (no forged
log lines), and ``DEBUG`` with no ``ALLOWED_HOSTS`` admits each of Django's local hosts.
Through the validator itself, as channels calls it."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.ws.origin import MAX_LOGGED_ORIGIN, AllowedHostsOriginValidator
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


@pytest.mark.parametrize(
    ("host", "origin"),
    [
        ("localhost:8000", "http://localhost:8000"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("[::1]:8000", "http://[::1]:8000"),
    ],
)
async def test_debug_without_allowed_hosts_admits_each_local_host(host, origin):
    """``DEBUG`` with ``ALLOWED_HOSTS = []`` admits the hosts Django's own host check
    admits then: localhost, 127.0.0.1 and [::1] (IPv6 loopback included)."""

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": 1000})

    with override_settings(DEBUG=True, ALLOWED_HOSTS=[]):
        validator = AllowedHostsOriginValidator(app)
    comm = WebsocketCommunicator(
        validator, "/ws/x/", headers=[(b"origin", origin.encode()), (b"host", host.encode())]
    )
    connected, _ = await comm.connect()
    assert connected
    assert await comm.receive_output(5) == {"type": "websocket.close", "code": 1000}
    await comm.disconnect()
