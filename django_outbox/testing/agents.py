"""The agent conformance suite: the contract every backend keeps, checked against the real
agent (docs/howto/agents.md#what-every-agent-carries).

The outbox promises that an accepted prompt reaches the agent once, or is shown as not
delivered; it can keep that promise only if the backend keeps its side. A capability of the
queue that an agent must carry out (merged prompts, holds, verification, cuts, the
idempotency key) is checked here, once, against every backend, so it reaches every agent or
is refused for the ones that cannot carry it.

Give :class:`AgentContract` an :class:`AgentUnderTest` (how to build the backend, how to read
what the agent received, how to make a session on it) and run its checks::

    import pytest
    from django_outbox.testing.agents import AgentContract, AgentUnderTest

    @pytest.fixture
    async def contract(my_agent_server):
        under_test = AgentUnderTest(
            build=lambda url: Agent("mine", my.deliver, my.verify, my.abort,
                                    {"SEND_URL": url + "/prompts", ...}),
            received=my_agent_server.texts,        # async (workspace, session) -> [text]
            session=my_agent_server.new_session,   # async () -> (workspace, session)
            upstream=my_agent_server.url,          # over HTTP: the network checks run
        )
        async with AgentContract(under_test) as contract:
            yield contract

    @pytest.mark.parametrize("check", AgentContract.CHECKS)
    async def test_my_agent_keeps_the_contract(contract, check):
        await contract.run(check)

When the agent is reached over HTTP (``upstream`` given), the suite puts a
:class:`FaultProxy` of its own between the backend and the agent: ``build`` receives the
proxy's URL, and the proxy cuts, delays or answers the one request that carries the
check's prompt (found by a marker in the prompt's text). An in-process agent
(``upstream`` None) gets the checks that need no network. Nothing here imports Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import inspect
import itertools
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.agents import CAPABILITY_MERGE, Agent, capabilities_of, current_agent
from ..core.entry import Entry, Verdict, format_time, new_entry_id
from ..core.errors import AmbiguousError, HoldDeliveryError, TransientDeliveryError
from ..core.rules import agent_ref_json

__all__ = [
    "RETRY_AFTER_FORMS",
    "AgentContract",
    "AgentUnderTest",
    "CheckNotApplicable",
    "ContractBroken",
    "FaultProxy",
    "ProxiedRequest",
]

#: ``Retry-After`` values a hold must survive (RFC 9110 10.2.3 and what agents send in the
#: wild): seconds, an HTTP date ahead, zero, a date past, negative, unreadable, fractional,
#: and hundreds of digits. Each is a hold, never a failure and never a resend at once.
RETRY_AFTER_FORMS: dict[str, Callable[[], str]] = {
    "seconds": lambda: "7",
    "http-date": lambda: email.utils.formatdate(time.time() + 90, usegmt=True),
    "zero": lambda: "0",
    "past-date": lambda: email.utils.formatdate(time.time() - 3600, usegmt=True),
    "negative": lambda: "-30",
    "malformed": lambda: "soon",
    "fractional": lambda: "1.5",
    "huge": lambda: "9" * 400,
}
#: The longest a check waits for the agent to show what it received, in seconds.
SETTLE_SECONDS = 15.0


class CheckNotApplicable(Exception):
    """A check that does not apply to this agent (:meth:`AgentContract.applies` says why):
    the caller skips it (``pytest.skip(str(exc))``)."""


class ContractBroken(AssertionError):
    """A backend broke the contract: the message says which rule and what it did instead."""


@dataclass
class ProxiedRequest:
    """One request the :class:`FaultProxy` saw: ``method``, ``path`` (with its query),
    ``headers`` (names lower-cased), ``body`` (bytes) and ``action`` (what the proxy did:
    ``"forward"`` or the armed fault's name)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    action: str = "forward"


@dataclass
class _Fault:
    marker: bytes
    action: str
    answer: tuple[int, dict[str, str], bytes] | None = None
    #: Aimed at the request that follows the one carrying the marker (a LangGraph join, say)
    after: bool = False


class FaultProxy:
    """An HTTP/1.1 proxy on a loopback port in front of ``upstream`` (``http://host:port``),
    for fault tests: it forwards each request on a connection of its own (``Connection:
    close``) and relays the answer as it comes (a stream included), except the one request
    an armed fault matches — the first whose body contains the fault's marker:

    * ``cut_before``: the client's connection is closed and nothing is forwarded;
    * ``cut_after``: the request is forwarded whole, then the client's connection is closed
      at once (the agent got the prompt, the sender learns nothing);
    * ``lost_reply``: forwarded, the agent's answer read (up to 30 s) and thrown away, then
      the client's connection is closed;
    * ``stall``: forwarded, then nothing is answered until the proxy stops;
    * ``respond``: answered by the proxy itself (a status, headers and body), nothing
      forwarded.

    Every request is recorded in :attr:`requests`. Use it as an async context manager.
    """

    def __init__(self, upstream: str) -> None:
        scheme, _, rest = upstream.partition("://")
        if scheme != "http" or not rest:
            raise ValueError(f"the proxy forwards to http://host:port, not {upstream!r}")
        host, _, port = rest.split("/", 1)[0].rpartition(":")
        self.upstream = (host or "127.0.0.1", int(port or 80))
        self.requests: list[ProxiedRequest] = []
        self._faults: list[_Fault] = []
        self._next: _Fault | None = None
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stop = asyncio.Event()
        self.port = 0

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: give it to the backend instead of the agent's URL."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    def arm(
        self,
        marker: str,
        action: str,
        answer: tuple[int, dict[str, str], bytes] | None = None,
        *,
        after: bool = False,
    ) -> None:
        """Arm a one-shot fault for the first request whose body holds ``marker`` (with
        ``after``: for the request that follows that one, whatever it carries: a backend's
        wait for the turn, say)."""
        if action not in ("cut_before", "cut_after", "lost_reply", "stall", "respond"):
            raise ValueError(f"unknown fault {action!r}")
        if (action == "respond") != (answer is not None):
            raise ValueError("an answer goes with 'respond' only")
        self._faults.append(_Fault(marker.encode(), action, answer, after))

    def disarm(self) -> None:
        """Forget every fault armed and not met yet."""
        self._faults.clear()
        self._next = None

    def carrying(self, marker: str) -> list[ProxiedRequest]:
        """The requests whose body holds ``marker``, in order."""
        return [r for r in self.requests if marker.encode() in r.body]

    # -- serving -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            while not self._stop.is_set():
                request = await _read_request(reader)
                if request is None:
                    return
                head, body = request
                if not await self._one(head, body, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _one(self, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> bool:
        """Handle one request; False when the client's connection is done with."""
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = [*lines[0].split(" ", 2), "", ""][:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        fault = self._next
        self._next = None
        if fault is None:
            fault = next((f for f in self._faults if f.marker in body), None)
            if fault is not None:
                self._faults.remove(fault)
            if fault is not None and fault.after:  # this one passes, the next one meets it
                self._next, fault = fault, None
        self.requests.append(
            ProxiedRequest(method, path, headers, body, fault.action if fault else "forward")
        )
        if fault is not None and fault.action == "cut_before":
            return False
        if fault is not None and fault.answer is not None:
            status, extra, payload = fault.answer
            writer.write(_response_head(status, {**extra, "Content-Length": str(len(payload))}))
            writer.write(payload)
            await writer.drain()
            return True
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        try:
            upstream_writer.write(_close_after(head) + body)
            await upstream_writer.drain()
            if fault is not None and fault.action == "cut_after":
                return False
            if fault is not None and fault.action == "lost_reply":
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(upstream_reader.read(), 30)
                return False
            if fault is not None and fault.action == "stall":
                await self._stop.wait()
                return False
            answer_head = await upstream_reader.readuntil(b"\r\n\r\n")
            writer.write(_close_after(answer_head))
            while chunk := await upstream_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            return False  # the answer ran until the agent closed: so does the connection
        finally:
            with contextlib.suppress(Exception):
                upstream_writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 request: ``(head with its blank line, body)``; None at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lowered = head.lower()
    length = 0
    for line in lowered.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    if b"transfer-encoding: chunked" in lowered:
        body = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            chunk = await reader.readexactly(size + 2)
            body += chunk[:-2]
            if size == 0:
                break
        head = head.replace(b"Transfer-Encoding: chunked", b"Content-Length: %d" % len(body))
        return head, bytes(body)
    return head, await reader.readexactly(length)


def _close_after(head: bytes) -> bytes:
    """``head`` (of a request or an answer) with ``Connection: close`` in place of any
    ``Connection`` header: one exchange per connection, so the relay ends with it."""
    lines = [
        line
        for line in head[:-4].split(b"\r\n")
        if not line.lower().startswith((b"connection:", b"keep-alive:"))
    ]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def _response_head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} Proxy", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# --- the agent under test --------------------------------------------------------------------


@dataclass
class AgentUnderTest:
    """What the suite needs to know of one agent.

    ``build(url)``: the :class:`~django_outbox.core.agents.Agent` (deliverer, verifier,
    optional aborter) pointed at ``url`` — the suite's proxy in front of ``upstream``, or
    None for an agent not reached over HTTP. ``received(workspace_id, session_id)``: the
    texts of the prompts the agent holds for that session, oldest first, read from the
    agent's own record (each part of a merged message one text; sync or async).
    ``session()``: a fresh ``(workspace_id, session_id)`` the agent accepts prompts for
    (sync or async). ``upstream``: the agent's ``http://host:port``, or None.
    ``request_key(request)``: the idempotency key a :class:`ProxiedRequest` carries (None:
    the key check is skipped). ``long_text(marker)``: a prompt whose turn runs until it is
    cut (None: the Stop check is skipped). ``settle``: seconds the agent may take to show
    a prompt it received."""

    build: Callable[[str | None], Agent]
    received: Callable[[str, str], Any]
    session: Callable[[], Any]
    upstream: str | None = None
    request_key: Callable[[ProxiedRequest], str | None] | None = None
    long_text: Callable[[str], str] | None = None
    settle: float = SETTLE_SECONDS
    #: False for an agent whose turns never end on their own (``opencode serve`` with no LLM
    #: provider): a delivery that shows its prompt is then cut after :attr:`turn_cut`
    #: seconds, as the outbox's ``DELIVERY_TIMEOUT`` would, and must be verified delivered.
    turns_end: bool = True
    turn_cut: float = 3.0
    #: Extra keyword arguments of the deliverer's call, if any.
    deliver_kwargs: dict[str, Any] = field(default_factory=dict)


async def _maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


_counter = itertools.count(1)


def _marker() -> str:
    """A token no other prompt holds, so the proxy finds the check's own request."""
    return f"m{uuid.uuid4().hex[:12]}x{next(_counter)}"


def _entry(text: str, *, parts: tuple[str, ...] = (), revision: int = 0) -> Entry:
    now = int(time.time() * 1_000_000)
    return Entry(
        id=new_entry_id(now // 1000),
        client_message_id=f"c{uuid.uuid4().hex[:16]}",
        user_id="conformance",
        text=text,
        accepted_at=format_time(now),
        last_attempt_at=format_time(now),
        parts=parts,
        revision=revision,
    )


class AgentContract:
    """The checks every backend must pass, by name (:data:`CHECKS`); :meth:`run` runs one.
    Use it as an async context manager (it starts and stops its proxy). Each check raises
    :class:`ContractBroken` saying which rule the backend broke."""

    #: Every check, in the order the contract reads
    #: (docs/howto/agents.md#what-every-agent-carries).
    CHECKS = (
        "plain_delivery",
        "merged_delivery_arrives_whole",
        "never_sent_is_absent",
        "cut_before_sending_is_not_delivered",
        "cut_after_sending_is_verified",
        "lost_reply_is_verified",
        "timeout_is_verified",
        "failure_after_sending_is_verified",
        *(f"held_{code}_retry_after_{form}" for code in (429, 503) for form in RETRY_AFTER_FORMS),
        "refusal_is_definitive",
        "key_follows_the_request",
        "stop_ends_the_turn_delivered",
    )

    def __init__(self, under_test: AgentUnderTest) -> None:
        self.under_test = under_test
        self.proxy: FaultProxy | None = None
        self.agent: Agent | None = None

    async def __aenter__(self) -> AgentContract:
        if self.under_test.upstream is not None:
            self.proxy = await FaultProxy(self.under_test.upstream).__aenter__()
        self.agent = self.under_test.build(self.proxy.url if self.proxy else None)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.proxy is not None:
            await self.proxy.__aexit__(*exc)

    def applies(self, check: str) -> str | None:
        """None when ``check`` applies to this agent, else why it does not (the caller
        skips it): a network check without ``upstream``, the key check without
        ``request_key``, the Stop check without an aborter or ``long_text``."""
        local = ("plain_delivery", "merged_delivery_arrives_whole", "never_sent_is_absent")
        network = check not in local
        if network and self.proxy is None:
            return "the agent is not reached over HTTP (no upstream): no network fault to inject"
        if check == "key_follows_the_request" and self.under_test.request_key is None:
            return "no request_key reader given"
        if check == "stop_ends_the_turn_delivered":
            if self.agent is None or self.agent.aborter is None:
                return "the agent has no aborter"
            if self.under_test.long_text is None:
                return "no long_text given"
        return None

    async def run(self, check: str) -> None:
        """Run ``check`` (one of :data:`CHECKS`); raises :class:`ContractBroken`, or
        ``LookupError`` for an unknown name. A check that does not apply
        (:meth:`applies`) raises :class:`CheckNotApplicable` with the reason."""
        if check not in self.CHECKS:
            raise LookupError(f"no check {check!r}; known: {self.CHECKS}")
        why_not = self.applies(check)
        if why_not is not None:
            raise CheckNotApplicable(why_not)
        if check.startswith("held_"):
            _, status, _, _, form = check.split("_", 4)
            await self._held(int(status), form)
            return
        await getattr(self, f"_{check}")()

    # -- calling the backend ----------------------------------------------------------------

    async def _call(self, function: Callable[..., Any], entry: Entry, **kwargs: Any) -> Any:
        """``function(entry, **kwargs)`` as the worker calls it: with
        :data:`~django_outbox.core.agents.current_agent` naming the agent, awaited if async."""
        served = current_agent.set(self.agent)
        try:
            return await _maybe(function(entry, **kwargs))
        finally:
            current_agent.reset(served)

    async def _deliver(self, entry: Entry, where: tuple[str, str]) -> None:
        assert self.agent is not None and self.agent.deliverer is not None
        ids = {"workspace_id": where[0], "session_id": where[1]}
        returned = await self._call(
            self.agent.deliverer, entry, attempt=1, **ids, **self.under_test.deliver_kwargs
        )
        _expect(
            not isinstance(returned, Mapping) or _keeps(returned),
            f"the deliverer returned {returned!r}: a reference the entry keeps is a mapping "
            "of up to 8 short string members (docs/howto/deliverer.md#what-it-returns)",
        )

    async def _verify(self, entry: Entry, where: tuple[str, str]) -> Verdict:
        assert self.agent is not None
        if self.agent.verifier is None:
            raise ContractBroken("no verifier: an unknown outcome would never be decided")
        ids = {"workspace_id": where[0], "session_id": where[1]}
        verdict, ref = Verdict.split(await self._call(self.agent.verifier, entry, **ids))
        _expect(
            ref is None or (verdict is Verdict.DELIVERED and _keeps(ref)),
            f"the verifier returned the reference {ref!r} with {verdict!r}: only "
            "Verdict.DELIVERED carries one, a mapping of up to 8 short string members",
        )
        return Verdict(verdict)

    async def _outcome(self, entry: Entry, where: tuple[str, str], within: float = 60.0) -> str:
        """What the delivery call made of itself: ``delivered`` (it returned), ``transient``,
        ``ambiguous``, ``held`` (with its wait), ``timeout`` (it let its cancellation
        through) or ``failed`` (any other exception: definitive)."""
        try:
            async with asyncio.timeout(within):
                await self._deliver(entry, where)
        except TimeoutError:
            return "timeout"
        except TransientDeliveryError:
            return "transient"
        except AmbiguousError:
            return "ambiguous"
        except HoldDeliveryError as exc:
            self.last_hold = exc.retry_after
            return "held"
        except Exception as exc:  # any other error is a definitive failure
            self.last_error = exc
            return "failed"
        return "delivered"

    async def _received(self, where: tuple[str, str]) -> list[str]:
        return list(await _maybe(self.under_test.received(*where)))

    async def _shows(self, where: tuple[str, str], texts: list[str]) -> list[str]:
        """What the agent received, once it shows every one of ``texts`` (in that order, one
        after another), or after ``settle`` seconds."""
        deadline = time.monotonic() + self.under_test.settle
        while True:
            got = await self._received(where)
            if _contains_run(got, texts) or time.monotonic() > deadline:
                return got
            await asyncio.sleep(0.05)

    async def _session(self) -> tuple[str, str]:
        workspace_id, session_id = await _maybe(self.under_test.session())
        return str(workspace_id), str(session_id)

    # -- the checks ---------------------------------------------------------------------------

    async def _delivered(self, entry: Entry, where: tuple[str, str]) -> str:
        """Deliver ``entry`` with no fault: it must end delivered (or, for an agent whose
        turns never end, be cut by the deadline as the outbox would cut it)."""
        if self.under_test.turns_end:
            outcome = await self._outcome(entry, where)
            said = self._said(outcome)
            _expect(outcome == "delivered", f"a delivery with no fault ended {said}")
        else:
            outcome = await self._outcome(entry, where, within=self.under_test.turn_cut)
            _expect(
                outcome in ("delivered", "timeout", "ambiguous"),
                f"a delivery with no fault ended {self._said(outcome)}",
            )
        return outcome

    async def _plain_delivery(self) -> None:
        where, text = await self._session(), f"plain {_marker()}"
        entry = _entry(text)
        await self._delivered(entry, where)
        got = await self._shows(where, [text])
        _expect(got.count(text) == 1, f"the agent holds {got.count(text)} copies of the prompt")
        verdict = await self._verify(entry, where)
        _expect(verdict is Verdict.DELIVERED, f"a delivered prompt verified {verdict.name}")

    async def _merged_delivery_arrives_whole(self) -> None:
        assert self.agent is not None
        if CAPABILITY_MERGE not in capabilities_of(self.agent.deliverer):
            return  # it does not declare merge: the outbox refuses merge prompts for it
        where, mark = await self._session(), _marker()
        texts = [f"alpha {mark}", f"beta {mark}", f"gamma {mark}"]
        head = _entry(texts[0], parts=tuple(texts))
        await self._delivered(head, where)
        got = await self._shows(where, texts)
        _expect(
            _contains_run(got, texts),
            f"the deliverer declares 'merge' but the agent got {got!r}, not all of {texts!r}",
        )
        verdict = await self._verify(head, where)
        _expect(verdict is Verdict.DELIVERED, f"a merged delivery verified {verdict.name}")

    async def _never_sent_is_absent(self) -> None:
        where = await self._session()
        await self._plain_in(where)  # a session the agent knows, holding another prompt
        verdict = await self._verify(_entry(f"never sent {_marker()}"), where)
        _expect(verdict is Verdict.ABSENT, f"a prompt never sent verified {verdict.name}")

    async def _plain_in(self, where: tuple[str, str]) -> None:
        await self._delivered(_entry(f"before {_marker()}"), where)

    async def _faulted(self, action: str, answer: Any = None) -> tuple[Entry, tuple[str, str], str]:
        assert self.proxy is not None
        where = await self._session()
        await self._plain_in(where)  # the session exists on the agent (a thread, a transcript)
        mark = _marker()
        entry = _entry(f"faulted {mark}")
        self.proxy.arm(mark, action, answer)
        return entry, where, mark

    async def _cut_before_sending_is_not_delivered(self) -> None:
        entry, where, _ = await self._faulted("cut_before")
        outcome = await self._outcome(entry, where)
        _expect(
            outcome in ("transient", "ambiguous"),
            f"a connection closed before the prompt was sent ended {outcome}: it is neither "
            "delivered nor a definitive failure",
        )
        verdict = await self._verify(entry, where)
        _expect(verdict is Verdict.ABSENT, f"a prompt never forwarded verified {verdict.name}")

    async def _verified_after(self, action: str) -> None:
        entry, where, _ = await self._faulted(action)
        outcome = await self._outcome(entry, where)
        _expect(
            outcome == "ambiguous",
            f"a prompt the agent got but whose answer was lost ({action}) ended {outcome}, not "
            "ambiguous: it must be verified, never resent blindly nor counted as failed",
        )
        got = await self._shows(where, [entry.text])
        _expect(entry.text in got, f"the agent never showed the forwarded prompt ({action})")
        verdict = await self._verify(entry, where)
        _expect(verdict is Verdict.DELIVERED, f"a prompt the agent holds verified {verdict.name}")

    async def _cut_after_sending_is_verified(self) -> None:
        await self._verified_after("cut_after")

    async def _lost_reply_is_verified(self) -> None:
        await self._verified_after("lost_reply")

    async def _timeout_is_verified(self) -> None:
        entry, where, _ = await self._faulted("stall")
        outcome = await self._outcome(entry, where, within=2.0)
        _expect(
            outcome in ("timeout", "ambiguous"),
            f"a delivery cut by the outbox's deadline ended {outcome}: it must let the "
            "cancellation through (or say ambiguous), never claim an outcome",
        )
        got = await self._shows(where, [entry.text])
        _expect(entry.text in got, "the agent never showed the prompt sent before the deadline")
        verdict = await self._verify(entry, where)
        _expect(verdict is Verdict.DELIVERED, f"a prompt the agent holds verified {verdict.name}")

    async def _failure_after_sending_is_verified(self) -> None:
        """A backend that makes more requests once the prompt was sent (LangGraph waits for
        its run with a GET ``join``) must take a failure of any of them as ambiguous: the
        agent holds the prompt. The request that follows the prompt's is cut; a backend that
        makes none delivers as usual."""
        assert self.proxy is not None
        where = await self._session()
        await self._plain_in(where)
        mark = _marker()
        entry = _entry(f"then cut {mark}")
        self.proxy.arm(mark, "cut_before", after=True)
        outcome = await self._outcome(entry, where)
        self.proxy.disarm()  # (not met when the backend made no further request)
        _expect(
            outcome in ("ambiguous", "delivered", "timeout"),
            f"a request after the prompt was sent failed and the delivery ended "
            f"{self._said(outcome)}: the agent holds the prompt, so it must be verified",
        )
        got = await self._shows(where, [entry.text])
        _expect(entry.text in got, "the agent never showed the prompt sent")
        verdict = await self._verify(entry, where)
        _expect(verdict is Verdict.DELIVERED, f"a prompt the agent holds verified {verdict.name}")

    async def _held(self, status: int, form: str) -> None:
        value = RETRY_AFTER_FORMS[form]()
        entry, where, _ = await self._faulted("respond", (status, {"Retry-After": value}, b"busy"))
        outcome = await self._outcome(entry, where)
        _expect(
            outcome == "held",
            f"HTTP {status} with Retry-After {value[:20]!r} ended {outcome}: the agent said "
            "'not now', nothing was taken; it is a hold (the outbox's floor decides how long)",
        )
        wait = self.last_hold
        _expect(
            math.isfinite(wait) and wait >= 0,
            f"HTTP {status} with Retry-After {value[:20]!r} held for {wait!r} s",
        )
        verdict = await self._verify(entry, where)
        _expect(verdict is Verdict.ABSENT, f"a refused prompt verified {verdict.name}")

    async def _refusal_is_definitive(self) -> None:
        entry, where, _ = await self._faulted("respond", (400, {}, b'{"error": "bad prompt"}'))
        outcome = await self._outcome(entry, where)
        _expect(outcome == "failed", f"HTTP 400 to the prompt ended {outcome}, not failed")

    async def _key_follows_the_request(self) -> None:
        assert self.proxy is not None and self.under_test.request_key is not None
        key_of = self.under_test.request_key
        where = await self._session()
        await self._plain_in(where)
        mark = _marker()
        first = _entry(f"keyed {mark}")
        for _ in range(2):  # the same request sent twice: refused, then resent
            self.proxy.arm(mark, "respond", (400, {}, b"refused"))
            await self._outcome(first, where)
        sent = [key_of(r) for r in self.proxy.carrying(mark)]
        _expect(
            len(sent) == 2 and sent[0] is not None and sent[0] == sent[1],
            f"two sends of one request carried the keys {sent!r}: a resend must carry the same",
        )
        edited = first.evolve(text=f"keyed again {mark}", revision=first.revision + 1)
        await self._delivered(edited, where)
        new_key = key_of(self.proxy.carrying(mark)[-1])
        _expect(
            new_key is not None and new_key != sent[0],
            f"the changed request carried the old key {new_key!r}: an agent that cached its "
            "answer to the old one would replay it",
        )
        verdict = await self._verify(edited, where)
        _expect(verdict is Verdict.DELIVERED, f"the changed request verified {verdict.name}")

    async def _stop_ends_the_turn_delivered(self) -> None:
        assert self.agent is not None and self.agent.aborter is not None
        assert self.under_test.long_text is not None
        where = await self._session()
        await self._plain_in(where)
        mark = _marker()
        entry = _entry(self.under_test.long_text(mark))
        turn = asyncio.ensure_future(self._outcome(entry, where))
        try:
            got = await self._shows(where, [entry.text])
            _expect(entry.text in got, "the long prompt never reached the agent")
            ids = {"workspace_id": where[0], "session_id": where[1]}
            await self._call(self.agent.aborter, entry, **ids)
            outcome = await asyncio.wait_for(asyncio.shield(turn), self.under_test.settle)
        except TimeoutError:
            raise ContractBroken("the turn went on after the Stop") from None
        finally:
            if not turn.done():
                turn.cancel()
        _expect(
            outcome in ("delivered", "ambiguous", "failed"),
            f"a cut turn ended {outcome}",
        )
        verdict = await self._verify(entry, where)
        _expect(
            verdict is Verdict.DELIVERED,
            f"a prompt whose turn was cut after the agent got it verified {verdict.name}: a "
            "cut ends delivered (interrupted), never guessed",
        )

    last_hold: float = math.nan
    last_error: BaseException | None = None

    def _said(self, outcome: str) -> str:
        """``outcome``, with the error that made it when it is ``failed``."""
        if outcome == "failed" and self.last_error is not None:
            return f"failed ({type(self.last_error).__name__}: {self.last_error})"
        return outcome


def _contains_run(got: list[str], texts: list[str]) -> bool:
    """Whether ``texts`` appear in ``got`` one after another, in order."""
    n = len(texts)
    return any(got[i : i + n] == texts for i in range(len(got) - n + 1))


def _keeps(ref: Any) -> bool:
    """Whether the entry keeps ``ref`` as its ``agentRef`` (a well-formed reference)."""
    return bool(agent_ref_json(ref)[0])


def _expect(ok: bool, broken: str) -> None:
    if not ok:
        raise ContractBroken(broken)
