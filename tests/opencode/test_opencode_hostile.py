"""The opencode deliverer and verifier against a hostile agent (README "Security").

A hostile (or compromised, or misconfigured) agent must not get the agent's credentials sent
to another host through a ``Link: rel=next`` header, nor grow the worker's memory by answering
a huge body: what is read from it is bounded by ``OUTBOX["OPENCODE"]["MAX_RESPONSE_BYTES"]``.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import tracemalloc
from urllib.parse import quote

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox import Verdict
from django_outbox.conf import outbox_settings
from django_outbox.delivery import opencode
from django_outbox.delivery.opencode import OpencodeClient, OpencodeHTTPError
from django_outbox.errors import AmbiguousError
from tests.support.fake_opencode import FakeOpencode, Fault
from tests.support.helpers import make_entry

PASSWORD = "hostile-test-Pw-9"
HUGE = 200 * 1024 * 1024  # the body a hostile agent answers (made lazily by the fake)
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
async def _opencode_module_state():
    yield
    await opencode.aclose()


@pytest.fixture
async def agent():
    """The agent the outbox talks to (Basic auth on)."""
    async with FakeOpencode(password=PASSWORD) as server:
        yield server


@pytest.fixture
async def elsewhere():
    """Another server on another port: where a hostile agent points its links."""
    async with FakeOpencode() as server:
        yield server


def client_of(agent: FakeOpencode, **kwargs) -> OpencodeClient:
    kwargs.setdefault("password", PASSWORD)
    return OpencodeClient(agent.base_url, connect_timeout=1, timeout=5, verify_timeout=5, **kwargs)


async def verify(client: OpencodeClient, entry, sid: str) -> Verdict:
    try:
        return await client.verify(entry, workspace_id="w1", session_id=sid)
    finally:
        await client.aclose()


def older_message(agent: FakeOpencode, sid: str, text: str) -> None:
    """Append a user message with ``text`` to the transcript, created now."""
    agent._store_prompt(sid, agent.new_id("msg"), [{"type": "text", "text": text}], None)


# --- Link: rel=next goes nowhere but the agent --------------------------------------------


@pytest.mark.parametrize(
    "link_base",
    [
        "{elsewhere}",  # another port on the same host
        "http://localhost:{elsewhere_port}",  # another host name
        "//127.0.0.1:{elsewhere_port}",  # scheme-relative
        "https://127.0.0.1:{agent_port}",  # same host and port, another scheme
        "http://127.0.0.1:{elsewhere_port}@127.0.0.1:{agent_port}",  # userinfo, same origin
    ],
)
async def test_verifier_never_follows_a_link_to_another_origin(agent, elsewhere, link_base):
    """The agent's Basic credentials go to the agent only: a next link to any other origin
    (scheme, host, port) is not followed, and the transcript counts as unreadable."""
    sid = agent.create_session()
    for i in range(3):
        older_message(agent, sid, f"other {i}")
    agent.page_size = 1
    agent.next_link_base = link_base.format(
        elsewhere=elsewhere.base_url, elsewhere_port=elsewhere.port, agent_port=agent.port
    )
    entry = make_entry("ours")
    verdict = await verify(client_of(agent), entry, sid)
    assert verdict is Verdict.INCONCLUSIVE
    assert elsewhere.requests == []
    lists = [r for r in agent.requests if r.parts[-1] == "message" and r.method == "GET"]
    assert len(lists) == 1  # the first page only (a link with credentials is refused too)


async def test_verifier_follows_relative_links_on_the_agent(agent):
    """A relative next link (what a server behind a path prefix sends) resolves against the
    agent and is followed; our text on the last page is found."""
    sid = agent.create_session()
    older_message(agent, sid, "ours")
    for i in range(3):
        older_message(agent, sid, f"other {i}")
    agent.page_size = 1
    agent.next_link_base = ""
    assert await verify(client_of(agent), make_entry("ours"), sid) is Verdict.DELIVERED
    auth = "Basic " + base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()
    lists = [r for r in agent.requests if r.parts[-1] == "message" and r.method == "GET"]
    assert len(lists) == 4 and all(r.headers["authorization"] == auth for r in lists)


async def test_verifier_ignores_credentials_in_the_base_url_when_following_links(elsewhere):
    """Credentials given in BASE_URL are the agent's too: never sent elsewhere."""
    async with FakeOpencode(password=PASSWORD) as agent:
        sid = agent.create_session()
        for i in range(2):
            older_message(agent, sid, f"other {i}")
        agent.page_size = 1
        agent.next_link_base = elsewhere.base_url
        url = f"http://opencode:{PASSWORD}@127.0.0.1:{agent.port}"
        client = OpencodeClient(url, connect_timeout=1, verify_timeout=5)
        assert await verify(client, make_entry("ours"), sid) is Verdict.INCONCLUSIVE
        assert elsewhere.requests == []
        assert len(agent.requests) == 2  # it authenticated: the 404 lookup, then page one


@pytest.mark.parametrize("route", ["get_message", "list_messages", "post_message"])
async def test_redirects_are_never_followed(agent, elsewhere, route):
    """A redirect to another server is an answer like any other: for the verifier an
    inconclusive pass, for the deliverer a definitive 3xx failure; nothing goes there."""
    sid = agent.create_session()
    if route == "list_messages":
        agent.faults["get_message"] = Fault(status=404)
    target = f"{elsewhere.base_url}/session/{sid}/message"
    agent.faults[route] = Fault(status=307, headers=(("location", target),))
    client = client_of(agent)
    if route == "post_message":
        with pytest.raises(OpencodeHTTPError) as info:
            try:
                await client.deliver(make_entry("hi"), workspace_id="w1", session_id=sid, attempt=1)
            finally:
                await client.aclose()
        assert info.value.status == 307
    else:
        assert await verify(client, make_entry("ours"), sid) is Verdict.INCONCLUSIVE
    assert elsewhere.requests == []


async def test_a_compressed_answer_is_refused(agent):
    """The verifier asks for no compression (what is read is what is counted: no
    decompression bomb) and does not read an answer compressed anyway."""
    sid = agent.create_session()
    message = {"info": {"id": "msg_x", "role": "user"}, "parts": [{"type": "text", "text": "a"}]}
    packed = gzip.compress(json.dumps(message).encode())
    agent.faults["get_message"] = Fault(body=packed, headers=(("content-encoding", "gzip"),))
    assert await verify(client_of(agent), make_entry("a"), sid) is Verdict.INCONCLUSIVE
    assert agent.requests[-1].headers["accept-encoding"] == "identity"


async def test_percent_encoded_url_credentials_authenticate():
    """``user:password@`` in BASE_URL is decoded and sent as Basic auth, not kept in the URL."""
    password = "p@ss:w/rd #9%"
    async with FakeOpencode(password=password, username="bob") as agent:
        sid = agent.create_session()
        url = f"http://bob:{quote(password, safe='')}@127.0.0.1:{agent.port}/"
        client = OpencodeClient(url, connect_timeout=1, verify_timeout=5)
        assert client.base_url == agent.base_url and password not in repr(client)
        entry = make_entry("hi")
        try:
            await client.deliver(entry, workspace_id="w1", session_id=sid, attempt=1)
        finally:
            await client.aclose()
        assert await verify(client, entry, sid) is Verdict.DELIVERED
        assert agent.user_texts(sid) == [["hi"]]


# --- huge answers -------------------------------------------------------------------------


async def peak_while(awaitable) -> tuple[object, int]:
    """``(result or raised exception, peak bytes traced while awaiting it)``."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        try:
            result: object = await awaitable
        except Exception as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("declare_length", [True, False], ids=["content-length", "chunked"])
@pytest.mark.parametrize("route", ["get_message", "list_messages"])
async def test_verifier_reads_at_most_max_response_bytes(agent, route, declare_length):
    """A 200 MB answer (declared or chunked) is not read past the cap: INCONCLUSIVE, and the
    memory traced while verifying stays near the cap."""
    sid = agent.create_session()
    if route == "list_messages":
        agent.faults["get_message"] = Fault(status=404)
    agent.faults[route] = Fault(huge=HUGE, declare_length=declare_length)
    client = client_of(agent, max_response_bytes=1 * MiB)
    verdict, peak = await peak_while(verify(client, make_entry("ours"), sid))
    assert verdict is Verdict.INCONCLUSIVE
    assert peak < 8 * MiB, f"{peak / MiB:.1f} MiB traced"


async def test_verifier_default_cap_bounds_memory_through_the_settings(agent):
    """Through OUTBOX["OPENCODE"] with the default cap (16 MiB): a 200 MB transcript is
    refused after reading about the cap."""
    sid = agent.create_session()
    agent.faults["get_message"] = Fault(status=404)
    agent.faults["list_messages"] = Fault(huge=HUGE, declare_length=False)
    block = {"BASE_URL": agent.base_url, "PASSWORD": PASSWORD, "VERIFY_TIMEOUT": 10}
    with override_settings(OUTBOX={"OPENCODE": block}):
        cap = outbox_settings().opencode.max_response_bytes
        assert cap == opencode.DEFAULT_MAX_RESPONSE_BYTES == 16 * MiB
        verdict, peak = await peak_while(
            opencode.verify(make_entry("ours"), workspace_id="w1", session_id=sid)
        )
    assert verdict is Verdict.INCONCLUSIVE
    assert peak < cap * 3, f"{peak / MiB:.1f} MiB traced"


async def test_a_transcript_under_the_cap_is_still_read(agent):
    sid = agent.create_session()
    older_message(agent, sid, "ours " + "x" * 200_000)
    entry = make_entry("ours " + "x" * 200_000)
    assert await verify(client_of(agent, max_response_bytes=1 * MiB), entry, sid) is (
        Verdict.DELIVERED
    )


@pytest.mark.parametrize(
    "status, outcome",
    [(200, None), (500, AmbiguousError), (400, OpencodeHTTPError)],
    ids=["2xx", "5xx", "4xx"],
)
@pytest.mark.parametrize("declare_length", [True, False], ids=["content-length", "chunked"])
async def test_deliverer_never_reads_a_huge_answer(agent, status, outcome, declare_length):
    """The delivery's status decides its outcome (2xx delivered, 5xx ambiguous, 4xx failed);
    of a 200 MB answer the deliverer reads at most a short error excerpt."""
    sid = agent.create_session()
    agent.faults["post_message"] = Fault(huge=HUGE, status=status, declare_length=declare_length)
    client = client_of(agent)

    async def deliver():
        try:
            await client.deliver(make_entry("hi"), workspace_id="w1", session_id=sid, attempt=1)
        finally:
            await client.aclose()

    result, peak = await peak_while(deliver())
    if outcome is None:
        assert result is None
    else:
        assert isinstance(result, outcome), repr(result)
        assert len(str(result)) < 1000
    assert peak < 4 * MiB, f"{peak / MiB:.1f} MiB traced"


async def test_a_slow_huge_answer_is_bounded_by_the_verify_timeout(agent):
    """Reading stops at the cap even when the agent drips; nothing waits for the rest."""
    sid = agent.create_session()
    agent.faults["get_message"] = Fault(huge=HUGE, declare_length=False)
    client = client_of(agent, max_response_bytes=256 * 1024)
    verdict = await asyncio.wait_for(verify(client, make_entry("ours"), sid), 30)
    assert verdict is Verdict.INCONCLUSIVE


# --- the setting --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 1.5, "16MB", True, None])
def test_max_response_bytes_must_be_a_positive_integer(value):
    block = {"BASE_URL": "http://127.0.0.1:4096", "MAX_RESPONSE_BYTES": value}
    with override_settings(OUTBOX={"OPENCODE": block}), pytest.raises(ImproperlyConfigured) as e:
        outbox_settings()
    assert "MAX_RESPONSE_BYTES" in str(e.value)


def test_max_response_bytes_is_read_from_the_settings():
    block = {"BASE_URL": "http://127.0.0.1:4096", "MAX_RESPONSE_BYTES": 4096}
    with override_settings(OUTBOX={"OPENCODE": block}):
        assert outbox_settings().opencode.max_response_bytes == 4096


# --- a slow drip: every timeout is a total deadline ----------------------------------------

#: Seconds between two bytes of a dripping agent: each read gets a byte well inside any
#: per-read timeout, so only a total deadline ends the request.
DRIP = 0.1


def _drip_answer(status: str, body: bytes) -> tuple[bytes, bytes]:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body


#: A user message that would be DELIVERED if read whole: 2,000 bytes dripped take 200 s.
_SLOW_BODY = json.dumps({"info": {"role": "user"}, "parts": [], "pad": " " * 2000}).encode()


@pytest.mark.parametrize("head_at_once", [True, False], ids=["body-drips", "headers-drip"])
async def test_a_dripping_agent_cannot_outlive_the_verify_timeout(head_at_once):
    """``verify_timeout`` bounds a whole verification (connect, headers, every body and
    page): a byte every 0.1 s never trips a per-read timeout, yet the verdict is
    INCONCLUSIVE by the deadline (docs/reference/settings.md#opencode)."""
    from tests.support.drip import DripServer

    head, body = _drip_answer("200 OK", _SLOW_BODY)
    async with DripServer(head, body, interval=DRIP, head_at_once=head_at_once) as agent:
        client = OpencodeClient(agent.base_url, connect_timeout=1, timeout=2, verify_timeout=2)
        started = asyncio.get_running_loop().time()
        verdict = await asyncio.wait_for(verify(client, make_entry("ours"), "ses_drip"), 30)
        took = asyncio.get_running_loop().time() - started
    assert verdict is Verdict.INCONCLUSIVE
    assert took < 3.5, f"took {took:.1f} s with verify_timeout=2"


@pytest.mark.parametrize(
    "status, head_at_once, outcome",
    [
        ("200 OK", False, AmbiguousError),  # headers drip: maybe sent, no answer in time
        ("500 Internal Server Error", True, AmbiguousError),  # the error body drips
        ("400 Bad Request", True, OpencodeHTTPError),
    ],
    ids=["headers-drip", "5xx-body-drips", "4xx-body-drips"],
)
async def test_a_dripping_agent_cannot_outlive_the_delivery_timeout(status, head_at_once, outcome):
    """``timeout`` bounds the delivery POST as a whole (connect, send, the answer's headers
    and the error excerpt): a dripped answer ends by the deadline with the outcome its
    status (or its absence) gives."""
    from tests.support.drip import DripServer

    head, body = _drip_answer(status, b'{"error": "' + b"x" * 3000 + b'"}')
    async with DripServer(head, body, interval=DRIP, head_at_once=head_at_once) as agent:
        client = OpencodeClient(agent.base_url, connect_timeout=1, timeout=2, verify_timeout=2)
        started = asyncio.get_running_loop().time()
        try:
            await asyncio.wait_for(
                client.deliver(make_entry("hi"), workspace_id="w1", session_id="ses_d", attempt=1),
                30,
            )
        except (AmbiguousError, OpencodeHTTPError) as exc:
            result: BaseException | None = exc
        else:
            result = None
        finally:
            await client.aclose()
        took = asyncio.get_running_loop().time() - started
    assert isinstance(result, outcome), repr(result)
    assert took < 3.5, f"took {took:.1f} s with timeout=2"
