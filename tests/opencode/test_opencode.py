"""The built-in opencode deliverer and verifier, against the fake opencode server.

The same behaviour against a real ``opencode serve`` is in test_opencode_real.py.
"""

from __future__ import annotations

import asyncio
import base64
import math
import re
import threading
import time
from datetime import timedelta

import httpx
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox import Status, Verdict
from django_outbox.core.entry import Entry, format_time, new_entry_id, parse_time
from django_outbox.delivery import opencode
from django_outbox.delivery.opencode import (
    OpencodeClient,
    OpencodeError,
    OpencodeHTTPError,
    OpencodeSessionIDError,
    message_id_for,
)
from django_outbox.errors import AmbiguousError, TransientDeliveryError
from tests.support.fake_opencode import FakeOpencode, Fault
from tests.support.helpers import make_entry

MESSAGE_ID_RE = re.compile(r"msg_[0-9a-f]{12}[0-9A-Za-z]{14}")


def now_rfc3339(offset: float = 0.0) -> str:
    return format_time(int((time.time() + offset) * 1_000_000))


@pytest.fixture(autouse=True)
async def _opencode_module_state():
    yield
    await opencode.aclose()


@pytest.fixture
async def fake():
    async with FakeOpencode() as server:
        yield server


@pytest.fixture
async def client(fake):
    c = OpencodeClient(fake.base_url, connect_timeout=1, timeout=5, verify_timeout=2)
    yield c
    await c.aclose()


async def deliver(client: OpencodeClient, entry: Entry, sid: str, attempt: int = 1) -> None:
    await client.deliver(entry, workspace_id="w1", session_id=sid, attempt=attempt)


async def verify(client: OpencodeClient, entry: Entry, sid: str) -> Verdict:
    return await client.verify(entry, workspace_id="w1", session_id=sid)


# --- what is sent ----------------------------------------------------------------------


async def test_deliver_posts_text_and_message_id(fake, client):
    sid = fake.create_session()
    entry = make_entry("héllo ✓\nline two")
    await deliver(client, entry, sid)
    (post,) = [r for r in fake.requests if r.method == "POST"]
    assert post.path == f"/session/{sid}/message"
    assert post.json() == {
        "parts": [{"type": "text", "text": "héllo ✓\nline two"}],
        "messageID": message_id_for(entry),
    }
    assert fake.user_texts(sid) == [["héllo ✓\nline two"]]
    assert "authorization" not in post.headers


async def test_deliver_sends_model_only_when_set(fake, client):
    sid = fake.create_session()
    model = {"providerID": "anthropic", "modelID": "claude", "extra": [], "n": 12345678901234567}
    await deliver(client, make_entry("a", model=model), sid)
    assert fake.requests[-1].json()["model"] == model
    assert fake.messages(sid)[0]["info"]["model"] == model


async def test_message_id_is_stable_across_attempts(fake, client):
    """Every attempt sends the same messageID; like opencode, the fake appends a resend's
    text to the same message, and verify still finds it."""
    sid = fake.create_session()
    entry = make_entry("same")
    await deliver(client, entry, sid, attempt=1)
    again = entry.evolve(attempts=1, last_attempt_at=now_rfc3339(1))
    await deliver(client, again, sid, attempt=2)
    ids = [r.json()["messageID"] for r in fake.requests if r.method == "POST"]
    assert ids == [message_id_for(entry)] * 2
    assert fake.user_texts(sid) == [["same", "same"]]
    assert await verify(client, again, sid) is Verdict.DELIVERED


def test_message_ids_follow_accept_time_not_the_entry_ids_own_clock():
    """Two web processes with clocks 600 s apart mint entry IDs out of order; the
    messageIDs follow acceptedAt (Valkey's clock), so the transcript keeps accept order."""

    def minted_at(ms: int) -> str:  # an entry ID as new_entry_id makes it at that time
        return f"{(ms * 0x1000) & 0xFFFF_FFFF_FFFF:012x}" + "A" * 14

    ahead = make_entry(  # accepted first, by a process whose clock is 600 s ahead
        id=minted_at(parse_time("2026-11-30T01:52:39.000000Z") // 1000),
        accepted_at="2026-11-30T01:42:39.000100Z",
    )
    behind = make_entry(  # accepted next, by a process with the right clock
        id=minted_at(parse_time("2026-11-30T01:42:39.000000Z") // 1000),
        accepted_at="2026-11-30T01:42:39.000200Z",
    )
    assert ahead.id > behind.id  # the IDs disagree with accept order
    assert message_id_for(ahead) < message_id_for(behind)
    assert MESSAGE_ID_RE.fullmatch(message_id_for(ahead))


@pytest.mark.parametrize(
    "entry_id",
    ["e1", "x" * 128, "01ARZ3NDEKTSV4RRFFQ69G5FAV", "A" * 26, "22c64f95200167whInrgPYfINL"],
)
def test_message_id_for_other_ids_is_valid_stable_and_time_ordered(entry_id):
    accepted = "2026-11-30T01:42:39.123456Z"
    entry = make_entry(id=entry_id, accepted_at=accepted)
    mid = message_id_for(entry)
    assert MESSAGE_ID_RE.fullmatch(mid)
    assert message_id_for(entry.evolve(attempts=3, last_attempt_at=now_rfc3339())) == mid
    ms, micros = divmod(parse_time(accepted), 1000)
    assert mid[4:16] == f"{(ms * 0x1000 + micros) & 0xFFFF_FFFF_FFFF:012x}"
    later = make_entry(id=entry_id + "b", accepted_at="2026-11-30T01:42:39.124456Z")
    assert message_id_for(later) > mid
    assert message_id_for(make_entry(id=entry_id + "c", accepted_at=accepted)) != mid


# --- classification table, row by row ----------------------------------------------------


async def test_2xx_is_delivered_even_with_an_unreadable_body(fake, client):
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(body=b"not json at all")
    await deliver(client, make_entry(), sid)


async def test_connection_refused_is_transient(fake, client):
    sid = fake.create_session()
    await fake.stop()
    with pytest.raises(TransientDeliveryError) as info:
        await deliver(client, make_entry(), sid)
    assert isinstance(info.value.err, httpx.ConnectError)


async def test_name_resolution_failure_is_transient():
    c = OpencodeClient("http://outbox-test.invalid:4096", connect_timeout=2)
    try:
        with pytest.raises(TransientDeliveryError) as info:
            await c.deliver(make_entry(), workspace_id="w", session_id="ses_x", attempt=1)
        assert isinstance(info.value.err, httpx.ConnectError | httpx.ConnectTimeout)
    finally:
        await c.aclose()


async def test_turn_longer_than_timeout_is_ambiguous_and_stored(fake):
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(delay=math.inf)
    c = OpencodeClient(fake.base_url, timeout=0.3)
    entry = make_entry()
    try:
        with pytest.raises(AmbiguousError) as info:
            await deliver(c, entry, sid)
        assert isinstance(info.value.err, httpx.ReadTimeout)
        assert fake.user_texts(sid) == [["hello"]]
        assert await verify(c, entry, sid) is Verdict.DELIVERED
    finally:
        await c.aclose()


async def test_cut_before_store_is_ambiguous_and_verifies_absent(fake, client):
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(cut="before_store")
    entry = make_entry()
    with pytest.raises(AmbiguousError) as info:
        await deliver(client, entry, sid)
    assert isinstance(info.value.err, httpx.RemoteProtocolError | httpx.ReadError)
    assert fake.messages(sid) == []
    assert await verify(client, entry, sid) is Verdict.ABSENT


async def test_cut_after_store_is_ambiguous_and_verifies_delivered(fake, client):
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(cut="after_store")
    entry = make_entry()
    with pytest.raises(AmbiguousError):
        await deliver(client, entry, sid)
    assert fake.user_texts(sid) == [["hello"]]
    assert await verify(client, entry, sid) is Verdict.DELIVERED


async def test_5xx_is_ambiguous(fake, client):
    """A 5xx may come after opencode stored the message (or from a proxy): verify decides."""
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(status=500)
    with pytest.raises(AmbiguousError) as info:
        await deliver(client, make_entry(), sid)
    assert isinstance(info.value.err, OpencodeHTTPError)
    assert info.value.err.status == 500


@pytest.mark.parametrize("status", [400, 409, 413, 429])
async def test_4xx_is_a_definitive_failure(fake, client, status):
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(status=status)
    with pytest.raises(OpencodeHTTPError) as info:
        await deliver(client, make_entry(), sid)
    assert info.value.status == status
    assert "injected" in info.value.body
    assert not isinstance(info.value, AmbiguousError | TransientDeliveryError)


async def test_unknown_session_is_a_definitive_404(fake, client):
    with pytest.raises(OpencodeHTTPError) as info:
        await deliver(client, make_entry(), "ses_nope")
    assert info.value.status == 404
    assert "Session not found" in str(info.value)


async def test_non_opencode_session_id_is_refused_locally(fake, client):
    with pytest.raises(OpencodeSessionIDError):
        await deliver(client, make_entry(), "s1")
    assert fake.requests == []
    assert await verify(client, make_entry(), "s1") is Verdict.INCONCLUSIVE


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (httpx.ConnectError, TransientDeliveryError),
        (httpx.ConnectTimeout, TransientDeliveryError),
        (httpx.PoolTimeout, TransientDeliveryError),
        (httpx.ProxyError, TransientDeliveryError),
        (httpx.ReadTimeout, AmbiguousError),
        (httpx.ReadError, AmbiguousError),
        (httpx.WriteError, AmbiguousError),
        (httpx.WriteTimeout, AmbiguousError),
        (httpx.RemoteProtocolError, AmbiguousError),
        (httpx.CloseError, AmbiguousError),
        (httpx.LocalProtocolError, OpencodeError),
        (httpx.UnsupportedProtocol, OpencodeError),
    ],
)
async def test_classification_of_every_httpx_transport_error(exc, expected):
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc("injected", request=request)

    c = OpencodeClient("http://agent:4096", transport=httpx.MockTransport(handler))
    try:
        with pytest.raises(expected) as info:
            await c.deliver(make_entry(), workspace_id="w", session_id="ses_1", attempt=1)
        if expected is not OpencodeError:
            assert isinstance(info.value.err, exc)
        else:
            assert isinstance(info.value.__cause__, exc)
            assert not isinstance(info.value, AmbiguousError | TransientDeliveryError)
    finally:
        await c.aclose()


# --- verify -------------------------------------------------------------------------------


async def test_verify_delivered_by_message_id(fake, client):
    sid = fake.create_session()
    entry = make_entry()
    await deliver(client, entry, sid)
    assert await verify(client, entry, sid) is Verdict.DELIVERED
    assert fake.requests[-1].path == f"/session/{sid}/message/{message_id_for(entry)}"


async def test_verify_absent_when_never_sent(fake, client):
    sid = fake.create_session()
    await deliver(client, make_entry("other"), sid)
    entry = make_entry()
    assert await verify(client, entry, sid) is Verdict.ABSENT
    assert [r.path for r in fake.requests[-2:]] == [
        f"/session/{sid}/message/{message_id_for(entry)}",
        f"/session/{sid}/message",
    ]


async def test_verify_finds_text_when_server_ignores_message_ids(fake, client):
    fake.honour_message_id = False
    sid = fake.create_session()
    entry = make_entry()
    await deliver(client, entry, sid)
    assert fake.messages(sid)[0]["info"]["id"] != message_id_for(entry)
    assert await verify(client, entry, sid) is Verdict.DELIVERED


async def test_verify_text_match_must_be_inside_the_send_window(fake, client):
    fake.honour_message_id = False
    sid = fake.create_session()
    await deliver(client, make_entry("again"), sid)
    # A later attempt of another entry with the same text: the old message is not it.
    later = make_entry("again", last_attempt_at=now_rfc3339(client.clock_skew + 5))
    assert await verify(client, later, sid) is Verdict.ABSENT
    # Within the clock-skew allowance it counts.
    close = make_entry("again", last_attempt_at=now_rfc3339(client.clock_skew / 2))
    assert await verify(client, close, sid) is Verdict.DELIVERED


async def test_verify_reads_every_page_of_a_paginated_transcript(fake, client):
    fake.honour_message_id = False
    fake.page_size = 2
    sid = fake.create_session()
    entry = make_entry("first")
    for text in ("first", "second", "third"):  # 3 user + 3 assistant messages: 3 pages
        await deliver(client, entry.evolve(text=text, id=new_entry_id()), sid)
    assert await verify(client, entry, sid) is Verdict.DELIVERED
    assert len([r for r in fake.requests if r.path.startswith(f"/session/{sid}/message?")]) == 2
    assert await verify(client, make_entry("fourth"), sid) is Verdict.ABSENT


async def test_verify_our_id_with_other_text_is_inconclusive(fake, client):
    sid = fake.create_session()
    entry = make_entry("one")
    await deliver(client, entry, sid)
    assert await verify(client, entry.evolve(text="two"), sid) is Verdict.INCONCLUSIVE


async def test_verify_does_not_take_the_agent_s_own_words_for_the_prompt(fake, client):
    """Only a *user* message is a prompt the session received: an assistant message that
    says the prompt's text word for word, inside the send window, does not make a prompt
    never sent delivered (docs/howto/deliverer.md)."""
    fake.honour_message_id = False
    sid = fake.create_session()
    await deliver(client, make_entry("hello"), sid)
    entry = make_entry("say it back")
    reply = next(m for m in fake.messages(sid) if m["info"]["role"] == "assistant")
    text_part = {"type": "text", "text": entry.text}
    echo = {
        "info": {**reply["info"], "id": "msg_echo", "time": {"created": int(time.time() * 1000)}},
        "parts": [text_part],
    }
    fake.messages(sid).append(echo)
    assert await verify(client, entry, sid) is Verdict.ABSENT


async def test_verify_server_down_is_inconclusive(fake, client):
    sid = fake.create_session()
    await fake.stop()
    assert await verify(client, make_entry(), sid) is Verdict.INCONCLUSIVE


@pytest.mark.parametrize(
    "faults",
    [
        {"get_message": Fault(status=500)},
        {"get_message": Fault(body=b"<html>")},
        {"get_message": Fault(cut="before_store")},
        {"get_message": Fault(delay=5)},  # longer than verify_timeout
        {"list_messages": Fault(status=500)},
        {"list_messages": Fault(body=b"<html>")},
        {"list_messages": Fault(body=b'{"not": "a list"}')},
        {"list_messages": Fault(body=b'[{"info": "x"}]')},
        {"list_messages": Fault(delay=5)},
    ],
)
async def test_verify_inconclusive_on_errors_timeouts_and_odd_shapes(fake, faults):
    sid = fake.create_session()
    c = OpencodeClient(fake.base_url, verify_timeout=0.3)
    fake.faults.update(faults)
    try:
        assert await verify(c, make_entry(), sid) is Verdict.INCONCLUSIVE
    finally:
        await c.aclose()


async def test_verify_unknown_session_is_inconclusive(fake, client):
    assert await verify(client, make_entry(), "ses_unknown") is Verdict.INCONCLUSIVE


# --- auth and clients ---------------------------------------------------------------------


async def test_basic_auth_header_is_sent():
    async with FakeOpencode(password="s3cret", username="bob") as fake:
        sid = fake.create_session()
        good = OpencodeClient(fake.base_url, username="bob", password="s3cret")
        bad = OpencodeClient(fake.base_url, password="s3cret")
        try:
            entry = make_entry()
            await deliver(good, entry, sid)
            expected = "Basic " + base64.b64encode(b"bob:s3cret").decode()
            assert fake.requests[-1].headers["authorization"] == expected
            assert await verify(good, entry, sid) is Verdict.DELIVERED
            with pytest.raises(OpencodeHTTPError) as info:
                await deliver(bad, make_entry(), sid)
            assert info.value.status == 401
            assert await verify(bad, entry, sid) is Verdict.INCONCLUSIVE
        finally:
            await good.aclose()
            await bad.aclose()


async def test_one_httpx_client_per_event_loop(client):
    here = client._client()
    assert client._client() is here
    seen = {}

    def other_loop():
        async def use():
            seen["client"] = client._client()
            await client.aclose()

        asyncio.run(use())

    thread = threading.Thread(target=other_loop)
    thread.start()
    thread.join()
    assert seen["client"] is not here
    assert seen["client"].is_closed
    assert not here.is_closed


# --- settings-driven functions --------------------------------------------------------------

ROUTES: dict[str, str] = {}


def route_workspace(workspace_id: str) -> str | None:
    return ROUTES.get(workspace_id)


async def test_settings_functions_deliver_and_verify(fake):
    sid = fake.create_session()
    entry = make_entry()
    with override_settings(OUTBOX={"OPENCODE": {"BASE_URL": fake.base_url + "/"}}):
        await opencode.deliver(entry, workspace_id="w1", session_id=sid, attempt=1)
        assert await opencode.verify(entry, workspace_id="w1", session_id=sid) is Verdict.DELIVERED
        c = await opencode.client_for("w1")
        assert c is await opencode.client_for("w2")
        assert (c.base_url, c.username, c.password) == (fake.base_url, "opencode", None)
        assert (c.connect_timeout, c.timeout) == (5.0, 600.0)
        await opencode.aclose()
    assert fake.user_texts(sid) == [["hello"]]


@pytest.mark.parametrize(
    "routes",
    [
        lambda url: {"w2": url},
        lambda url: lambda ws: url if ws == "w2" else None,
        lambda url: "tests.opencode.test_opencode.route_workspace",
    ],
    ids=["dict", "callable", "dotted-path"],
)
async def test_workspace_urls_route_to_each_agent(fake, routes):
    async with FakeOpencode() as other:
        ROUTES["w2"] = other.base_url
        s1, s2 = fake.create_session(), other.create_session()
        config = {"BASE_URL": fake.base_url, "WORKSPACE_URLS": routes(other.base_url)}
        try:
            with override_settings(OUTBOX={"OPENCODE": config}):
                await opencode.deliver(
                    make_entry("one"), workspace_id="w1", session_id=s1, attempt=1
                )
                await opencode.deliver(
                    make_entry("two"), workspace_id="w2", session_id=s2, attempt=1
                )
                await opencode.aclose()
        finally:
            ROUTES.clear()
        assert fake.user_texts(s1) == [["one"]]
        assert other.user_texts(s2) == [["two"]]


async def test_async_workspace_url_callable(fake):
    async def lookup(workspace_id):
        await asyncio.sleep(0)
        return fake.base_url

    with override_settings(OUTBOX={"OPENCODE": {"WORKSPACE_URLS": lookup}}):
        assert (await opencode.client_for("w9")).base_url == fake.base_url


async def test_settings_change_rebuilds_clients(fake):
    with override_settings(OUTBOX={"OPENCODE": {"BASE_URL": fake.base_url}}):
        first = await opencode.client_for("w1")
        first._client()  # opened on this loop
    with override_settings(
        OUTBOX={
            "DELIVERY_TIMEOUT": timedelta(seconds=42),
            "OPENCODE": {"BASE_URL": fake.base_url, "PASSWORD": "pw", "CONNECT_TIMEOUT": 1.5},
        }
    ):
        second = await opencode.client_for("w1")
        assert second is not first
        assert (second.password, second.timeout, second.connect_timeout) == ("pw", 42.0, 1.5)
        assert opencode._made.retired == [first]
        await opencode.aclose()
        assert opencode._made.retired == []
        assert not first.has_clients


async def test_clients_are_rebuilt_whenever_conf_rebuilds_its_settings(fake):
    """The client cache follows conf.py's settings object: one reset drives both."""
    from django_outbox import conf

    with override_settings(OUTBOX={"OPENCODE": {"BASE_URL": fake.base_url}}):
        first = await opencode.client_for("w1")
        assert await opencode.client_for("w1") is first
        first._client()  # opened on this loop
        conf.reset()
        second = await opencode.client_for("w1")
        assert second is not first and second.base_url == first.base_url
        assert opencode._made.retired == [first]
        await opencode.aclose()
        assert not first.has_clients


@pytest.mark.parametrize(
    ("outbox", "key"),
    [
        ({}, "OUTBOX['OPENCODE']"),
        ({"OPENCODE": "http://x"}, "OUTBOX['OPENCODE']"),
        ({"OPENCODE": {}}, "'BASE_URL'"),
        ({"OPENCODE": {"BASE_URL": "ftp://x"}}, "'BASE_URL'"),
        ({"OPENCODE": {"BASE_URL": 4096}}, "'BASE_URL'"),
        ({"OPENCODE": {"BASE_URL": "http://x", "PASWORD": "typo"}}, "PASWORD"),
        ({"OPENCODE": {"BASE_URL": "http://x", "USERNAME": ""}}, "'USERNAME'"),
        ({"OPENCODE": {"BASE_URL": "http://x", "PASSWORD": 123}}, "'PASSWORD'"),
        ({"OPENCODE": {"BASE_URL": "http://x", "TIMEOUT": 0}}, "'TIMEOUT'"),
        ({"OPENCODE": {"BASE_URL": "http://x", "CONNECT_TIMEOUT": "5"}}, "'CONNECT_TIMEOUT'"),
        ({"OPENCODE": {"BASE_URL": "http://x", "CLOCK_SKEW": -1}}, "'CLOCK_SKEW'"),
        ({"OPENCODE": {"WORKSPACE_URLS": 5}}, "'WORKSPACE_URLS'"),
        ({"OPENCODE": {"WORKSPACE_URLS": "tests.nope.route"}}, "'WORKSPACE_URLS'"),
        ({"OPENCODE": {"WORKSPACE_URLS": {"w1": "not a url"}}}, "'WORKSPACE_URLS'"),
        ({"OPENCODE": {"WORKSPACE_URLS": {"w2": "http://x"}}}, "'w1'"),  # no URL for w1
        ({"OPENCODE": {"WORKSPACE_URLS": lambda ws: "nope"}}, "'WORKSPACE_URLS'"),
    ],
)
async def test_bad_settings_raise_improperly_configured(outbox, key):
    with override_settings(OUTBOX=outbox):
        with pytest.raises(ImproperlyConfigured) as info:
            await opencode.deliver(make_entry(), workspace_id="w1", session_id="ses_1", attempt=1)
        assert key in str(info.value)
        with pytest.raises(ImproperlyConfigured):
            await opencode.verify(make_entry(), workspace_id="w1", session_id="ses_1")


# --- end to end through the outbox ----------------------------------------------------------


async def test_outbox_turn_longer_than_delivery_timeout_verifies_delivered(
    fake, client, make_outbox, signals_log
):
    """The seed's case: the POST times out mid-turn, the message is in the transcript."""
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(delay=math.inf)  # the turn never ends
    ob = make_outbox(
        deliverer=client.deliver,
        verifier=client.verify,
        delivery_timeout=1,
        verify_delay=0,
        verify_backoff=0.1,
        max_verify_backoff=0.5,
        retry_backoff=0.05,
        max_backoff=0.2,
    )
    try:
        entry = await ob.aaccept("w1", sid, user_id="u", client_message_id="k1", text="hi there")
        started = time.monotonic()
        assert await ob.adeliver_once("w1", sid)
        assert 0.9 < time.monotonic() - started < 3
        (e,) = await ob.alist("w1", sid)
        assert e.status is Status.VERIFYING
        assert "timed out" in e.last_error
        assert signals_log.ids("delivered") == []
        assert await ob.adeliver_once("w1", sid)
        assert await ob.alist("w1", sid) == []
        assert signals_log.ids("delivered") == [entry.id]
        assert not await ob.adeliver_once("w1", sid)
        assert signals_log.ids("delivered") == [entry.id]
        user = [m for m in fake.messages(sid) if m["info"]["role"] == "user"]
        assert [m["info"]["id"] for m in user] == [message_id_for(entry)]
        assert fake.user_texts(sid) == [["hi there"]]
    finally:
        await ob.aclose()


async def test_outbox_cut_before_store_resends_once(fake, client, make_outbox, signals_log):
    """Ambiguous, verified ABSENT, sent again: one message in the transcript, one signal."""
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(cut="before_store")
    ob = make_outbox(
        deliverer=client.deliver,
        verifier=client.verify,
        verify_delay=0,
        verify_backoff=0.05,
        max_verify_backoff=0.2,
        retry_backoff=0,
        max_backoff=0.2,
    )
    try:
        entry = await ob.aaccept("w1", sid, user_id="u", client_message_id="k1", text="hi")
        assert await ob.adeliver_once("w1", sid)
        assert [e.status for e in await ob.alist("w1", sid)] == [Status.VERIFYING]
        fake.faults.clear()
        assert await ob.adeliver_once("w1", sid)  # verify: ABSENT -> pending
        (e,) = await ob.alist("w1", sid)
        assert (e.status, e.attempts) == (Status.PENDING, 1)
        for _ in range(20):
            if await ob.adeliver_once("w1", sid):
                break
            await asyncio.sleep(0.05)
        assert await ob.alist("w1", sid) == []
        assert signals_log.ids("delivered") == [entry.id]
        assert fake.user_texts(sid) == [["hi"]]
    finally:
        await ob.aclose()


# --- the aborter (docs/howto/cutting.md) ------------------------------------------------


async def test_abort_ends_the_running_turn_and_the_delivery_returns(fake, client):
    """``POST /session/{id}/abort`` on the (fake) agent ends the turn a delivery waits on;
    an abort with no turn running is harmless; an unknown session is an HTTP error."""
    sid = fake.create_session()
    fake.faults["post_message"] = Fault(delay=math.inf)
    entry = make_entry("a long turn")
    delivery = asyncio.ensure_future(deliver(client, entry, sid))
    deadline = time.monotonic() + 10
    while not fake.user_texts(sid):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)
    await client.abort(entry, workspace_id="w1", session_id=sid)
    await asyncio.wait_for(delivery, 5)  # the turn ended: opencode answered the POST
    aborts = [(r.method, r.path) for r in fake.requests if r.path.endswith("/abort")]
    assert aborts == [("POST", f"/session/{sid}/abort")]
    await client.abort(entry, workspace_id="w1", session_id=sid)  # nothing runs: still 200
    with pytest.raises(OpencodeHTTPError) as info:
        await client.abort(entry, workspace_id="w1", session_id="ses_unknown")
    assert info.value.status == 404


async def test_an_error_body_of_exactly_500_characters_is_kept_uncut(fake, client):
    """The error's excerpt keeps 500 characters (not bytes: two-byte letters here) and marks
    only a longer body cut with "..."."""
    sid = fake.create_session()
    whole = "é" * 500
    fake.faults["post_message"] = Fault(status=400, body=whole.encode())
    with pytest.raises(OpencodeHTTPError) as info:
        await deliver(client, make_entry(), sid)
    assert info.value.body == whole
    fake.faults["post_message"] = Fault(status=400, body=(whole + "é").encode())
    with pytest.raises(OpencodeHTTPError) as info:
        await deliver(client, make_entry(), sid)
    assert info.value.body == whole + "..."
