"""What each built-in backend makes of every answer an agent's HTTP side can give, one row
a case: the HTTP agent (docs/howto/http-agent.md), opencode (docs/howto/opencode.md) and
LangGraph (docs/howto/langgraph.md), each call they make (deliver, verify, abort) against a
real HTTP server on loopback that answers as the row scripts it (tests/support/scripted_http.py):
statuses, Retry-After in seconds and as a date, bodies malformed, empty, of the wrong type
or huge, a connection refused, reset mid-body, closed without a word, an answer that never
comes before or after the request went out, redirects.

A delivery row asserts the outcome the delivery step records (docs/explanation/lifecycle.md,
"What happens to a message"): delivered, transient (nothing sent, no attempt used), held
(the agent's Retry-After, no attempt used), ambiguous (maybe sent: verified, never resent)
or failed (an attempt used); the hold in seconds; words its error text must hold; that no
configured secret shows in it; and the headers every request carried. A verify row asserts
the verdict, an abort row what the call returns or raises.
"""

from __future__ import annotations

import base64
import email.utils
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from django_outbox import Status, Verdict
from django_outbox.delivery import http
from django_outbox.delivery.langgraph import (
    ENTRY_KEY,
    LangGraphClient,
    LangGraphError,
    LangGraphHTTPError,
    thread_id_for,
)
from django_outbox.delivery.opencode import OpencodeClient, OpencodeHTTPError, message_id_for
from tests.support.helpers import make_entry
from tests.support.scripted_http import Answer, BlackHole, ScriptedServer, nothing_listens

WS = "w1"
#: The credential each backend is configured with; no error text may show it.
SECRET = "tok-3f9a1c-never-shown"
ECHO = f'{{"error": "refused for {SECRET}", "detail": "said-the-agent"}}'.encode()
#: Seconds a call may take in a row where an answer or a connection never comes (each such
#: row costs this); every other row allows :data:`PATIENT` seconds, so a loaded machine
#: cannot turn its answer into a timeout.
QUICK = 1.0
PATIENT = 15.0


def reply(status: int = 200, body: bytes = b"{}", **kwargs: Any) -> Answer:
    """A JSON answer."""
    return Answer(
        status, {"Content-Type": "application/json", **kwargs.pop("headers", {})}, body, **kwargs
    )


def http_date(seconds_from_now: float) -> Callable[[], str]:
    """A ``Retry-After`` date that many seconds after the moment it is sent."""
    return lambda: email.utils.formatdate(time.time() + seconds_from_now, usegmt=True)


@pytest.fixture
def server():
    scripted = ScriptedServer().start()
    yield scripted
    scripted.stop()


@pytest.fixture
async def outbox_for(make_outbox):
    """``outbox_for(deliverer, verifier)``: an outbox delivering through them, retries
    and verifications due soon; closed at teardown."""
    made = []

    def make(deliverer, verifier):
        made.append(
            make_outbox(
                deliverer=deliverer,
                verifier=verifier,
                retry_backoff=0.05,
                max_backoff=0.1,
                verify_delay=60,
                hold_max=3600,
            )
        )
        return made[-1]

    yield make
    for outbox in made:
        await outbox.aclose()


@dataclass(frozen=True)
class Outcome:
    """What one delivery step recorded: ``kind`` (delivered, transient, held, ambiguous,
    failed), the stored error text, and the hold in seconds (held only)."""

    kind: str
    error: str = ""
    hold: float | None = None


async def deliver_once(outbox, ses: str, text: str = "hello") -> tuple[Any, Outcome]:
    """Accept one prompt, run one delivery step, and read what it recorded."""
    entry = await outbox.aaccept(WS, ses, user_id="u", client_message_id="k1", text=text)
    assert await outbox.adeliver_once(WS, ses)
    left = await outbox.alist(WS, ses)
    if not left:
        return entry, Outcome("delivered")
    [after] = left
    error = after.last_error or ""
    if after.status is Status.VERIFYING:
        return entry, Outcome("ambiguous", error)
    assert after.status is Status.PENDING, after
    if after.holds:
        # The step records the hold it was handed as "held for <seconds>s: ...".
        held = re.match(r"held for ([0-9.e+]+)s: ", error)
        assert held, error
        return entry, Outcome("held", error, float(held[1]))
    if after.transient_fails:
        assert after.attempts == 0
        return entry, Outcome("transient", error)
    assert after.attempts == 1
    return entry, Outcome("failed", error)


@dataclass(frozen=True)
class Row:
    """One case: ``routes`` (method, path pattern, answer) answer first, the backend's
    good answers after them; ``url``: where the backend is pointed instead of the server
    (``"refused"``, ``"black-hole"``); ``settings``: the backend's settings changed;
    ``kind`` and ``hold`` (within a second): the expected outcome or verdict; ``says``:
    words the error text holds; ``raises``: the exception an abort raises."""

    id: str
    routes: tuple[tuple[str, str, Answer], ...] = ()
    kind: Any = "delivered"
    hold: float | None = None
    says: tuple[str, ...] = ()
    url: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    raises: type[BaseException] | None = None


def budget(row: Row) -> float:
    """The timeout a row gives its backend: short only when it waits for nothing to come."""
    waits = row.url == "black-hole" or any(a.how in ("hang", "drip") for _, _, a in row.routes)
    return QUICK if waits else PATIENT


def rows(*table: Row):
    return pytest.mark.parametrize("row", table, ids=[row.id for row in table])


def check_outcome(row: Row, outcome: Outcome) -> None:
    assert outcome.kind == row.kind, outcome
    if row.hold is None:
        assert outcome.hold is None, outcome
    else:
        assert outcome.hold is not None and abs(outcome.hold - row.hold) <= 1.05, outcome
    for words in row.says:
        assert words in outcome.error, outcome
    assert SECRET not in outcome.error


class Place:
    """Where a row points its backend: the scripted server, or somewhere that refuses
    or never answers a connection."""

    def __init__(self, server: ScriptedServer, row: Row) -> None:
        self.hole = BlackHole() if row.url == "black-hole" else None
        if self.hole is not None:
            self.url = self.hole.url
        elif row.url == "refused":
            self.url = nothing_listens()
        else:
            self.url = server.url
        for method, pattern, answer in row.routes:
            server.on(method, pattern, answer)

    def close(self) -> None:
        if self.hole is not None:
            self.hole.close()


# === the HTTP agent ===========================================================================

HTTP_PROMPTS = r"^/w/w1/s/[^/]+/prompts$"


def http_agent(url: str, timeout: float, **settings: Any) -> http.HttpAgent:
    options = {
        "SEND_URL": url + "/w/{workspace_id}/s/{session_id}/prompts",
        "VERIFY_URL": url + "/prompts/{entry_id}",
        "ABORT_URL": url + "/w/{workspace_id}/s/{session_id}/abort",
        "HEADERS": {"Authorization": f"Bearer {SECRET}"},
        "TIMEOUT": timeout,
        "VERIFY_TIMEOUT": timeout,
        "ABORT_TIMEOUT": timeout,
        "CONNECT_TIMEOUT": timeout / 2,
        **settings,
    }
    return http.HttpAgent("web", http.HttpAgentSettings.parse("web", options))


def posted(status: int, headers: dict[str, str] | None = None, body: bytes = ECHO, **how: Any):
    return (("POST", HTTP_PROMPTS, reply(status, body, headers=headers or {}, **how)),)


HTTP_DELIVER = [
    Row("deliver-200-is-delivered", posted(200, body=b'{"ok": true}')),
    Row("deliver-201-is-delivered", posted(201)),
    Row("deliver-202-is-delivered", posted(202, body=b"")),
    Row("deliver-204-is-delivered", posted(204, body=b"")),
    Row("deliver-299-is-delivered", posted(299)),
    Row("deliver-200-with-malformed-json-is-delivered", posted(200, body=b"{not json")),
    Row("deliver-200-reset-mid-body-is-delivered", posted(200, body=b"x" * 4000, how="cut")),
    Row("deliver-300-without-location-is-failed", posted(300), "failed", says=("HTTP 300",)),
    Row("deliver-400-is-failed", posted(400), "failed", says=("HTTP 400", "said-the-agent")),
    Row("deliver-401-is-failed", posted(401), "failed", says=("HTTP 401",)),
    Row("deliver-403-is-failed", posted(403), "failed", says=("HTTP 403",)),
    Row("deliver-404-is-failed", posted(404), "failed", says=("HTTP 404",)),
    Row("deliver-408-is-failed", posted(408), "failed", says=("HTTP 408",)),
    Row("deliver-409-is-failed", posted(409), "failed", says=("HTTP 409",)),
    Row("deliver-413-is-failed", posted(413), "failed", says=("HTTP 413",)),
    Row("deliver-422-is-failed", posted(422), "failed", says=("HTTP 422",)),
    Row("deliver-425-is-failed", posted(425), "failed", says=("HTTP 425",)),
    Row("deliver-499-is-failed", posted(499), "failed", says=("HTTP 499",)),
    Row("deliver-429-without-retry-after-is-failed", posted(429), "failed", says=("HTTP 429",)),
    # A Retry-After that cannot be read still says "not now": held, the wait read as 0 and
    # HOLD_FLOOR deciding (docs/howto/agents.md#held-retry-after).
    Row(
        "deliver-429-with-unreadable-retry-after-is-held-at-the-floor",
        posted(429, {"Retry-After": "soon"}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-429-with-fractional-retry-after-is-held-at-the-floor",
        posted(429, {"Retry-After": "1.5"}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-429-with-negative-retry-after-is-held-at-the-floor",
        posted(429, {"Retry-After": "-30"}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-429-with-retry-after-seconds-is-held",
        posted(429, {"Retry-After": "7"}),
        "held",
        hold=7,
        says=("held for 7s", "HTTP 429"),
    ),
    Row(
        "deliver-429-with-retry-after-zero-is-held-for-nothing",
        posted(429, {"Retry-After": "0"}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-429-with-retry-after-padded-is-held",
        posted(429, {"Retry-After": "  12 "}),
        "held",
        hold=12,
    ),
    Row(
        "deliver-429-with-retry-after-date-is-held-until-then",
        posted(429, {"Retry-After": http_date(120)}),
        "held",
        hold=120,
    ),
    Row(
        "deliver-429-with-retry-after-date-past-is-held-for-nothing",
        posted(429, {"Retry-After": http_date(-600)}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-503-with-retry-after-is-held",
        posted(503, {"Retry-After": "30"}),
        "held",
        hold=30,
        says=("HTTP 503",),
    ),
    Row(
        "deliver-503-with-retry-after-date-is-held",
        posted(503, {"Retry-After": http_date(90)}),
        "held",
        hold=90,
    ),
    Row(
        "deliver-503-without-retry-after-is-ambiguous", posted(503), "ambiguous", says=("HTTP 503",)
    ),
    Row(
        "deliver-503-with-unreadable-retry-after-is-held-at-the-floor",
        posted(503, {"Retry-After": "later"}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-500-with-retry-after-is-ambiguous",
        posted(500, {"Retry-After": "30"}),
        "ambiguous",
        says=("HTTP 500", "said-the-agent"),
    ),
    Row(
        "deliver-502-with-retry-after-is-ambiguous",
        posted(502, {"Retry-After": "5"}),
        "ambiguous",
    ),
    Row("deliver-502-is-ambiguous", posted(502), "ambiguous", says=("HTTP 502",)),
    Row("deliver-504-is-ambiguous", posted(504), "ambiguous", says=("HTTP 504",)),
    Row("deliver-599-is-ambiguous", posted(599), "ambiguous", says=("HTTP 599",)),
    Row(
        "deliver-500-reset-mid-body-is-ambiguous",
        posted(500, body=b"half-of-an-error " * 20, how="cut"),
        "ambiguous",
        says=("HTTP 500", "half-of-an-error"),
    ),
    Row(
        "deliver-400-reset-mid-body-is-failed",
        posted(400, body=b"half-of-an-error " * 20, how="cut"),
        "failed",
        says=("HTTP 400", "half-of-an-error"),
    ),
    Row(
        "deliver-400-with-a-huge-body-is-failed-with-an-excerpt",
        posted(400, huge=8 * 1024 * 1024),
        "failed",
        says=("HTTP 400", "xxx..."),
    ),
    Row(
        "deliver-400-compressed-is-failed-without-an-excerpt",
        posted(400, {"Content-Encoding": "gzip"}, body=b"\x1f\x8bnot-read"),
        "failed",
        says=("HTTP 400",),
    ),
    Row(
        "deliver-400-whose-body-drips-past-the-deadline-is-failed",
        posted(400, body=b"slow" * 40, how="drip"),
        "failed",
        says=("HTTP 400",),
    ),
    Row(
        "deliver-429-with-retry-after-whose-body-drips-is-held",
        posted(429, {"Retry-After": "9"}, body=b"slow" * 40, how="drip"),
        "held",
        hold=9,
    ),
    Row(
        "deliver-refused-is-transient", url="refused", kind="transient", says=("could not connect",)
    ),
    Row(
        "deliver-unresolvable-host-is-transient",
        url="http://no-such-agent.invalid",
        kind="transient",
        says=("could not connect",),
    ),
    Row(
        "deliver-connect-timeout-is-transient",
        url="black-hole",
        kind="transient",
        says=("ConnectTimeout",),
    ),
    Row(
        "deliver-connect-hanging-past-the-total-deadline-is-transient",
        url="black-hole",
        kind="transient",
        settings={"CONNECT_TIMEOUT": 5},
    ),
    Row(
        "deliver-closed-without-a-word-is-ambiguous",
        posted(200, how="close"),
        "ambiguous",
        says=("sent to", "RemoteProtocolError"),
    ),
    Row("deliver-reset-without-a-word-is-ambiguous", posted(200, how="reset"), "ambiguous"),
    Row(
        "deliver-no-answer-within-the-timeout-is-ambiguous",
        posted(200, how="hang"),
        "ambiguous",
        says=("no whole answer",),
    ),
    Row(
        "deliver-307-same-origin-is-followed",
        (
            ("POST", r"/s/s1/prompts$", reply(307, headers={"Location": "/w/w1/s/moved/prompts"})),
            ("POST", r"/moved/prompts$", reply(201)),
        ),
    ),
    Row(
        "deliver-308-same-origin-to-a-429-with-retry-after-is-held",
        (
            ("POST", r"/s/s1/prompts$", reply(308, headers={"Location": "/w/w1/s/moved/prompts"})),
            ("POST", r"/moved/prompts$", reply(429, headers={"Retry-After": "4"})),
        ),
        "held",
        hold=4,
    ),
    Row(
        "deliver-302-is-failed-not-followed",
        posted(302, {"Location": "/w/w1/s/moved/prompts"}),
        "failed",
        says=("does not follow",),
    ),
    Row(
        "deliver-303-is-failed-not-followed",
        posted(303, {"Location": "/w/w1/s/moved/prompts"}),
        "failed",
        says=("does not follow",),
    ),
    Row(
        "deliver-307-to-another-origin-is-failed",
        posted(307, {"Location": "http://localhost:1/w/w1/s/s1/prompts"}),
        "failed",
        says=("another origin",),
    ),
    Row(
        "deliver-307-with-credentials-in-the-location-is-failed",
        (
            (
                "POST",
                r"/s/s1/prompts$",
                reply(307, headers={"Location": "http://u:p@127.0.0.1/w/w1/s/x/prompts"}),
            ),
        ),
        "failed",
        says=("another origin",),
    ),
    Row(
        "deliver-307-in-a-loop-is-failed",
        posted(307, {"Location": "/w/w1/s/s1/prompts"}),
        "failed",
        says=("more than 5 redirects",),
    ),
]


@rows(*HTTP_DELIVER)
async def test_http_agent_deliver(row, server, outbox_for):
    place = Place(server, row)
    server.on("POST", HTTP_PROMPTS, reply(201))
    url = row.url if row.url.startswith("http://no-such") else place.url
    agent = http_agent(url, budget(row), **row.settings)
    try:
        entry, outcome = await deliver_once(outbox_for(agent.deliver, agent.verify), "s1")
    finally:
        await agent.aclose()
        place.close()
    check_outcome(row, outcome)
    for seen in server.seen("POST", "/prompts$"):
        assert seen.headers["idempotency-key"] == entry.id
        assert seen.headers["authorization"] == f"Bearer {SECRET}"
        assert seen.headers["content-type"] == "application/json"
        assert json.loads(seen.body)["entry_id"] == entry.id


HTTP_VERIFY_PATH = r"^/prompts/"
HTTP_VERIFY = [
    Row("verify-200-is-delivered", (("GET", HTTP_VERIFY_PATH, reply(200)),), Verdict.DELIVERED),
    Row(
        "verify-200-with-malformed-json-is-delivered",
        (("GET", HTTP_VERIFY_PATH, reply(200, b"{oops")),),
        Verdict.DELIVERED,
    ),
    Row("verify-404-is-absent", (("GET", HTTP_VERIFY_PATH, reply(404)),), Verdict.ABSENT),
    Row(
        "verify-201-is-inconclusive", (("GET", HTTP_VERIFY_PATH, reply(201)),), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-204-is-inconclusive",
        (("GET", HTTP_VERIFY_PATH, reply(204, b"")),),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-410-is-inconclusive", (("GET", HTTP_VERIFY_PATH, reply(410)),), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-403-is-inconclusive", (("GET", HTTP_VERIFY_PATH, reply(403)),), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-429-is-inconclusive", (("GET", HTTP_VERIFY_PATH, reply(429)),), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-500-is-inconclusive", (("GET", HTTP_VERIFY_PATH, reply(500)),), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-503-is-inconclusive", (("GET", HTTP_VERIFY_PATH, reply(503)),), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-closed-without-a-word-is-inconclusive",
        (("GET", HTTP_VERIFY_PATH, reply(how="close")),),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-no-answer-within-the-timeout-is-inconclusive",
        (("GET", HTTP_VERIFY_PATH, reply(how="hang")),),
        Verdict.INCONCLUSIVE,
    ),
    Row("verify-refused-is-inconclusive", url="refused", kind=Verdict.INCONCLUSIVE),
    Row(
        "verify-302-same-origin-is-followed",
        (
            ("GET", r"^/prompts/[^/]+$", reply(302, headers={"Location": "/prompts/x/moved"})),
            ("GET", r"/moved$", reply(404)),
        ),
        Verdict.ABSENT,
    ),
    Row(
        "verify-301-to-another-origin-is-inconclusive",
        (("GET", HTTP_VERIFY_PATH, reply(301, headers={"Location": "http://localhost:1/p"})),),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-redirect-to-an-unparseable-location-is-inconclusive",
        (("GET", HTTP_VERIFY_PATH, reply(302, headers={"Location": "http://[::1/p"})),),
        Verdict.INCONCLUSIVE,
    ),
]


@rows(*HTTP_VERIFY)
async def test_http_agent_verify(row, server):
    place = Place(server, row)
    agent = http_agent(place.url, budget(row))
    entry = make_entry()
    try:
        verdict = await agent.verify(entry, workspace_id=WS, session_id="s1")
    finally:
        await agent.aclose()
        place.close()
    assert verdict is row.kind
    for seen in server.seen("GET", "^/prompts/"):
        assert seen.headers["authorization"] == f"Bearer {SECRET}"
        # it asks with the key of the request it verifies (docs/howto/agents.md)
        assert seen.headers["idempotency-key"] == entry.request_key
    if row.url != "refused":
        assert server.requests[0].path == f"/prompts/{entry.id}"


HTTP_ABORT_PATH = r"/abort$"
HTTP_ABORT = [
    Row("abort-200-returns", (("POST", HTTP_ABORT_PATH, reply(200)),), None),
    Row("abort-202-returns", (("POST", HTTP_ABORT_PATH, reply(202)),), None),
    Row("abort-204-returns", (("POST", HTTP_ABORT_PATH, reply(204, b"")),), None),
    Row(
        "abort-409-raises-naming-the-status",
        (("POST", HTTP_ABORT_PATH, reply(409, ECHO)),),
        raises=http.HttpAgentError,
        says=("HTTP 409", "said-the-agent"),
    ),
    Row(
        "abort-404-raises",
        (("POST", HTTP_ABORT_PATH, reply(404, ECHO)),),
        raises=http.HttpAgentError,
        says=("HTTP 404",),
    ),
    Row(
        "abort-500-raises",
        (("POST", HTTP_ABORT_PATH, reply(500, ECHO)),),
        raises=http.HttpAgentError,
        says=("HTTP 500",),
    ),
    Row(
        "abort-302-raises-not-followed",
        (("POST", HTTP_ABORT_PATH, reply(302, headers={"Location": "/elsewhere"})),),
        raises=http.HttpAgentError,
        says=("does not follow",),
    ),
    Row("abort-refused-raises-a-connect-error", url="refused", raises=httpx.ConnectError),
    Row(
        "abort-no-answer-within-the-timeout-raises",
        (("POST", HTTP_ABORT_PATH, reply(how="hang")),),
        raises=TimeoutError,
    ),
]


@rows(*HTTP_ABORT)
async def test_http_agent_abort(row, server):
    place = Place(server, row)
    agent = http_agent(place.url, budget(row))
    entry = make_entry()
    try:
        if row.raises is None:
            assert await agent.abort(entry, workspace_id=WS, session_id="s1") is None
        else:
            with pytest.raises(row.raises) as raised:
                await agent.abort(entry, workspace_id=WS, session_id="s1")
            for words in row.says:
                assert words in str(raised.value)
            assert SECRET not in str(raised.value)
    finally:
        await agent.aclose()
        place.close()
    for seen in server.seen("POST", HTTP_ABORT_PATH):
        assert seen.headers["idempotency-key"] == entry.id
        assert seen.headers["authorization"] == f"Bearer {SECRET}"
        assert json.loads(seen.body) == {
            "entry_id": entry.id,
            "workspace_id": WS,
            "session_id": "s1",
        }


# === opencode =================================================================================

OC_SESSION = "ses_outcomes"
OC_SEND = rf"^/session/{OC_SESSION}/message$"
OC_ONE = rf"^/session/{OC_SESSION}/message/msg_"
OC_LIST = rf"^/session/{OC_SESSION}/message$"


def opencode(url: str, timeout: float, **settings: Any) -> OpencodeClient:
    options = {
        "password": SECRET,
        "timeout": timeout,
        "verify_timeout": timeout,
        "connect_timeout": timeout / 2,
        "max_response_bytes": 64 * 1024,
        **settings,
    }
    return OpencodeClient(url, **options)


def sent_message(status: int, headers: dict[str, str] | None = None, body: bytes = ECHO, **how):
    return (("POST", OC_SEND, reply(status, body, headers=headers or {}, **how)),)


OPENCODE_DELIVER = [
    Row("deliver-200-is-delivered", sent_message(200, body=b'{"info": {}}')),
    Row("deliver-204-is-delivered", sent_message(204, body=b"")),
    Row("deliver-299-is-delivered", sent_message(299)),
    Row("deliver-200-with-malformed-json-is-delivered", sent_message(200, body=b"[oops")),
    Row("deliver-200-reset-mid-body-is-delivered", sent_message(200, body=b"y" * 4000, how="cut")),
    Row(
        "deliver-302-is-failed", sent_message(302, {"Location": "/x"}), "failed", says=("HTTP 302",)
    ),
    Row("deliver-400-is-failed", sent_message(400), "failed", says=("HTTP 400", "said-the-agent")),
    Row("deliver-401-is-failed", sent_message(401), "failed", says=("HTTP 401",)),
    Row("deliver-403-is-failed", sent_message(403), "failed", says=("HTTP 403",)),
    Row("deliver-404-is-failed", sent_message(404), "failed", says=("HTTP 404",)),
    Row("deliver-408-is-failed", sent_message(408), "failed", says=("HTTP 408",)),
    Row("deliver-409-is-failed", sent_message(409), "failed", says=("HTTP 409",)),
    Row("deliver-413-is-failed", sent_message(413), "failed", says=("HTTP 413",)),
    Row("deliver-422-is-failed", sent_message(422), "failed", says=("HTTP 422",)),
    Row("deliver-425-is-failed", sent_message(425), "failed", says=("HTTP 425",)),
    Row("deliver-429-is-failed", sent_message(429), "failed", says=("HTTP 429",)),
    Row(
        "deliver-429-with-retry-after-seconds-is-held",
        sent_message(429, {"Retry-After": "20"}),
        "held",
        hold=20,
        says=("held for 20s", "HTTP 429"),
    ),
    Row(
        "deliver-429-with-retry-after-date-is-held",
        sent_message(429, {"Retry-After": http_date(60)}),
        "held",
        hold=60,
    ),
    Row(
        "deliver-429-with-unreadable-retry-after-is-held-at-the-floor",
        sent_message(429, {"Retry-After": "in a while"}),
        "held",
        hold=0,
    ),
    Row(
        "deliver-503-with-retry-after-is-held",
        sent_message(503, {"Retry-After": "20"}),
        "held",
        hold=20,
        says=("HTTP 503",),
    ),
    Row("deliver-499-is-failed", sent_message(499), "failed", says=("HTTP 499",)),
    Row(
        "deliver-500-is-ambiguous",
        sent_message(500),
        "ambiguous",
        says=("HTTP 500", "said-the-agent"),
    ),
    Row("deliver-502-is-ambiguous", sent_message(502), "ambiguous", says=("HTTP 502",)),
    Row("deliver-503-is-ambiguous", sent_message(503), "ambiguous", says=("HTTP 503",)),
    Row("deliver-504-is-ambiguous", sent_message(504), "ambiguous", says=("HTTP 504",)),
    Row(
        "deliver-500-reset-mid-body-is-ambiguous",
        sent_message(500, body=b"half-of-an-error " * 20, how="cut"),
        "ambiguous",
        says=("HTTP 500", "half-of-an-error"),
    ),
    Row(
        "deliver-400-with-a-huge-body-is-failed-with-an-excerpt",
        sent_message(400, huge=8 * 1024 * 1024),
        "failed",
        says=("HTTP 400", "xxx..."),
    ),
    Row(
        "deliver-400-whose-body-drips-past-the-deadline-is-failed",
        sent_message(400, body=b"slow" * 40, how="drip"),
        "failed",
        says=("HTTP 400",),
    ),
    Row(
        "deliver-refused-is-transient", url="refused", kind="transient", says=("could not connect",)
    ),
    Row(
        "deliver-connect-timeout-is-transient",
        url="black-hole",
        kind="transient",
        says=("ConnectTimeout",),
    ),
    Row(
        "deliver-closed-without-a-word-is-ambiguous",
        sent_message(200, how="close"),
        "ambiguous",
        says=("but got no answer", "RemoteProtocolError"),
    ),
    Row("deliver-reset-without-a-word-is-ambiguous", sent_message(200, how="reset"), "ambiguous"),
    Row(
        "deliver-no-answer-within-the-timeout-is-ambiguous",
        sent_message(200, how="hang"),
        "ambiguous",
        says=("ReadTimeout",),
    ),
]


@rows(*OPENCODE_DELIVER)
async def test_opencode_deliver(row, server, outbox_for):
    place = Place(server, row)
    server.on("POST", OC_SEND, reply(200))
    client = opencode(place.url, budget(row))
    try:
        entry, outcome = await deliver_once(outbox_for(client.deliver, client.verify), OC_SESSION)
    finally:
        await client.aclose()
        place.close()
    check_outcome(row, outcome)
    basic = base64.b64encode(f"opencode:{SECRET}".encode()).decode()
    for seen in server.seen("POST", OC_SEND):
        assert seen.headers["authorization"] == f"Basic {basic}"
        assert seen.headers["content-type"] == "application/json"
        sent = json.loads(seen.body)
        assert sent["messageID"] == message_id_for(entry)
        assert sent["parts"] == [{"type": "text", "text": "hello"}]


def lazy_json(value: Any) -> Callable[[], bytes]:
    """``value`` as a JSON body made when it is sent, a ``created`` time of ``"now"`` then
    becoming a minute after the sending: the rows are made when the module is collected,
    which may be many minutes before their test runs."""

    def resolve(item: Any) -> Any:
        if isinstance(item, dict):
            return {
                key: int(time.time() * 1000) + 60_000
                if key == "created" and inner == "now"
                else resolve(inner)
                for key, inner in item.items()
            }
        if isinstance(item, list):
            return [resolve(inner) for inner in item]
        return item

    return lambda: json.dumps(resolve(value)).encode()


def transcript(*messages: dict[str, Any]) -> Callable[[], bytes]:
    return lazy_json(list(messages))


def user_message(text: str = "hello", *, id: str = "msg_other", created: Any = "now") -> dict:
    """An opencode user message; ``created="now"``: a minute after it is sent (lazy_json)."""
    info: dict[str, Any] = {"id": id, "role": "user"}
    if created is not None:
        info["time"] = {"created": created}
    return {"info": info, "parts": [{"type": "text", "text": text}]}


def looked_up(answer: Answer, listed: Answer | None = None):
    """The GET of our message answers ``answer``; the transcript ``listed`` (default: 404)."""
    routes = [("GET", OC_ONE, answer)]
    if listed is not None:
        routes.append(("GET", OC_LIST, listed))
    return tuple(routes)


NOT_FOUND = reply(404, b'{"name": "NotFoundError"}')
OPENCODE_VERIFY = [
    Row(
        "verify-our-message-with-our-text-is-delivered",
        looked_up(reply(200, lazy_json(user_message()))),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-our-message-with-another-text-is-inconclusive",
        looked_up(reply(200, lazy_json(user_message("other")))),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-our-message-from-the-assistant-is-inconclusive",
        looked_up(reply(200, json.dumps({"info": {"role": "assistant"}, "parts": []}).encode())),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-our-message-malformed-json-is-inconclusive",
        looked_up(reply(200, b'{"info": ')),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-our-message-of-the-wrong-type-is-inconclusive",
        looked_up(reply(200, b'["info", "parts"]')),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-our-message-empty-is-inconclusive",
        looked_up(reply(200, b"")),
        Verdict.INCONCLUSIVE,
    ),
    Row("verify-lookup-500-is-inconclusive", looked_up(reply(500)), Verdict.INCONCLUSIVE),
    Row("verify-lookup-401-is-inconclusive", looked_up(reply(401)), Verdict.INCONCLUSIVE),
    Row(
        "verify-lookup-cut-is-inconclusive",
        looked_up(reply(200, b"x" * 1000, how="cut")),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-lookup-no-answer-is-inconclusive",
        looked_up(reply(how="hang")),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-lookup-huge-is-inconclusive",
        looked_up(reply(200, huge=1024 * 1024)),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-lookup-compressed-is-inconclusive",
        looked_up(reply(200, lazy_json(user_message()), headers={"Content-Encoding": "gzip"})),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-an-empty-transcript-is-absent",
        looked_up(NOT_FOUND, reply(200, b"[]")),
        Verdict.ABSENT,
    ),
    Row(
        "verify-not-found-and-only-other-texts-is-absent",
        looked_up(NOT_FOUND, reply(200, transcript(user_message("other")))),
        Verdict.ABSENT,
    ),
    Row(
        "verify-not-found-and-our-text-in-the-window-is-delivered",
        looked_up(NOT_FOUND, reply(200, transcript(user_message()))),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-not-found-and-our-text-before-the-window-is-absent",
        looked_up(NOT_FOUND, reply(200, transcript(user_message(created=1_000)))),
        Verdict.ABSENT,
    ),
    Row(
        "verify-not-found-and-our-text-without-a-time-is-inconclusive",
        looked_up(NOT_FOUND, reply(200, transcript(user_message(created=None)))),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-malformed-message-is-inconclusive",
        looked_up(NOT_FOUND, reply(200, b'[{"info": "no"}]')),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-transcript-not-an-array-is-inconclusive",
        looked_up(NOT_FOUND, reply(200, b'{"messages": []}')),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-malformed-transcript-is-inconclusive",
        looked_up(NOT_FOUND, reply(200, b"[{}, ")),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-no-session-is-inconclusive",
        looked_up(NOT_FOUND, reply(404, b'{"name": "NotFoundError"}')),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-transcript-500-is-inconclusive",
        looked_up(NOT_FOUND, reply(500)),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-huge-transcript-is-inconclusive",
        looked_up(NOT_FOUND, reply(200, huge=1024 * 1024)),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-chunked-transcript-over-the-bound-is-inconclusive",
        looked_up(NOT_FOUND, reply(200, b"[" + b" " * (96 * 1024) + b"]", chunked=True)),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-not-found-and-a-chunked-transcript-within-the-bound-is-absent",
        looked_up(NOT_FOUND, reply(200, b"[" + b" " * (32 * 1024) + b"]", chunked=True)),
        Verdict.ABSENT,
    ),
    Row(
        "verify-not-found-and-a-next-page-elsewhere-is-inconclusive",
        looked_up(
            NOT_FOUND,
            reply(200, b"[]", headers={"Link": '<http://localhost:1/page2>; rel="next"'}),
        ),
        Verdict.INCONCLUSIVE,
    ),
    Row("verify-refused-is-inconclusive", url="refused", kind=Verdict.INCONCLUSIVE),
]


@rows(*OPENCODE_VERIFY)
async def test_opencode_verify(row, server):
    place = Place(server, row)
    client = opencode(place.url, budget(row))
    entry = make_entry()
    try:
        verdict = await client.verify(entry, workspace_id=WS, session_id=OC_SESSION)
    finally:
        await client.aclose()
        place.close()
    assert verdict is row.kind
    if row.url != "refused":
        assert server.requests[0].path == f"/session/{OC_SESSION}/message/{message_id_for(entry)}"
    for seen in server.requests:
        assert seen.headers["authorization"].startswith("Basic ")


OC_ABORT = rf"^/session/{OC_SESSION}/abort$"
OPENCODE_ABORT = [
    Row("abort-200-returns", (("POST", OC_ABORT, reply(200, b"true")),), None),
    Row("abort-204-returns", (("POST", OC_ABORT, reply(204, b"")),), None),
    Row(
        "abort-400-raises-naming-the-status",
        (("POST", OC_ABORT, reply(400, ECHO)),),
        raises=OpencodeHTTPError,
        says=("HTTP 400", "said-the-agent"),
    ),
    Row(
        "abort-500-raises",
        (("POST", OC_ABORT, reply(500, ECHO)),),
        raises=OpencodeHTTPError,
        says=("HTTP 500",),
    ),
    Row("abort-refused-raises-a-connect-error", url="refused", raises=httpx.ConnectError),
    Row(
        "abort-no-answer-raises-a-timeout",
        (("POST", OC_ABORT, reply(how="hang")),),
        raises=TimeoutError,  # the abort's deadline is total, as for every agent
    ),
]


@rows(*OPENCODE_ABORT)
async def test_opencode_abort(row, server):
    place = Place(server, row)
    client = opencode(place.url, budget(row))
    entry = make_entry()
    try:
        if row.raises is None:
            assert await client.abort(entry, workspace_id=WS, session_id=OC_SESSION) is None
        else:
            with pytest.raises(row.raises) as raised:
                await client.abort(entry, workspace_id=WS, session_id=OC_SESSION)
            for words in row.says:
                assert words in str(raised.value)
            assert SECRET not in str(raised.value)
    finally:
        await client.aclose()
        place.close()
    for seen in server.seen("POST", OC_ABORT):
        assert seen.headers["authorization"].startswith("Basic ")


# === LangGraph ================================================================================

LG_THREADS = r"^/threads$"
LG_RUN = r"^/threads/[^/]+/runs$"
LG_JOIN = r"^/threads/[^/]+/runs/[^/]+/join$"
LG_SEARCH = r"^/threads/[^/]+/runs\?"
LG_HISTORY = r"^/threads/[^/]+/history$"
LG_CANCEL = r"^/threads/[^/]+/runs/[^/]+/cancel\?action=interrupt$"
RUN = b'{"run_id": "run-1", "status": "pending"}'


def langgraph(url: str, timeout: float, **settings: Any) -> LangGraphClient:
    options = {
        "api_key": SECRET,
        "request_timeout": timeout,
        "timeout": timeout,
        "connect_timeout": timeout / 2,
        "max_response_bytes": 64 * 1024,
        **settings,
    }
    return LangGraphClient(url, "agent", **options)


def at(method: str, pattern: str, status: int, body: bytes = ECHO, **how: Any):
    return ((method, pattern, reply(status, body, headers=how.pop("headers", {}), **how)),)


LANGGRAPH_DELIVER = [
    Row("deliver-200-200-200-is-delivered"),
    Row("deliver-thread-201-is-delivered", at("POST", LG_THREADS, 201, b"{}")),
    Row("deliver-thread-204-empty-is-delivered", at("POST", LG_THREADS, 204, b"")),
    Row("deliver-thread-409-is-failed", at("POST", LG_THREADS, 409), "failed", says=("HTTP 409",)),
    Row("deliver-thread-400-is-failed", at("POST", LG_THREADS, 400), "failed", says=("HTTP 400",)),
    Row("deliver-thread-401-is-failed", at("POST", LG_THREADS, 401), "failed", says=("HTTP 401",)),
    Row("deliver-thread-403-is-failed", at("POST", LG_THREADS, 403), "failed"),
    Row("deliver-thread-404-is-failed", at("POST", LG_THREADS, 404), "failed"),
    Row("deliver-thread-422-is-failed", at("POST", LG_THREADS, 422), "failed"),
    Row("deliver-thread-499-is-failed", at("POST", LG_THREADS, 499), "failed"),
    Row(
        "deliver-thread-302-is-failed",
        at("POST", LG_THREADS, 302, headers={"Location": "/elsewhere"}),
        "failed",
        says=("HTTP 302",),
    ),
    Row(
        "deliver-thread-500-is-transient",
        at("POST", LG_THREADS, 500),
        "transient",
        says=("HTTP 500", "said-the-agent"),
    ),
    Row("deliver-thread-502-is-transient", at("POST", LG_THREADS, 502), "transient"),
    Row("deliver-thread-503-is-transient", at("POST", LG_THREADS, 503), "transient"),
    Row("deliver-thread-504-is-transient", at("POST", LG_THREADS, 504), "transient"),
    Row(
        "deliver-thread-malformed-json-is-transient",
        at("POST", LG_THREADS, 200, b"{nope"),
        "transient",
        says=("not JSON",),
    ),
    Row(
        "deliver-thread-huge-is-transient",
        at("POST", LG_THREADS, 200, huge=1024 * 1024),
        "transient",
    ),
    Row(
        "deliver-thread-closed-without-a-word-is-transient",
        at("POST", LG_THREADS, 200, how="close"),
        "transient",
    ),
    Row(
        "deliver-thread-no-answer-is-transient",
        at("POST", LG_THREADS, 200, how="hang"),
        "transient",
        says=("ReadTimeout",),
    ),
    Row("deliver-refused-is-transient", url="refused", kind="transient"),
    Row("deliver-connect-timeout-is-transient", url="black-hole", kind="transient"),
    Row("deliver-run-201-is-delivered", at("POST", LG_RUN, 201, RUN)),
    Row("deliver-run-299-is-delivered", at("POST", LG_RUN, 299, RUN)),
    Row("deliver-run-400-is-failed", at("POST", LG_RUN, 400), "failed", says=("HTTP 400",)),
    Row("deliver-run-404-is-failed", at("POST", LG_RUN, 404), "failed", says=("HTTP 404",)),
    Row("deliver-run-409-is-failed", at("POST", LG_RUN, 409), "failed", says=("HTTP 409",)),
    Row("deliver-run-422-is-failed", at("POST", LG_RUN, 422), "failed", says=("HTTP 422",)),
    Row("deliver-run-429-is-failed", at("POST", LG_RUN, 429), "failed", says=("HTTP 429",)),
    Row(
        "deliver-run-429-with-retry-after-seconds-is-held",
        at("POST", LG_RUN, 429, headers={"Retry-After": "15"}),
        "held",
        hold=15,
        says=("held for 15s", "HTTP 429"),
    ),
    Row(
        "deliver-run-429-with-retry-after-date-is-held",
        at("POST", LG_RUN, 429, headers={"Retry-After": http_date(60)}),
        "held",
        hold=60,
    ),
    Row(
        "deliver-run-429-with-unreadable-retry-after-is-held-at-the-floor",
        at("POST", LG_RUN, 429, headers={"Retry-After": "later"}),
        "held",
        hold=0,
        says=("HTTP 429",),
    ),
    Row(
        "deliver-run-503-with-retry-after-is-held",
        at("POST", LG_RUN, 503, headers={"Retry-After": "15"}),
        "held",
        hold=15,
    ),
    Row(
        "deliver-thread-429-with-retry-after-is-held",
        at("POST", LG_THREADS, 429, headers={"Retry-After": "5"}),
        "held",
        hold=5,
    ),
    Row(
        "deliver-thread-503-with-retry-after-is-held",
        at("POST", LG_THREADS, 503, headers={"Retry-After": "5"}),
        "held",
        hold=5,
    ),
    Row("deliver-run-499-is-failed", at("POST", LG_RUN, 499), "failed", says=("HTTP 499",)),
    Row(
        "deliver-run-500-is-ambiguous",
        at("POST", LG_RUN, 500),
        "ambiguous",
        says=("HTTP 500", "said-the-agent"),
    ),
    Row("deliver-run-502-is-ambiguous", at("POST", LG_RUN, 502), "ambiguous"),
    Row("deliver-run-503-is-ambiguous", at("POST", LG_RUN, 503), "ambiguous"),
    Row("deliver-run-504-is-ambiguous", at("POST", LG_RUN, 504), "ambiguous"),
    Row(
        "deliver-run-without-a-run-id-is-ambiguous",
        at("POST", LG_RUN, 200, b'{"status": "pending"}'),
        "ambiguous",
        says=("named no run_id",),
    ),
    Row(
        "deliver-run-with-a-run-id-not-a-string-is-ambiguous",
        at("POST", LG_RUN, 200, b'{"run_id": 7}'),
        "ambiguous",
    ),
    Row("deliver-run-empty-is-ambiguous", at("POST", LG_RUN, 200, b""), "ambiguous"),
    Row("deliver-run-a-list-is-ambiguous", at("POST", LG_RUN, 200, b"[]"), "ambiguous"),
    Row(
        "deliver-run-malformed-json-is-ambiguous",
        at("POST", LG_RUN, 200, b'{"run_id": '),
        "ambiguous",
        says=("not JSON",),
    ),
    Row(
        "deliver-run-huge-is-ambiguous",
        at("POST", LG_RUN, 200, huge=1024 * 1024),
        "ambiguous",
    ),
    Row(
        "deliver-run-cut-mid-body-is-ambiguous",
        at("POST", LG_RUN, 200, b'{"run_id": "run-1", "pad": "' + b"p" * 2000 + b'"}', how="cut"),
        "ambiguous",
    ),
    Row(
        "deliver-run-closed-without-a-word-is-ambiguous",
        at("POST", LG_RUN, 200, how="close"),
        "ambiguous",
        says=("sent a run",),
    ),
    Row(
        "deliver-run-no-answer-is-ambiguous",
        at("POST", LG_RUN, 200, how="hang"),
        "ambiguous",
    ),
    Row("deliver-join-500-is-ambiguous", at("GET", LG_JOIN, 500), "ambiguous", says=("HTTP 500",)),
    Row("deliver-join-404-is-ambiguous", at("GET", LG_JOIN, 404), "ambiguous", says=("HTTP 404",)),
    Row(
        "deliver-join-cut-mid-body-is-ambiguous",
        at("GET", LG_JOIN, 200, b"s" * 4000, how="cut"),
        "ambiguous",
        says=("waiting for it failed",),
    ),
    Row(
        "deliver-join-no-answer-is-ambiguous",
        at("GET", LG_JOIN, 200, how="hang"),
        "ambiguous",
    ),
    Row(
        "deliver-join-huge-is-delivered",
        at("GET", LG_JOIN, 200, huge=4 * 1024 * 1024),
    ),
]


@rows(*LANGGRAPH_DELIVER)
async def test_langgraph_deliver(row, server, outbox_for):
    place = Place(server, row)
    server.on("POST", LG_THREADS, reply(200, b"{}"))
    server.on("POST", LG_RUN, reply(200, RUN))
    server.on("GET", LG_JOIN, reply(200, b'{"messages": []}'))
    client = langgraph(place.url, budget(row))
    try:
        entry, outcome = await deliver_once(outbox_for(client.deliver, client.verify), "s1")
    finally:
        await client.aclose()
        place.close()
    check_outcome(row, outcome)
    thread = thread_id_for(WS, "s1")
    for seen in server.requests:
        assert seen.headers["x-api-key"] == SECRET
    for seen in server.seen("POST", LG_THREADS):
        assert json.loads(seen.body)["thread_id"] == thread
    for seen in server.seen("POST", LG_RUN):
        assert seen.path == f"/threads/{thread}/runs"
        sent = json.loads(seen.body)
        assert sent["metadata"][ENTRY_KEY] == entry.id
        assert sent["multitask_strategy"] == "enqueue"
        assert sent["input"] == {"messages": [{"role": "user", "content": "hello"}]}


def runs(*found: dict[str, Any]) -> bytes:
    return json.dumps(list(found)).encode()


def ours(status: str, entry_id: str = "ENTRY") -> dict[str, Any]:
    return {"run_id": "run-1", "status": status, "metadata": {ENTRY_KEY: entry_id}}


LANGGRAPH_VERIFY = [
    Row("verify-no-run-is-absent", at("GET", LG_SEARCH, 200, b"[]"), Verdict.ABSENT),
    Row(
        "verify-429-with-retry-after-is-inconclusive-not-a-hold",
        at("GET", LG_SEARCH, 429, headers={"Retry-After": "5"}),
        Verdict.INCONCLUSIVE,
    ),
    Row("verify-no-thread-is-absent", at("GET", LG_SEARCH, 404), Verdict.ABSENT),
    Row(
        "verify-only-other-runs-is-absent",
        at(
            "GET", LG_SEARCH, 200, runs(ours("success", "other"), {"run_id": "x", "metadata": None})
        ),
        Verdict.ABSENT,
    ),
    Row(
        "verify-a-success-run-is-delivered",
        at("GET", LG_SEARCH, 200, runs(ours("success"))),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-an-error-run-is-delivered",
        at("GET", LG_SEARCH, 200, runs(ours("error"))),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-a-pending-run-is-delivered",
        at("GET", LG_SEARCH, 200, runs(ours("pending"))),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-an-interrupted-run-that-took-its-input-is-delivered",
        at("GET", LG_SEARCH, 200, runs(ours("interrupted")))
        + at("POST", LG_HISTORY, 200, b'[{"values": {}}]'),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-an-interrupted-run-that-never-started-is-absent",
        at("GET", LG_SEARCH, 200, runs(ours("interrupted"))) + at("POST", LG_HISTORY, 200, b"[]"),
        Verdict.ABSENT,
    ),
    Row(
        "verify-an-interrupted-run-and-history-500-is-inconclusive",
        at("GET", LG_SEARCH, 200, runs(ours("interrupted"))) + at("POST", LG_HISTORY, 500),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-an-interrupted-run-and-history-not-a-list-is-inconclusive",
        at("GET", LG_SEARCH, 200, runs(ours("interrupted"))) + at("POST", LG_HISTORY, 200, b"{}"),
        Verdict.INCONCLUSIVE,
    ),
    Row("verify-search-500-is-inconclusive", at("GET", LG_SEARCH, 500), Verdict.INCONCLUSIVE),
    Row("verify-search-401-is-inconclusive", at("GET", LG_SEARCH, 401), Verdict.INCONCLUSIVE),
    Row(
        "verify-search-201-is-inconclusive", at("GET", LG_SEARCH, 201, b"[]"), Verdict.INCONCLUSIVE
    ),
    Row(
        "verify-search-not-a-list-is-inconclusive",
        at("GET", LG_SEARCH, 200, b'{"runs": []}'),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-with-a-run-not-an-object-is-inconclusive",
        at("GET", LG_SEARCH, 200, b'["run-1"]'),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-with-metadata-not-an-object-is-inconclusive",
        at("GET", LG_SEARCH, 200, b'[{"run_id": "r", "metadata": "x"}]'),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-malformed-json-is-inconclusive",
        at("GET", LG_SEARCH, 200, b"[{"),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-empty-body-is-inconclusive",
        at("GET", LG_SEARCH, 200, b""),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-huge-is-inconclusive",
        at("GET", LG_SEARCH, 200, huge=1024 * 1024),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-cut-is-inconclusive",
        at("GET", LG_SEARCH, 200, b"[" + b" " * 4000 + b"]", how="cut"),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-search-no-answer-is-inconclusive",
        at("GET", LG_SEARCH, 200, how="hang"),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-a-full-page-then-a-404-is-inconclusive",
        (
            ("GET", r"offset=100&", reply(404)),
            ("GET", LG_SEARCH, reply(200, runs(*[ours("success", "other")] * 100))),
        ),
        Verdict.INCONCLUSIVE,
    ),
    Row(
        "verify-our-run-on-the-second-page-is-delivered",
        (
            ("GET", r"offset=100&", reply(200, runs(ours("success")))),
            ("GET", LG_SEARCH, reply(200, runs(*[ours("success", "other")] * 100))),
        ),
        Verdict.DELIVERED,
    ),
    Row(
        "verify-a-short-page-ends-the-search-absent",
        (
            ("GET", r"offset=100&", reply(200, runs(ours("success")))),
            ("GET", LG_SEARCH, reply(200, runs(*[ours("success", "other")] * 99))),
        ),
        Verdict.ABSENT,
    ),
    Row("verify-refused-is-inconclusive", url="refused", kind=Verdict.INCONCLUSIVE),
]


def for_entry(routes, entry_id: str):
    """``routes`` with the placeholder entry ID ``ENTRY`` of their bodies made ``entry_id``."""
    return tuple(
        (
            m,
            p,
            Answer(
                a.status,
                a.headers,
                a.body.replace(b'"ENTRY"', f'"{entry_id}"'.encode()),
                a.how,
                a.interval,
                a.huge,
                a.chunked,
            ),
        )
        for m, p, a in routes
    )


@rows(*LANGGRAPH_VERIFY)
async def test_langgraph_verify(row, server):
    entry = make_entry()
    row = Row(row.id, for_entry(row.routes, entry.id), row.kind, url=row.url)
    place = Place(server, row)
    client = langgraph(place.url, budget(row))
    try:
        verdict, _ = Verdict.split(await client.verify(entry, workspace_id=WS, session_id="s1"))
    finally:
        await client.aclose()
        place.close()
    assert verdict is row.kind
    for seen in server.requests:
        assert seen.headers["x-api-key"] == SECRET
    for seen in server.seen("POST", LG_HISTORY):
        assert json.loads(seen.body)["metadata"] == {ENTRY_KEY: entry.id}


LANGGRAPH_ABORT = [
    Row("abort-no-run-returns-false", at("GET", LG_SEARCH, 200, b"[]"), False),
    Row(
        "abort-a-finished-run-returns-false",
        at("GET", LG_SEARCH, 200, runs(ours("success"))),
        False,
    ),
    Row(
        "abort-a-running-run-is-cancelled",
        at("GET", LG_SEARCH, 200, runs(ours("running"))) + at("POST", LG_CANCEL, 200, b"{}"),
        True,
    ),
    Row(
        "abort-a-pending-run-is-cancelled",
        at("GET", LG_SEARCH, 200, runs(ours("pending"))) + at("POST", LG_CANCEL, 204, b""),
        True,
    ),
    Row(
        "abort-a-run-gone-before-the-cancel-returns-false",
        at("GET", LG_SEARCH, 200, runs(ours("running"))) + at("POST", LG_CANCEL, 404),
        False,
    ),
    Row(
        "abort-a-cancel-409-raises",
        at("GET", LG_SEARCH, 200, runs(ours("running"))) + at("POST", LG_CANCEL, 409),
        raises=LangGraphHTTPError,
        says=("HTTP 409", "said-the-agent"),
    ),
    Row(
        "abort-a-cancel-500-raises",
        at("GET", LG_SEARCH, 200, runs(ours("running"))) + at("POST", LG_CANCEL, 500),
        raises=LangGraphHTTPError,
        says=("HTTP 500",),
    ),
    Row(
        "abort-a-cancel-cut-raises",
        at("GET", LG_SEARCH, 200, runs(ours("running"))) + at("POST", LG_CANCEL, 200, how="close"),
        raises=LangGraphError,
        says=("could not cancel",),
    ),
    Row(
        "abort-a-search-500-raises",
        at("GET", LG_SEARCH, 500),
        raises=LangGraphError,
        says=("could not find the run",),
    ),
    Row("abort-refused-raises", url="refused", raises=LangGraphError),
]


@rows(*LANGGRAPH_ABORT)
async def test_langgraph_abort(row, server):
    entry = make_entry()
    row = Row(
        row.id,
        for_entry(row.routes, entry.id),
        row.kind,
        says=row.says,
        url=row.url,
        raises=row.raises,
    )
    place = Place(server, row)
    client = langgraph(place.url, budget(row))
    try:
        if row.raises is None:
            assert await client.abort(entry, workspace_id=WS, session_id="s1") is row.kind
        else:
            with pytest.raises(row.raises) as raised:
                await client.abort(entry, workspace_id=WS, session_id="s1")
            for words in row.says:
                assert words in str(raised.value)
            assert SECRET not in str(raised.value)
    finally:
        await client.aclose()
        place.close()
    for seen in server.requests:
        assert seen.headers["x-api-key"] == SECRET
