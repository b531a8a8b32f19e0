"""The agent conformance suite (django_outbox.testing.agents;
docs/howto/agents.md#what-every-agent-carries) against every agent the package ships or
tests with: the HTTP agent on a real HTTP server, opencode (the tests' fake and the real
``opencode serve``), LangGraph (a real ``langgraph dev``), the demo's own agents
(example_project/fake_agent.py and http_agent.py, served in the test's event loop) and the
recording in-process agent the worker tests use.

Each check names one rule of the contract; a backend that breaks it fails here, whichever
backend it is, so a capability of the queue reaches every agent or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid

import pytest

from django_outbox.core.agents import Agent
from django_outbox.delivery import http
from django_outbox.delivery.langgraph import REQUEST_KEY, LangGraphClient, thread_id_for
from django_outbox.delivery.opencode import OpencodeClient
from django_outbox.testing.agents import AgentContract, AgentUnderTest, ProxiedRequest
from example_project.fake_agent import FakeAgent, Rule
from example_project.http_agent import HttpAgent
from tests.support import agents as recording
from tests.support.fake_opencode import FakeOpencode
from tests.support.http_agent import AgentServer

WS = "wconf"
CHECKS = AgentContract.CHECKS


async def run(under_test: AgentUnderTest, check: str) -> None:
    async with AgentContract(under_test) as contract:
        why_not = contract.applies(check)
        if why_not is not None:
            pytest.skip(why_not)
        await contract.run(check)


def fresh(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


def body_json(request: ProxiedRequest) -> dict:
    return json.loads(request.body or b"{}")


# --- the recording agent, in process -------------------------------------------------------


@pytest.mark.parametrize("check", CHECKS)
async def test_the_recording_agent(check, r):
    async def received(workspace_id, session_id):
        lines = [line.split(" ", 1) for line in r.lrange("test:log", 0, -1)]
        return [text for session, text in lines if session == session_id]

    under_test = AgentUnderTest(
        build=lambda url: Agent("recording", recording.deliver, recording.verify),
        received=received,
        session=lambda: (WS, fresh("rec")),
    )
    try:
        await run(under_test, check)
    finally:
        client = recording._clients.pop(id(asyncio.get_running_loop()), None)
        if client is not None:
            await client.aclose()


# --- the HTTP agent, on a real HTTP server -------------------------------------------------


@pytest.fixture
def agent_server():
    server = AgentServer().start()
    yield server
    server.stop()


@pytest.mark.parametrize("check", CHECKS)
async def test_the_http_agent(check, agent_server):
    def build(url):
        options = {
            "SEND_URL": url + "/w/{workspace_id}/s/{session_id}/prompts",
            "VERIFY_URL": url + "/prompts/{idempotency_key}",
            "TIMEOUT": 5,
            "VERIFY_TIMEOUT": 5,
        }
        return Agent(fresh("web"), http.deliver, http.verify, None, options)

    def received(workspace_id, session_id):
        with agent_server.lock:
            bodies = list(agent_server.stored.values())
        return [p for b in bodies if b["session_id"] == session_id for p in b["parts"]]

    under_test = AgentUnderTest(
        build=build,
        received=received,
        session=lambda: (WS, fresh("s")),
        upstream=agent_server.url,
        request_key=lambda request: request.headers.get("idempotency-key"),
    )
    try:
        await run(under_test, check)
    finally:
        await http.aclose()


# --- opencode: the tests' fake server ------------------------------------------------------


class LongTurns(FakeOpencode):
    """The fake opencode, whose prompts starting with ``long`` turn until a Stop."""

    def plan_turn(self, session_id, text):
        turn = super().plan_turn(session_id, text)
        if text.startswith("long"):
            turn.seconds = 600.0
        return turn


async def run_opencode(check: str, base_url: str, **agent) -> None:
    """``check`` against the opencode server at ``base_url`` through ``OpencodeClient``s
    with short deadlines (closed afterwards); ``agent``: the rest of the
    :class:`AgentUnderTest` (how to read the server, make a session, a long turn)."""
    made: list[OpencodeClient] = []

    def build(url):
        made.append(OpencodeClient(url, connect_timeout=2, timeout=5, verify_timeout=5))
        return Agent("opencode", made[-1].deliver, made[-1].verify, made[-1].abort)

    under_test = AgentUnderTest(
        build=build,
        upstream=base_url,
        request_key=lambda request: body_json(request).get("messageID"),
        **agent,
    )
    try:
        await run(under_test, check)
    finally:
        for client in made:
            await client.aclose()


@pytest.mark.parametrize("check", CHECKS)
async def test_opencode_against_the_fake_server(check):
    async with LongTurns() as fake:
        await run_opencode(
            check,
            fake.base_url,
            received=lambda ws, ses: [text for parts in fake.user_texts(ses) for text in parts],
            session=lambda: (WS, fake.create_session()),
            long_text=lambda marker: f"long turn {marker}",
        )


# --- the demo's own agents, served in process -----------------------------------------------


@contextlib.asynccontextmanager
async def serving(agent):
    """``agent`` (a demo server: ``serve`` and ``close_connections``) on a loopback port of
    this test's event loop; yields its URL."""
    server = await asyncio.start_server(agent.serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await agent.close_connections()
        await server.wait_closed()


def transcript_texts(agent, session_id: str) -> list[str]:
    """The user texts a demo agent stored for ``session_id``, a part each, in order."""
    return [
        part["text"]
        for message in agent.transcripts.get(session_id, [])
        if message["info"]["role"] == "user"
        for part in message["parts"]
        if part.get("type") == "text"
    ]


def long_turns(agent):
    """``agent`` whose prompts starting with ``long`` turn until a Stop (the demo's ``delay``
    rule, forever)."""
    agent.rules.append(Rule(match="long", action="delay", seconds=600.0, times=0))
    return agent


@pytest.mark.parametrize("check", CHECKS)
async def test_the_demos_fake_agent(check):
    """example_project/fake_agent.py (the demo's opencode-like agent) through the opencode
    backend."""
    agent = long_turns(FakeAgent(state_path=None, password=None, latency=0.0))
    async with serving(agent) as url:
        await run_opencode(
            check,
            url,
            received=lambda ws, ses: transcript_texts(agent, ses),
            session=lambda: (WS, agent.new_session()["id"]),
            long_text=lambda marker: f"long turn {marker}",
        )


@pytest.mark.parametrize("check", CHECKS)
async def test_the_demos_http_agent(check):
    """example_project/http_agent.py (the demo's in-house agent) through the HTTP backend,
    its Stop included."""
    agent = long_turns(HttpAgent(state_path=None, password=None, latency=0.0))

    def build(url):
        base = url + "/agent/w/{workspace_id}/s/{session_id}"
        options = {
            "SEND_URL": base + "/prompts",
            "VERIFY_URL": base + "/prompts/{idempotency_key}",
            "ABORT_URL": base + "/abort",
            "TIMEOUT": 5,
            "VERIFY_TIMEOUT": 5,
        }
        return Agent(fresh("demo"), http.deliver, http.verify, http.abort, options)

    async with serving(agent) as url:
        under_test = AgentUnderTest(
            build=build,
            received=lambda ws, ses: transcript_texts(agent, ses),
            session=lambda: (WS, fresh("s")),
            upstream=url,
            request_key=lambda request: request.headers.get("idempotency-key"),
            long_text=lambda marker: f"long turn {marker}",
        )
        try:
            await run(under_test, check)
        finally:
            await http.aclose()


# --- opencode: the real server -------------------------------------------------------------


@pytest.fixture(scope="module")
def opencode_server(tmp_path_factory):
    from tests.support.opencode_server import OpencodeServer

    server = OpencodeServer(tmp_path_factory.mktemp("opencode")).spawn()
    try:
        yield server.ready()
    finally:
        server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS)
async def test_opencode_against_the_real_server(check, opencode_server):
    async def received(workspace_id, session_id):
        messages = await opencode_server.user_messages(session_id)
        return [text for _, texts in messages for text in texts]

    async def session():
        return WS, await opencode_server.new_session()

    await run_opencode(
        check,
        opencode_server.base_url,
        received=received,
        session=session,
        long_text=lambda marker: f"a turn that never ends {marker}",
        turns_end=False,  # no LLM provider: a turn ends only when it is cut
    )


# --- LangGraph: a real langgraph dev -------------------------------------------------------


@pytest.fixture(scope="module")
def langgraph(tmp_path_factory):
    from tests.support.langgraph_server import LangGraphServer

    server = LangGraphServer(tmp_path_factory.mktemp("langgraph")).start()
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("check", CHECKS)
async def test_langgraph_against_a_real_server(check, langgraph, tmp_path):
    from tests.support.langgraph_server import ASSISTANT

    made = []

    def build(url):
        made.append(LangGraphClient(url, ASSISTANT, timeout=30.0, request_timeout=10.0))
        client = made[-1]
        return Agent("graph", client.deliver, client.verify, client.abort)

    async def received(workspace_id, session_id):
        thread = thread_id_for(workspace_id, session_id)
        messages = await asyncio.to_thread(langgraph.messages, thread)
        return [text for role, text in messages if role == "human"]

    def request_key(request):
        if not request.path.endswith("/runs"):
            return None
        return body_json(request).get("metadata", {}).get(REQUEST_KEY)

    under_test = AgentUnderTest(
        build=build,
        received=received,
        session=lambda: (WS, fresh("lg")),
        upstream=langgraph.url,
        request_key=request_key,
        long_text=lambda marker: f"hold {tmp_path / marker}",
    )
    try:
        await run(under_test, check)
    finally:
        for client in made:
            await client.aclose()
