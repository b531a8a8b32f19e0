"""The generic HTTP agent (docs/howto/agents.md#the-http-agent) against a real HTTP server on
loopback (tests/support/http_agent.py): every row of its outcome table, through the outbox's
delivery step, and its verify and abort calls."""

import asyncio
import email.utils
import time

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_outbox import Status, Verdict
from django_outbox.core.agents import Agent
from django_outbox.core.entry import parse_time
from django_outbox.delivery import http
from tests.support.http_agent import AgentServer
from tests.support.valkey import free_port

WS = "w1"
TOKEN = "s3cr3t-t0ken-for-the-agent"


@pytest.fixture
def server():
    agent = AgentServer().start()
    yield agent
    agent.stop()


def options(server, **extra):
    return {
        "SEND_URL": server.url + "/w/{workspace_id}/s/{session_id}/prompts",
        "VERIFY_URL": server.url + "/prompts/{idempotency_key}",
        "ABORT_URL": server.url + "/w/{workspace_id}/s/{session_id}/abort",
        "HEADERS": {"Authorization": f"Bearer {TOKEN}"},
        "TIMEOUT": 5,
        "VERIFY_TIMEOUT": 5,
        **extra,
    }


def http_agent(name, opts):
    return Agent(name, http.deliver, http.verify, http.abort, opts)


@pytest.fixture
async def outbox_with(make_outbox):
    """``outbox_with(options)``: an outbox whose one agent is the HTTP agent with them;
    verifications are due at once, retries and holds of ``Retry-After: 0`` after 0.05 s."""
    made = []

    def make(opts, **tunables):
        outbox = make_outbox(
            agents={"web": http_agent("web", opts)},
            retry_backoff=0.05,
            max_backoff=0.1,
            verify_delay=0,
            verify_backoff=0.05,
            max_verify_backoff=0.1,
            hold_floor=0.05,
            **tunables,
        )
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        await outbox.aclose()
    await http.aclose()


async def only(outbox, ses="s1"):
    [entry] = await outbox.alist(WS, ses)
    return entry


async def accept(outbox, ses="s1", text="hello", key="k1", **kwargs):
    return await outbox.aaccept(WS, ses, user_id="u", client_message_id=key, text=text, **kwargs)


# --- 2xx -------------------------------------------------------------------------------


async def test_a_prompt_is_posted_with_its_idempotency_key_headers_and_body(server, outbox_with):
    body = {"input": {"prompt": "{text}", "model": "{model}"}, "tag": "{session_id}:{entry_id}"}
    outbox = outbox_with(options(server, BODY=body))
    entry = await accept(outbox, ses="ses.1", model={"id": "m", "n": [1, 2]})
    assert await outbox.adeliver_once(WS, "ses.1")
    assert await outbox.alist(WS, "ses.1") == []
    [(path, headers, sent)] = server.prompts()
    assert path == "/w/w1/s/ses.1/prompts"
    assert headers["idempotency-key"] == entry.id
    assert headers["authorization"] == f"Bearer {TOKEN}"
    assert headers["content-type"] == "application/json"
    assert sent == {
        "input": {"prompt": "hello", "model": {"id": "m", "n": [1, 2]}},
        "tag": f"ses.1:{entry.id}",
    }


async def test_the_default_body_carries_every_placeholder(server, outbox_with):
    outbox = outbox_with(options(server))
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    [(_, _, sent)] = server.prompts()
    assert sent == {
        "entry_id": entry.id,
        "idempotency_key": entry.id,
        "workspace_id": WS,
        "session_id": "s1",
        "text": "hello",
        "parts": ["hello"],
        "model": None,
    }


async def test_a_merged_delivery_carries_every_prompt_and_is_verified_whole(server, outbox_with):
    """Merge prompts reach the HTTP agent in one request: ``{parts}`` lists each text in
    queue order and ``{text}`` joins them, so a ``BODY`` written before merging existed
    (``{text}`` alone) still carries every prompt; a cut answer is verified for the
    group (the head's key) and nothing is sent twice."""
    body = {"prompt": "{text}", "each": "{parts}"}
    server.plan = ["drop_after"]
    outbox = outbox_with(options(server, BODY=body))
    head = await accept(outbox, key="k1", text="alpha", if_busy="merge")
    await accept(outbox, key="k2", text="beta", if_busy="merge")
    await accept(outbox, key="k3", text="gamma", if_busy="merge")
    while await outbox.adeliver_once(WS, "s1"):
        pass
    assert await outbox.alist(WS, "s1") == []
    [(_, headers, sent)] = server.prompts()
    assert sent == {"prompt": "alpha\n\nbeta\n\ngamma", "each": ["alpha", "beta", "gamma"]}
    assert headers["idempotency-key"] == head.id
    assert server.runs == [head.id]


# --- nothing sent: transient ---------------------------------------------------------------


async def test_a_refused_connection_is_transient_and_uses_no_attempt(outbox_with):
    port = free_port()
    outbox = outbox_with(
        {"SEND_URL": f"http://127.0.0.1:{port}/p", "VERIFY_URL": f"http://127.0.0.1:{port}/v"}
    )
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    entry = await only(outbox)
    assert entry.status is Status.PENDING
    assert (entry.attempts, entry.transient_fails) == (0, 1)
    assert "could not connect" in entry.last_error


# --- maybe sent: verified, never resent ------------------------------------------------------


async def test_a_server_that_takes_the_prompt_then_drops_the_connection_is_verified_not_resent(
    server, outbox_with
):
    server.plan = ["drop_after"]
    outbox = outbox_with(options(server))
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    cut = await only(outbox)
    assert cut.status is Status.VERIFYING and cut.attempts == 0
    assert cut.last_error.startswith("ambiguous: sent to")
    assert await outbox.adeliver_once(WS, "s1")  # the verification: GET answers 200
    assert await outbox.alist(WS, "s1") == []
    assert len(server.prompts()) == 1 and server.runs == [entry.id]
    gets = [r for r in server.requests if r[0] == "GET"]
    assert [path for _, path, _, _ in gets] == [f"/prompts/{entry.id}"]
    assert gets[0][2]["authorization"] == f"Bearer {TOKEN}"


async def test_a_send_that_outlasts_its_timeout_is_verified(server, outbox_with):
    server.plan = ["slow"]
    outbox = outbox_with(options(server, TIMEOUT=0.5))
    await accept(outbox)
    started = time.monotonic()
    assert await outbox.adeliver_once(WS, "s1")
    assert time.monotonic() - started < 3
    entry = await only(outbox)
    assert entry.status is Status.VERIFYING
    assert "no whole answer" in entry.last_error and "0.5s" in entry.last_error
    assert await outbox.adeliver_once(WS, "s1")
    assert await outbox.alist(WS, "s1") == [] and len(server.prompts()) == 1


async def test_a_slow_drip_does_not_outlive_the_total_deadline(server, outbox_with):
    server.plan = ["drip"]  # 500 and a body of one byte every 0.2 s
    outbox = outbox_with(options(server, TIMEOUT=1))
    await accept(outbox)
    started = time.monotonic()
    assert await outbox.adeliver_once(WS, "s1")
    assert time.monotonic() - started < 3
    assert (await only(outbox)).status is Status.VERIFYING


@pytest.mark.parametrize("status", [502, 504, 500, 503])
async def test_a_gateway_or_server_error_is_ambiguous_and_absent_means_send_again(
    server, outbox_with, status
):
    server.plan = [("status", status, {}, b'{"error": "upstream"}')]
    outbox = outbox_with(options(server))
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    cut = await only(outbox)
    assert cut.status is Status.VERIFYING
    assert f"HTTP {status}" in cut.last_error and "upstream" in cut.last_error
    assert await outbox.adeliver_once(WS, "s1")  # GET: 404, nothing stored → absent
    absent = await only(outbox)
    assert absent.status is Status.PENDING and absent.attempts == 1
    await asyncio.sleep(0.1)  # RETRY_BACKOFF
    assert await outbox.adeliver_once(WS, "s1")
    assert await outbox.alist(WS, "s1") == []
    keys = [headers["idempotency-key"] for _, headers, _ in server.prompts()]
    assert keys == [entry.id, entry.id] and server.runs == [entry.id]


# --- held: 429/503 with Retry-After ------------------------------------------------------------


async def test_a_429_with_retry_after_holds_the_session_without_an_attempt(server, outbox_with):
    server.plan = [("status", 429, {"Retry-After": "1"}, b"slow down")]
    outbox = outbox_with(options(server))
    first = await accept(outbox, key="k1", text="first")
    await accept(outbox, key="k2", text="second")
    started = time.monotonic()
    assert await outbox.adeliver_once(WS, "s1")
    took = time.monotonic() - started
    held, behind = await outbox.alist(WS, "s1")
    assert held.id == first.id and held.status is Status.PENDING
    assert (held.attempts, held.transient_fails, held.holds) == (0, 0, 1)
    assert held.last_error.startswith("held for 1s")
    # Due 1 s after the answer: from the attempt's start, 1 s plus the call's own time
    # (however long a loaded machine makes it), give or take the clocks' milliseconds.
    wait = (parse_time(held.next_attempt_at) - parse_time(held.last_attempt_at)) / 1e6
    assert 0.95 <= wait <= 1.0 + took + 0.05, (wait, took)
    assert behind.status is Status.PENDING and not await outbox.adeliver_once(WS, "s1")
    deadline = time.monotonic() + 5
    while not await outbox.adeliver_once(WS, "s1"):  # due again after the Retry-After
        assert time.monotonic() < deadline, "the held prompt never became due"
        await asyncio.sleep(0.05)
    assert await outbox.adeliver_once(WS, "s1")
    assert await outbox.alist(WS, "s1") == []
    assert [sent["text"] for _, _, sent in server.prompts()] == ["first", "first", "second"]


async def test_a_503_with_an_http_date_retry_after_holds(server, outbox_with):
    when = email.utils.formatdate(time.time() + 120, usegmt=True)
    server.plan = [("status", 503, {"Retry-After": when}, b"")]
    outbox = outbox_with(options(server))
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    held = await only(outbox)
    assert held.holds == 1 and held.attempts == 0
    wait = (parse_time(held.next_attempt_at) - parse_time(held.last_attempt_at)) / 1e6
    assert 110 <= wait <= 122


# --- refused: failed ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        (("status", 400, {}, b'{"detail": "bad prompt"}'), "HTTP 400"),
        (("status", 429, {}, b"no retry-after"), "HTTP 429"),
        (("status", 401, {}, b""), "HTTP 401"),
        (("redirect", 302, "/elsewhere"), "does not follow"),
    ],
)
async def test_a_refusal_is_a_failed_attempt(server, outbox_with, answer, text):
    server.plan = [answer]
    outbox = outbox_with(options(server))
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    entry = await only(outbox)
    assert entry.status is Status.PENDING and entry.attempts == 1
    assert entry.transient_fails == 0 and entry.holds == 0
    assert text in entry.last_error and "HttpAgentError" in entry.last_error


async def test_a_redirect_to_another_origin_is_refused_and_sends_nothing_there(server, outbox_with):
    other = AgentServer().start()
    try:
        server.plan = [("redirect", 307, other.url + "/w/w1/s/s1/prompts")]
        outbox = outbox_with(options(server))
        await accept(outbox)
        assert await outbox.adeliver_once(WS, "s1")
        entry = await only(outbox)
        assert entry.attempts == 1 and "another origin" in entry.last_error
        assert other.requests == []
    finally:
        other.stop()


async def test_a_redirect_on_the_same_origin_is_followed_with_the_same_request(server, outbox_with):
    server.plan = [("redirect", 308, "/w/w1/s/moved/prompts")]
    outbox = outbox_with(options(server))
    entry = await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    assert await outbox.alist(WS, "s1") == []
    paths = [path for path, _, _ in server.prompts()]
    assert paths == ["/w/w1/s/s1/prompts", "/w/w1/s/moved/prompts"]
    assert server.runs == [entry.id]


async def test_a_huge_error_answer_is_read_only_up_to_the_bound(server, outbox_with):
    server.plan = ["huge"]
    outbox = outbox_with(options(server, MAX_RESPONSE_BYTES=1024))
    await accept(outbox)
    started = time.monotonic()
    assert await outbox.adeliver_once(WS, "s1")
    assert time.monotonic() - started < 3
    entry = await only(outbox)
    assert entry.attempts == 1 and "HTTP 400" in entry.last_error
    assert len(entry.last_error) < 700
    # The server could write what the sockets buffer, never the 64 MiB.
    assert server.written < 16 * 1024 * 1024


async def test_credentials_never_show_in_an_error(server, outbox_with):
    echo = f'{{"error": "token {TOKEN} is not allowed"}}'.encode()
    server.plan = [("status", 403, {}, echo)]
    outbox = outbox_with(options(server))
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    entry = await only(outbox)
    assert "HTTP 403" in entry.last_error and TOKEN not in entry.last_error


# --- verify and abort called directly -------------------------------------------------------


async def test_verify_reads_200_as_delivered_404_as_absent_and_the_rest_as_inconclusive(server):
    agent = http.HttpAgent("web", http.HttpAgentSettings.parse("web", options(server)))
    from django_outbox.core.entry import Entry

    entry = Entry(id="e1", client_message_id="k", user_id="u", text="t", accepted_at="x")
    server.stored["e1"] = {}

    async def verdict(*behaviour):
        server.verify_plan = list(behaviour)
        return await agent.verify(entry, workspace_id=WS, session_id="s1")

    assert await verdict("lookup") is Verdict.DELIVERED
    assert await verdict(("status", 404, {}, b"")) is Verdict.ABSENT
    assert await verdict(("status", 204, {}, b"")) is Verdict.INCONCLUSIVE
    assert await verdict(("status", 500, {}, b"")) is Verdict.INCONCLUSIVE
    assert await verdict("drop_after") is Verdict.INCONCLUSIVE
    assert await verdict(("redirect", 302, "/prompts/e1")) is Verdict.DELIVERED  # same origin
    assert await verdict(("redirect", 302, "http://localhost:1/x")) is Verdict.INCONCLUSIVE
    gone = http.HttpAgentSettings.parse(
        "web",
        {"SEND_URL": "http://127.0.0.1:1/p", "VERIFY_URL": f"http://127.0.0.1:{free_port()}/v"},
    )
    assert (
        await http.HttpAgent("gone", gone).verify(entry, workspace_id=WS, session_id="s1")
        is Verdict.INCONCLUSIVE
    )
    await agent.aclose()


async def test_abort_posts_to_the_abort_url_and_raises_on_a_refusal(server):
    from django_outbox.core.entry import Entry

    agent = http.HttpAgent("web", http.HttpAgentSettings.parse("web", options(server)))
    entry = Entry(id="e1", client_message_id="k", user_id="u", text="t", accepted_at="x")
    await agent.abort(entry, workspace_id=WS, session_id="s1")
    [(method, path, headers, _)] = server.requests
    assert (method, path, headers["idempotency-key"]) == ("POST", "/w/w1/s/s1/abort", "e1")
    server.plan = []
    agent_refused = http.HttpAgent(
        "web",
        http.HttpAgentSettings.parse(
            "web", options(server, ABORT_URL=server.url + "/w/{workspace_id}/s/x/prompts")
        ),
    )
    server.plan = [("status", 409, {}, b"no turn running")]
    with pytest.raises(http.HttpAgentError, match="HTTP 409"):
        await agent_refused.abort(entry, workspace_id=WS, session_id="s1")
    await agent.aclose()
    await agent_refused.aclose()


# --- two agents, one worker ---------------------------------------------------------------


async def test_a_worker_delivers_two_http_agents_by_the_router(make_outbox):
    north, south = AgentServer().start(), AgentServer().start()
    try:
        outbox = make_outbox(
            agents={
                "north": http_agent("north", options(north)),
                "south": http_agent("south", options(south)),
            },
            router=lambda ws, ses: "north" if ses.startswith("n") else "south",
        )
        for i in range(3):
            for ses in ("n1", "s1", "n2"):
                await accept(outbox, ses=ses, key=f"{ses}-{i}", text=f"{ses}-{i}")
        await outbox.arun(once=True, concurrency=4, heartbeat=False)
        texts = {
            name: [b["text"] for _, _, b in srv.prompts()]
            for name, srv in (("north", north), ("south", south))
        }
        assert sorted(texts["north"]) == sorted(f"{s}-{i}" for s in ("n1", "n2") for i in range(3))
        assert texts["south"] == ["s1-0", "s1-1", "s1-2"]
        await outbox.aclose()
        await http.aclose()
    finally:
        north.stop()
        south.stop()


# --- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"SEND_URL": None}, "SEND_URL'] must be an http(s) URL template"),
        ({"SEND_URL": "ftp://x/{session_id}"}, "must be an http(s) URL template"),
        ({"SEND_URL": "http://x/{sesion_id}"}, "unknown placeholders ['sesion_id']"),
        ({"BODY": {"t": "{txt}"}}, "unknown placeholders ['txt']"),
        ({"BODY": {"t": object()}}, "must be JSON"),
        ({"HEADERS": {"Idempotency-Key": "x"}}, "must not set 'Idempotency-Key'"),
        ({"HEADERS": {"X": 1}}, "dict of str to str"),
        ({"TIMEOUT": 0}, "TIMEOUT'] must be positive"),
        ({"MAX_RESPONSE_BYTES": 0}, "MAX_RESPONSE_BYTES'] must be an integer >= 1"),
        ({"SEND_URLS": "x"}, "unknown keys ['SEND_URLS']"),
        # A client-chosen ID must never choose the host (nor the port, nor userinfo)
        ({"SEND_URL": "http://{workspace_id}:8080/p"}, "has a placeholder in its host"),
        ({"VERIFY_URL": "http://agent.{session_id}.internal/v"}, "placeholder in its host"),
        ({"ABORT_URL": "http://agent:{entry_id}/a"}, "placeholder in its host"),
        ({"SEND_URL": "http://{idempotency_key}@agent/p"}, "placeholder in its host"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(server, extra, message):
    with pytest.raises(ImproperlyConfigured) as raised:
        http.HttpAgentSettings.parse("web", options(server, **extra))
    assert message in str(raised.value) and "OUTBOX['AGENTS']['web']" in str(raised.value)


def test_the_verifier_and_the_aborter_need_their_urls(server):
    bare = {"SEND_URL": server.url + "/p"}
    http.deliver.validate_agent_options("web", bare)
    with pytest.raises(ImproperlyConfigured, match="VERIFY_URL'] is required"):
        http.verify.validate_agent_options("web", bare)
    with pytest.raises(ImproperlyConfigured, match="ABORT_URL'] is required"):
        http.abort.validate_agent_options("web", bare)


def test_retry_after_is_read_as_seconds_or_a_date():
    assert http.parse_retry_after("120") == 120
    assert http.parse_retry_after(None) is None
    assert http.parse_retry_after("soon") is None
    assert http.parse_retry_after("-3") is None
    now = 1_800_000_000
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert http.parse_retry_after(date, now=now) == 30
    assert http.parse_retry_after(email.utils.formatdate(now - 30, usegmt=True), now=now) == 0


async def test_members_read_the_http_agents_status_and_kind(server, outbox_with):
    from django_outbox.core.rules import ErrorKind, summarize_error

    server.plan = [
        ("status", 422, {}, b"nope"),
        ("status", 429, {"Retry-After": "0"}, b""),
        ("status", 502, {}, b""),
    ]
    outbox = outbox_with(options(server), max_attempts=10)
    await accept(outbox)
    kinds = []
    for _ in range(3):
        assert await outbox.adeliver_once(WS, "s1")
        summary = summarize_error((await only(outbox)).last_error)
        kinds.append((summary.kind, summary.status))
        await asyncio.sleep(0.1)
    assert kinds == [
        (ErrorKind.REJECTED, 422),
        (ErrorKind.HELD, None),
        (ErrorKind.AGENT_ERROR, 502),
    ]


def test_retry_after_may_carry_spaces_around_its_seconds():
    # HTTP trims a field value's surrounding whitespace (RFC 9110, 5.5); so does the reader.
    assert http.parse_retry_after(" 120 ") == 120
    assert http.parse_retry_after("\t7") == 7


async def test_an_error_answer_is_kept_up_to_exactly_the_bound(server, outbox_with):
    # MAX_RESPONSE_BYTES is the most read of one answer: all of it is kept, not one less.
    server.plan = [("status", 400, {}, b"0123456789ABCDEF")]
    outbox = outbox_with(options(server, MAX_RESPONSE_BYTES=10))
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    entry = await only(outbox)
    url = server.url + "/w/w1/s/s1/prompts"
    assert entry.last_error.endswith(f"HTTP 400 for {url}: 0123456789")


async def test_an_error_excerpt_of_exactly_500_characters_is_not_marked_cut(server, outbox_with):
    whole, longer = "é" * 500, "é" * 501  # characters, not bytes: 1,000 and 1,002 of them
    server.plan = [("status", 400, {}, whole.encode()), ("status", 400, {}, longer.encode())]
    outbox = outbox_with(options(server))
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    first = await only(outbox)
    assert first.last_error.endswith(": " + whole)
    await accept(outbox, ses="s2", key="k2")
    assert await outbox.adeliver_once(WS, "s2")
    second = await only(outbox, ses="s2")
    assert second.last_error.endswith(": " + whole + "...")


def test_retry_after_of_any_length_is_a_bounded_wait_and_other_digits_are_unreadable():
    # Delta-seconds are ASCII digits (RFC 9110, 10.2.3); however many an agent sends, the wait
    # is read, bounded, never an error (float(int()) overflows past ~309 digits, int() refuses
    # past 4300); a far-future date is bounded the same way.
    for digits in (16, 400, 5000):
        assert http.parse_retry_after("9" * digits) == http.LONGEST_RETRY_AFTER
    assert http.parse_retry_after("999999999") == 999_999_999
    for other in ("\u00b2", "\u0661\u0662", "\uff11\uff12", "1_000", "+5", "1.5"):
        assert http.parse_retry_after(other) is None, other
    now = 1_800_000_000
    far = "Fri, 31 Dec 9999 23:59:59 GMT"
    assert http.parse_retry_after(far, now=now) == http.LONGEST_RETRY_AFTER


async def test_a_429_with_a_retry_after_of_hundreds_of_digits_holds_for_hold_max(
    server, outbox_with
):
    server.plan = [("status", 429, {"Retry-After": "9" * 400}, b"")]
    outbox = outbox_with(options(server), hold_max=60)
    await accept(outbox)
    assert await outbox.adeliver_once(WS, "s1")
    held = await only(outbox)
    assert (held.status, held.holds, held.attempts) == (Status.PENDING, 1, 0)
    wait = (parse_time(held.next_attempt_at) - parse_time(held.last_attempt_at)) / 1e6
    assert 59 <= wait <= 61, wait


@pytest.mark.parametrize(
    "retry_after",
    ["0", "-5", "soon", email.utils.formatdate(time.time() - 3600, usegmt=True)],
    ids=["zero", "negative", "malformed", "a-past-date"],
)
async def test_an_agent_answering_retry_after_zero_is_not_hammered(
    server, make_outbox, retry_after
):
    """A 429 whose Retry-After says "now" (0, negative, unreadable, a past date) is a hold
    of at least HOLD_FLOOR (default 1 s), doubling while the agent keeps refusing: a worker
    left running sends the third request no sooner than 1 + 2 s after the first, and the
    prompt stays pending (holds end by time held, not by a count)."""
    server.plan = [("status", 429, {"Retry-After": retry_after}, b"busy")] * 50
    outbox = make_outbox(agents={"web": http_agent("web", options(server))})
    await accept(outbox)
    stop = asyncio.Event()
    worker = asyncio.create_task(outbox.arun(stop=stop, tick=0.05, heartbeat=False))
    try:
        deadline = time.monotonic() + 15
        while len(server.prompts()) < 3:
            assert time.monotonic() < deadline, f"{len(server.prompts())} requests in 15 s"
            await asyncio.sleep(0.02)
        seconds = time.monotonic()
    finally:
        stop.set()
        await worker
    sent_at = [t for t in server.sent_at]
    assert sent_at[2] - sent_at[0] >= 3 - 0.05, sent_at
    entry = await only(outbox)
    assert entry.status is Status.PENDING and entry.holds >= 3 and entry.attempts == 0
    assert seconds  # the wait above ended on the third request
    await outbox.aclose()
    await http.aclose()


# --- the Idempotency-Key follows the request ---------------------------------------------------


async def test_the_key_is_new_after_an_edit_and_after_a_retry_of_a_failure(server, outbox_with):
    """An agent that caches its first answer per key (Stripe's way, a 400 included) would
    replay a refusal forever if the key outlived the request: the key stays the same for
    every resend of one request, and an edit, or staff's retry after a definitive failure,
    makes a new request under a new key; verification asks with the key it verifies."""
    server.cache_answers = True
    server.plan = [("status", 400, {}, b"transient validation problem")] * 2
    outbox = outbox_with(options(server), max_attempts=1)
    entry = await accept(outbox, text="first wording")
    assert await outbox.adeliver_once(WS, "s1")  # 400: error / max_attempts
    failed = await only(outbox)
    assert failed.status is Status.ERROR and failed.request_key == entry.id
    # Staff press Retry: a new request, a new key; the agent refuses it anew (its plan).
    await outbox.aretry(WS, "s1", entry.id)
    assert (await only(outbox)).request_key == f"{entry.id}.1"
    assert await outbox.adeliver_once(WS, "s1")
    # The user edits the prompt: another request, another key; the agent now takes it.
    snap = await outbox.asnapshot(WS, "s1")
    await outbox.aedit(WS, "s1", entry.id, text="second wording", if_version=snap.version)
    await outbox.aretry(WS, "s1", entry.id)
    edited = await only(outbox)
    assert edited.request_key == f"{entry.id}.3"  # the edit, then the retry of its failure
    assert await outbox.adeliver_once(WS, "s1")
    assert await outbox.alist(WS, "s1") == []
    keys = [headers["idempotency-key"] for _, headers, _ in server.prompts()]
    assert keys == [entry.id, f"{entry.id}.1", f"{entry.id}.3"]
    assert server.stored[f"{entry.id}.3"]["text"] == "second wording"
    # Verification asks for the request it verifies, by URL and by header.
    verdict = await http.agent_for(http_agent("web", options(server))).verify(
        edited, workspace_id=WS, session_id="s1"
    )
    assert verdict.name == "DELIVERED"
    [get] = [r for r in server.requests if r[0] == "GET"]
    assert get[1] == f"/prompts/{entry.id}.3" and get[2]["idempotency-key"] == entry.id + ".3"


async def test_resends_of_one_request_keep_its_key(server, outbox_with):
    """A cut answer is verified, found absent, and sent again: the same request, the same
    key, so an agent that honours keys can never run it twice."""
    server.plan = ["drop_before", "ok"]
    server.verify_plan = ["lookup"]
    outbox = outbox_with(options(server))
    entry = await accept(outbox)
    deadline = time.monotonic() + 10
    while await outbox.alist(WS, "s1"):  # cut, verified absent, due again after 0.05 s
        assert time.monotonic() < deadline, "never delivered"
        if not await outbox.adeliver_once(WS, "s1"):
            await asyncio.sleep(0.01)
    keys = [headers["idempotency-key"] for _, headers, _ in server.prompts()]
    assert keys == [entry.id, entry.id]


def test_retry_after_zero_is_read_as_no_wait_not_as_unreadable():
    # "0" is a wait of none, which the reader says (None is for a value it cannot read): the
    # hold it makes waits HOLD_FLOOR either way, but a caller of parse_retry_after can tell
    # "now" from garbage.
    assert http.parse_retry_after("0") == 0.0
    assert http.parse_retry_after(" 000 ") == 0.0
