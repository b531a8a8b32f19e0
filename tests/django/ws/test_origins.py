"""The logging origin validators compare scheme, host and port, as Django's CSRF check
does (docs/reference/websocket.md#origins), in process: each ``Origin`` against a socket
opened on a given scheme and ``Host``. Through uvicorn and daphne:
tests/django/ws/test_refusals_on_servers.py."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from django_outbox.ws.origin import AllowedHostsOriginValidator, OriginValidator, socket_origin


async def opened(scope, receive, send):
    """The application behind the validator: accepts and closes 1000."""
    await receive()
    await send({"type": "websocket.accept"})
    await send({"type": "websocket.close", "code": 1000})


async def verdict(validator, origin, host="example.com", scheme="ws", headers=()) -> str:
    """``"open"`` or ``"refused"`` for a socket opened on ``scheme://host`` from
    ``origin`` (None: no header)."""
    sent = [(b"host", host.encode())] if host else []
    if origin is not None:
        sent.append((b"origin", origin.encode()))
    comm = WebsocketCommunicator(validator, "/ws/x/", headers=[*sent, *headers])
    comm.scope["scheme"] = scheme
    connected, _ = await comm.connect()
    assert connected
    closed = await comm.receive_output(5)
    await comm.disconnect()
    return {1000: "open", 4403: "refused"}[closed["code"]]


def hosts_validator(*hosts, **settings):
    with override_settings(ALLOWED_HOSTS=list(hosts), **settings):
        return AllowedHostsOriginValidator(opened)


@pytest.mark.parametrize(
    ("scheme", "host", "origin", "expected"),
    [
        ("ws", "example.com", "http://example.com", "open"),
        ("ws", "example.com", "https://example.com", "refused"),  # another scheme
        ("ws", "example.com", "http://example.com:8080", "refused"),  # another port
        ("ws", "example.com", "http://example.com:80", "open"),  # the default, written out
        ("ws", "example.com:8000", "http://example.com:8000", "open"),
        ("ws", "example.com:8000", "http://example.com", "refused"),
        ("ws", "example.com:8000", "http://example.com:8001", "refused"),
        ("ws", "example.com:8000", "https://example.com:8000", "refused"),  # same port
        ("wss", "example.com:8443", "http://example.com:8443", "refused"),
        ("wss", "example.com:8443", "https://example.com:8443", "open"),
        ("wss", "example.com", "https://example.com", "open"),
        ("wss", "example.com", "http://example.com", "refused"),
        ("wss", "example.com", "https://example.com:8443", "refused"),
        ("ws", "example.com", "http://evil.example", "refused"),
        ("ws", "example.com", "http://x.corp.example", "open"),  # ".corp.example"
        ("ws", "example.com", "https://x.corp.example", "refused"),
        ("ws", "example.com", "http://corp.example.evil", "refused"),
        ("ws", "example.com", None, "refused"),
        ("ws", "example.com", "null", "refused"),
    ],
)
async def test_an_allowed_host_opens_only_on_the_sockets_own_scheme_and_port(
    scheme, host, origin, expected
):
    validator = hosts_validator("example.com", ".corp.example")
    assert await verdict(validator, origin, host=host, scheme=scheme) == expected


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        ("https://app.other.example", "open"),
        ("http://app.other.example", "refused"),
        ("https://app.other.example:8443", "refused"),
        ("https://a.trusted.example", "open"),
        ("https://trusted.example", "open"),  # as Django's "*." does
        ("https://a.trusted.example:444", "refused"),
        ("https://other.example", "refused"),
    ],
)
async def test_csrf_trusted_origins_open_with_their_scheme_and_port(origin, expected):
    validator = hosts_validator(
        "example.com",
        CSRF_TRUSTED_ORIGINS=["https://app.other.example", "https://*.trusted.example"],
    )
    assert await verdict(validator, origin, host="example.com", scheme="ws") == expected


async def test_a_proxy_that_terminated_tls_counts_when_django_is_told():
    tls = [(b"x-forwarded-proto", b"https")]
    plain = hosts_validator("example.com")
    assert await verdict(plain, "https://example.com", headers=tls) == "refused"
    told = {"SECURE_PROXY_SSL_HEADER": ("HTTP_X_FORWARDED_PROTO", "https")}
    proxied = hosts_validator("example.com", **told)
    with override_settings(**told):
        assert await verdict(proxied, "https://example.com", headers=tls) == "open"
        assert await verdict(proxied, "http://example.com", headers=tls) == "refused"
        assert await verdict(proxied, "https://example.com") == "refused"  # no header


async def test_a_forwarded_host_counts_only_when_django_is_told():
    forwarded = [(b"x-forwarded-host", b"example.com:8443")]
    validator = hosts_validator("example.com")
    origin = "http://example.com:8443"
    assert await verdict(validator, origin, host="10.0.0.5:8000", headers=forwarded) == "refused"
    with override_settings(USE_X_FORWARDED_HOST=True):
        assert await verdict(validator, origin, host="10.0.0.5:8000", headers=forwarded) == "open"


async def test_a_chain_of_forwarded_hosts_counts_its_first_the_client_asked_for():
    """Proxies append to X-Forwarded-Host: the first host is the one the browser used, as
    Django reads it (docs/reference/websocket.md)."""
    chain = [(b"x-forwarded-host", b"example.com:8443, proxy.internal:8000")]
    validator = hosts_validator("example.com")
    with override_settings(USE_X_FORWARDED_HOST=True):
        verdict_first = await verdict(
            validator, "http://example.com:8443", host="10.0.0.5:8000", headers=chain
        )
        verdict_last = await verdict(
            validator, "http://proxy.internal:8000", host="10.0.0.5:8000", headers=chain
        )
    assert (verdict_first, verdict_last) == ("open", "refused")


@pytest.mark.parametrize(
    ("patterns", "origin", "expected"),
    [
        (["example.com"], "http://example.com", "open"),
        (["example.com"], "https://example.com", "refused"),
        (["example.com"], "http://example.com:8080", "refused"),
        (["https://example.com"], "https://example.com", "open"),  # its own scheme wins
        (["https://example.com"], "https://example.com:8443", "refused"),
        (["https://example.com:8443"], "https://example.com:8443", "open"),
        (["*"], "https://anything.example:1", "open"),
        (["*"], None, "open"),
    ],
)
async def test_explicit_origins_compare_the_same_way(patterns, origin, expected):
    validator = OriginValidator(opened, patterns)
    assert await verdict(validator, origin, host="example.com", scheme="ws") == expected


def test_the_sockets_own_origin():
    assert socket_origin({"scheme": "wss", "headers": [(b"host", b"example.com")]}) == (
        "https",
        443,
    )
    assert socket_origin({"headers": [(b"host", b"[::1]:8000")]}) == ("http", 8000)
    assert socket_origin({"headers": [], "server": ("127.0.0.1", 8001)}) == ("http", 8001)
    assert socket_origin({"headers": [(b"host", b"bad:port:x")]}) == ("http", 80)
