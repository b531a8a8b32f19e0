"""The scripted client of ``python -m example_project.run --smoke`` (``make demo ARGS=--smoke``).

It logs in as the demo user like a browser would (session cookie + CSRF token), makes
three agent sessions, watches each over the queue WebSocket, and sends prompts through
the REST API — with one duplicate resend, one client that vanishes mid-POST, one prompt
whose agent connection is cut after the agent stored it (fake agent), and a worker
SIGKILLed in the middle of a delivery and started again. With the in-house HTTP agent
(``--agent http``) one prompt is also answered 429 with ``Retry-After`` (held, then sent)
and one long turn is stopped over REST (the agent's abort URL). Then it waits until every
queue is empty and checks the agent's transcripts: every prompt exactly once, in the
order it was sent within its session. It prints a table and returns False on any
loss, duplicate, misorder or unexpected answer.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

if TYPE_CHECKING:
    from .stack import Stack

WORKSPACE = "demo"
POLL = 0.1  # seconds between polls of the API while waiting for a condition
GAP_WAIT = 1.0  # seconds a version gap may stay open before the watcher asks for a resync


class SmokeFailure(Exception):
    """The scripted run met something that must not happen."""


@dataclass
class Message:
    label: str
    session: str  # "A", "B", "C"
    kind: str  # plain duplicate disconnect late-disconnect ambiguous worker-kill while-down
    #            busy stop slow merge (ifBusy merge, sent while a slow turn runs)
    text: str
    cmid: str = field(default_factory=lambda: str(uuid.uuid4()))
    entry_id: str | None = None
    posted_at: float | None = None
    note: str = ""


@dataclass
class Watcher:
    """One session's WebSocket: every state each entry went through, by version.

    Events reach the socket from two publishers (the web process accepts, the worker
    delivers), so they may arrive out of version order: every update is recorded with
    its version and paths are read in version order. A gap still open after
    ``GAP_WAIT`` makes it ask for a resync, as outbox.js does.
    """

    session_id: str
    states: dict[str, list[tuple[int, float, str]]] = field(default_factory=dict)
    version: int | None = None
    seen_versions: set[int] = field(default_factory=set)
    resyncs: int = 0
    drops: list[str] = field(default_factory=list)
    interrupted: set[str] = field(default_factory=set)  #: entries seen ``interrupted``
    snapshot: asyncio.Event = field(default_factory=asyncio.Event)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def record(self, version: int, entry_id: str, state: str) -> None:
        seen = self.states.setdefault(entry_id, [])
        if (version, state) not in {(v, s) for v, _, s in seen}:
            seen.append((version, time.monotonic(), state))
            seen.sort()
        self.changed.set()

    async def run(self, ws: Any) -> None:
        gap_since: float | None = None
        while True:
            wait = None if gap_since is None else gap_since + GAP_WAIT - time.monotonic()
            try:
                frame = await asyncio.wait_for(ws.recv(), wait)
            except TimeoutError:  # the missing version never came: ask for the truth
                self.resyncs += 1
                gap_since = None
                await ws.send(json.dumps({"type": "resync"}))
                continue
            message = json.loads(frame)
            kind = message.get("type")
            if kind == "queue.snapshot":
                self.version = message["version"]
                self.seen_versions = {v for v in self.seen_versions if v > self.version}
                present = {entry["id"] for entry in message["entries"]}
                for entry_id, seen in list(self.states.items()):
                    ended = {"sent", "dismissed", "finished"} & {state for _, _, state in seen}
                    if entry_id not in present and not ended:  # its last event was lost
                        self.record(self.version, entry_id, "finished")
                for entry in message["entries"]:
                    if entry["id"] not in self.states:  # state known only from the snapshot
                        state = "queued" if entry["status"] == "pending" else entry["status"]
                        self.record(self.version, entry["id"], state)
                self.snapshot.set()
            elif kind == "queue.update" and self.version is not None:
                if message["entry"].get("interrupted"):
                    self.interrupted.add(message["entry"]["id"])
                self.record(message["version"], message["entry"]["id"], message["state"])
                self.seen_versions.add(message["version"])
            if self.version is None:
                continue
            while self.version + 1 in self.seen_versions:
                self.version += 1
            self.seen_versions = {v for v in self.seen_versions if v > self.version}
            if not self.seen_versions:
                gap_since = None
            elif gap_since is None:
                gap_since = time.monotonic()

    def path(self, entry_id: str | None) -> list[str]:
        return [state for _, _, state in self.states.get(entry_id or "", [])]

    def sent_at(self, entry_id: str | None) -> float | None:
        """When the entry was seen sent (or, its event lost, gone from a snapshot)."""
        seen = self.states.get(entry_id or "", [])
        return next((t for _, t, s in seen if s in ("sent", "finished")), None)

    async def until(self, predicate: Any, within: float) -> bool:
        """Wait up to ``within`` seconds for ``predicate()`` to hold after some frame."""
        try:
            async with asyncio.timeout(within):
                while not predicate():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            return False
        return True

    async def wait_state(self, entry_id: str, state: str, within: float) -> None:
        if not await self.until(lambda: state in self.path(entry_id), within):
            raise SmokeFailure(
                f"{entry_id} never reached {state!r} within {within:.0f}s on the WebSocket "
                f"(seen: {self.path(entry_id)}; were queue.update events published?)"
            )


class Smoke:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.run_id = secrets.token_hex(3)
        self.web = httpx.AsyncClient(base_url=stack.web_url, timeout=15.0)
        self.agent = httpx.AsyncClient(
            base_url=stack.agent_url, auth=stack.agent_auth, timeout=15.0
        )
        self.sessions: dict[str, str] = {}
        self.watchers: dict[str, Watcher] = {}
        self.messages: list[Message] = []
        self.problems: list[str] = []
        self.transcripts: dict[str, list[str]] = {}
        self.agent_posts: dict[str, int] = {}
        self.agent_replays: dict[str, int] = {}
        self.turn_seconds: dict[str, float | None] = {}  #: a stopped prompt's label -> its turn
        self._tasks: list[asyncio.Task[None]] = []
        #: One of the demo's own agents, with fault knobs: the fake opencode agent, or the
        #: same behind an in-house agent's HTTP API (which honours Idempotency-Key).
        self.fake = stack.agent in ("fake", "http")
        self.http = stack.agent == "http"
        self.langgraph = stack.agent == "langgraph"

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.web.aclose()
        await self.agent.aclose()

    # -- the client's side ----------------------------------------------------------

    @property
    def csrf(self) -> str:
        return self.web.cookies.get("csrftoken", "")

    def cookie_header(self) -> str:
        return "; ".join(f"{k}={v}" for k, v in self.web.cookies.items())

    async def login(self) -> None:
        await self.web.get("/accounts/login/")
        r = await self.web.post(
            "/accounts/login/",
            data={"username": "demo", "password": "demo", "csrfmiddlewaretoken": self.csrf},
        )
        if r.status_code != 302:
            raise SmokeFailure(f"login answered {r.status_code}")

    async def new_session(self, key: str) -> None:
        r = await self.web.post(
            f"/demo/api/workspaces/{WORKSPACE}/sessions/",
            json={"title": f"smoke {self.run_id} {key}"},
            headers={"X-CSRFToken": self.csrf},
        )
        if r.status_code != 201:
            raise SmokeFailure(f"new session answered {r.status_code}: {r.text}")
        self.sessions[key] = r.json()["sessionID"]

    async def watch(self, key: str) -> None:
        """Watch the session's queue; reconnect (counted) if the socket drops."""
        sid = self.sessions[key]
        watcher = self.watchers[key] = Watcher(sid)
        url = self.stack.web_url.replace("http", "ws", 1)
        url = f"{url}/ws/outbox/workspaces/{WORKSPACE}/sessions/{sid}/"

        async def pump() -> None:
            while True:
                try:
                    async with connect(
                        url,
                        origin=self.stack.web_url,
                        additional_headers={"Cookie": self.cookie_header()},
                    ) as ws:
                        await watcher.run(ws)
                except (OSError, ConnectionClosed) as exc:
                    watcher.drops.append(repr(exc))
                    await asyncio.sleep(0.2)

        self._tasks.append(asyncio.create_task(pump()))
        await asyncio.wait_for(watcher.snapshot.wait(), 10)

    def messages_path(self, key: str) -> str:
        return f"/outbox/api/workspaces/{WORKSPACE}/sessions/{self.sessions[key]}/messages/"

    async def post(self, message: Message) -> httpx.Response:
        if message.posted_at is None:
            message.posted_at = time.monotonic()
        body = {"clientMessageID": message.cmid, "text": message.text}
        if message.kind == "merge":
            body["ifBusy"] = "merge"  # joins the next delivery with the merge prompts behind
        return await self.web.post(
            self.messages_path(message.session), json=body, headers={"X-CSRFToken": self.csrf}
        )

    async def accept(self, message: Message) -> None:
        r = await self.post(message)
        if r.status_code != 202:
            raise SmokeFailure(f"{message.label}: POST answered {r.status_code}: {r.text}")
        message.entry_id = r.json()["id"]

    async def post_and_vanish(self, message: Message, linger: float = 0.0) -> None:
        """Send the whole POST on a raw socket and close it, ``linger`` seconds later,
        without reading the answer (case 09: 0 to 50 ms)."""
        body = json.dumps({"clientMessageID": message.cmid, "text": message.text}).encode()
        parts = urlsplit(self.stack.web_url)
        head = (
            f"POST {self.messages_path(message.session)} HTTP/1.1\r\n"
            f"Host: {parts.netloc}\r\n"
            f"Cookie: {self.cookie_header()}\r\n"
            f"X-CSRFToken: {self.csrf}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        _, writer = await asyncio.open_connection(parts.hostname, parts.port)
        message.posted_at = time.monotonic()
        writer.write(head.encode() + body)
        await writer.drain()
        if linger:
            await asyncio.sleep(linger)
        writer.close()  # gone, like an app the phone's OS killed mid-request

    # -- the agent's side -----------------------------------------------------------

    async def transcript(self, key: str) -> list[str]:
        """The text parts of the session's user messages, in transcript order."""
        if self.langgraph:
            return await self.thread_prompts(key)
        r = await self.agent.get(f"/session/{self.sessions[key]}/message")
        r.raise_for_status()
        return [
            part["text"]
            for m in r.json()
            if m["info"]["role"] == "user"
            for part in m["parts"]
            if part.get("type") == "text"
        ]

    async def message_parts(self, key: str) -> list[list[str]]:
        """The text parts of each of the session's user messages (opencode's transcript)."""
        r = await self.agent.get(f"/session/{self.sessions[key]}/message")
        r.raise_for_status()
        return [
            [part["text"] for part in m["parts"] if part.get("type") == "text"]
            for m in r.json()
            if m["info"]["role"] == "user"
        ]

    async def thread_prompts(self, key: str) -> list[str]:
        """LangGraph: the user messages of the session's thread (docs/howto/langgraph.md)."""
        # Found by its metadata: the thread ID carries the demo project's identity.
        where = {"outbox_workspace_id": WORKSPACE, "outbox_session_id": self.sessions[key]}
        found = await self.agent.post("/threads/search", json={"metadata": where, "limit": 1})
        found.raise_for_status()
        if not found.json():
            return []  # its thread comes with its first prompt
        r = await self.agent.get(f"/threads/{found.json()[0]['thread_id']}/state")
        r.raise_for_status()
        messages = (r.json().get("values") or {}).get("messages") or []
        return [m["content"] for m in messages if m.get("type") == "human"]

    async def turn_length(self, message: Message) -> float | None:
        """Seconds the agent's turn answering ``message`` ran (from its assistant message's
        times; None while it runs or when there is none): a Stop ends a 30 s turn early."""
        r = await self.agent.get(f"/session/{self.sessions[message.session]}/message")
        r.raise_for_status()
        texts = {
            m["info"]["id"]: [p.get("text") for p in m["parts"]]
            for m in r.json()
            if m["info"]["role"] == "user"
        }
        asked = next((mid for mid, parts in texts.items() if message.text in parts), None)
        for m in r.json():
            info = m["info"]
            times = info.get("time") or {}
            if info.get("parentID") == asked and asked and "completed" in times:
                return (times["completed"] - times["created"]) / 1000
        return None

    async def wait_in_transcript(self, message: Message, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            if message.text in await self.transcript(message.session):
                return
            if time.monotonic() > deadline:
                raise SmokeFailure(f"{message.label} never reached the agent")
            await asyncio.sleep(POLL)

    # -- the script -------------------------------------------------------------------

    def plan(self) -> dict[str, list[Message]]:
        if self.http:
            kinds = {
                "A": ["plain", "duplicate", "plain", "worker-kill", "while-down", "while-down"],
                "B": ["plain", "disconnect", "plain", "late-disconnect", "plain"],
                "C": ["plain", "ambiguous", "busy", "stop", "plain", "slow", "merge", "merge"],
            }
        elif self.fake:
            kinds = {
                "A": ["plain", "duplicate", "plain", "worker-kill", "while-down", "while-down"],
                "B": ["plain", "disconnect", "plain", "late-disconnect", "plain"],
                "C": ["plain", "ambiguous", "plain", "plain", "slow", "merge", "merge"],
            }
        elif self.langgraph:  # no fault knobs: the worker kill is the verified one
            kinds = {
                "A": ["plain", "duplicate", "worker-kill", "while-down", "while-down"],
                "B": ["plain", "disconnect", "plain", "late-disconnect"],
                "C": ["plain", "plain", "slow", "merge", "merge"],
            }
        else:  # the real opencode: every turn times out and is verified; keep it short
            kinds = {
                "A": ["duplicate", "worker-kill", "while-down"],
                "B": ["disconnect", "plain"],
                "C": ["plain", "slow", "merge", "merge"],
            }
        words = ["fix the flaky test", "explain the diff", "rename the module", "add a README"]
        out: dict[str, list[Message]] = {}
        for key, seq in kinds.items():
            out[key] = []
            for i, kind in enumerate(seq, 1):
                label = f"{key}{i}"
                text = f"smoke {self.run_id} {label}: {words[i % len(words)]} ✓"
                if self.langgraph and kind == "worker-kill":
                    text = f"sleep 8 {text}"  # the echo graph thinks 8 s: killed mid-turn
                if self.langgraph and kind == "slow":
                    text = f"sleep 3 {text}"  # the merge prompts are sent meanwhile
                message = Message(label, key, kind, text)
                out[key].append(message)
                self.messages.append(message)
        return out

    async def run_session(self, key: str, messages: list[Message]) -> None:
        watcher = self.watchers[key]
        for m in messages:
            if m.kind == "duplicate":
                await self.accept(m)
                r = await self.post(m)
                body = r.json()
                same = body.get("id") == m.entry_id and body.get("duplicate") is True
                if r.status_code != 200 or not same:
                    raise SmokeFailure(f"{m.label}: resend answered {r.status_code} {body}")
                m.note = "resend → 200, same id"
            elif m.kind in ("disconnect", "late-disconnect"):
                await self.post_and_vanish(m, 0.05 if m.kind == "late-disconnect" else 0.0)
                r = await self.post(m)
                if r.status_code not in (200, 202):
                    raise SmokeFailure(f"{m.label}: resend answered {r.status_code}: {r.text}")
                m.entry_id = r.json()["id"]
                m.note = (
                    "vanished POST was stored; resend → 200"
                    if r.status_code == 200
                    else "vanished POST not stored; resend → 202"
                )
            elif m.kind == "stop":
                await self.accept(m)
                await watcher.wait_state(m.entry_id or "", "delivering", 20)
                await self.wait_in_transcript(m, 20)  # the agent runs its (long) turn
                path = self.messages_path(m.session).removesuffix("messages/") + "interrupt/"
                # A Stop names the prompt it stops (docs/howto/cutting.md).
                r = await self.web.post(
                    path, json={"entryID": m.entry_id}, headers={"X-CSRFToken": self.csrf}
                )
                if r.status_code != 202 or r.json().get("result") != "cut":
                    raise SmokeFailure(f"{m.label}: Stop answered {r.status_code}: {r.text}")
                m.note = "Stop mid-turn: cut through the abort URL"
            elif m.kind == "slow":
                await self.accept(m)
                await watcher.wait_state(m.entry_id or "", "delivering", 20)
                await self.wait_in_transcript(m, 20)  # its turn runs: the merge prompts wait
                m.note = "a slow turn; the merge prompts are sent while it runs"
            elif m.kind == "worker-kill":
                await self.accept(m)
                await watcher.wait_state(m.entry_id or "", "delivering", 20)
                await self.wait_in_transcript(m, 20)  # the agent has it, mid-turn
                pid = self.stack.kill_worker()
                m.note = f"worker {pid} SIGKILLed mid-delivery"
                rest = [x for x in messages if x.kind == "while-down"]
                for x in rest:  # accepted with no worker running at all
                    await self.accept(x)
                    x.note = "accepted while no worker ran"
                self.stack.start_worker()
                return
            else:
                await self.accept(m)

    async def wait_drained(self, within: float) -> None:
        """Until every session's queue is empty; fail fast on error or parked entries."""
        deadline = time.monotonic() + within
        while True:
            pending = 0
            for key in self.sessions:
                r = await self.web.get(self.messages_path(key))
                r.raise_for_status()
                for entry in r.json()["entries"]:
                    if entry["status"] in ("error", "parked"):
                        raise SmokeFailure(
                            f"session {key}: entry {entry['id']} is {entry['status']} "
                            f"({entry.get('reason')}): {entry.get('lastError')}"
                        )
                    pending += 1
            if not pending:
                return
            if time.monotonic() > deadline:
                raise SmokeFailure(f"{pending} entries still queued after {within:.0f}s")
            await asyncio.sleep(POLL * 2)

    async def scenario(self) -> None:
        await self.login()
        for key in ("A", "B", "C"):
            await self.new_session(key)
            await self.watch(key)
        plan = self.plan()
        if self.fake:
            ambiguous = next(m for m in self.messages if m.kind == "ambiguous")
            slow = next(m for m in self.messages if m.kind == "worker-kill")
            rules = [
                {"match": ambiguous.text, "action": "cut_after_store"},
                {"match": slow.text, "action": "delay", "seconds": 30},
            ]
            for m in self.messages:
                if m.kind == "busy":
                    rules.append({"match": m.text, "action": "busy", "seconds": 1})
                    m.note = "agent answered 429, Retry-After: 1; held, then sent"
                elif m.kind == "stop":
                    rules.append({"match": m.text, "action": "delay", "seconds": 30})
                elif m.kind == "slow":
                    rules.append({"match": m.text, "action": "delay", "seconds": 3})
            r = await self.agent.post("/_fake/control", json={"rules": rules})
            r.raise_for_status()
            ambiguous.note = "agent cut the connection after storing it"
        await asyncio.gather(*(self.run_session(k, v) for k, v in plan.items()))
        await self.wait_drained(60)
        # The 'sent' events may trail the queue's emptiness by a moment.
        for key, watcher in self.watchers.items():
            ids = [m.entry_id for m in self.messages if m.session == key and m.entry_id]
            await watcher.until(lambda w=watcher, ids=ids: all(w.sent_at(i) for i in ids), 3)
        await self.check()

    async def check(self) -> None:
        for key in self.sessions:
            self.transcripts[key] = await self.transcript(key)
        if self.fake:
            r = await self.agent.get("/_fake/control")
            self.agent_posts = r.json()["posts"]
            self.agent_replays = r.json().get("replays", {})
            for m in self.messages:
                if m.kind == "stop":
                    self.turn_seconds[m.label] = await self.turn_length(m)
        for key in self.sessions:
            expected = [m.text for m in self.messages if m.session == key]
            got = self.transcripts[key]
            counts = Counter(got)
            for m in self.messages:
                if m.session != key:
                    continue
                if counts[m.text] == 0:
                    self.problems.append(f"LOST: {m.label} is not in the agent's transcript")
                elif counts[m.text] > 1:
                    self.problems.append(f"DUPLICATED: {m.label} is there {counts[m.text]} times")
            extra = [t for t in got if t not in expected]
            if extra:
                self.problems.append(f"session {key}: unexpected transcript texts {extra}")
            seen = [t for t in dict.fromkeys(got) if t in expected]
            if seen != [t for t in expected if t in seen]:
                self.problems.append(f"MISORDERED: session {key} has {seen}, sent {expected}")
        merged = [m for m in self.messages if m.kind == "merge"]
        if merged and not self.langgraph:
            together = await self.message_parts(merged[0].session)
            if [m.text for m in merged] not in together:
                self.problems.append(
                    f"MERGE: {[m.label for m in merged]} were not one agent message with a part "
                    f"each: the agent's user messages hold {together}"
                )
            else:
                for m in merged:
                    m.note = "merged: one agent message, a part each"
        for key, watcher in self.watchers.items():
            if watcher.drops:
                self.problems.append(
                    f"the WebSocket of session {key} dropped {len(watcher.drops)} times: "
                    f"{watcher.drops[0]}"
                )
        for m in self.messages:
            path = self.watchers[m.session].path(m.entry_id)
            if m.kind in ("ambiguous", "worker-kill", "stop") and "verifying" not in path:
                self.problems.append(f"{m.label}: expected a verification, saw {path}")
            expected_posts = 2 if m.kind == "busy" else 1  # a 429 is answered, not taken
            if self.fake and self.agent_posts.get(m.text, 0) > expected_posts:
                self.problems.append(
                    f"{m.label}: the agent received it {self.agent_posts[m.text]} times (resent)"
                )
            if m.kind == "busy" and self.agent_posts.get(m.text, 0) != 2:
                self.problems.append(
                    f"{m.label}: expected a 429 then the prompt taken (2 POSTs), the agent "
                    f"received {self.agent_posts.get(m.text, 0)}"
                )
            if self.agent_replays.get(m.text):
                self.problems.append(
                    f"{m.label}: sent again {self.agent_replays[m.text]} times with an "
                    "Idempotency-Key the agent had stored (resent blindly)"
                )
            if m.kind == "stop":
                watcher = self.watchers[m.session]
                if m.entry_id not in watcher.interrupted:
                    self.problems.append(f"{m.label}: never seen with interrupted: true")
                turn = self.turn_seconds.get(m.label)
                if turn is not None and "turn ended" not in m.note:
                    m.note += f"; turn ended after {turn:.1f}s of its 30"
                if turn is None or turn >= 25:
                    self.problems.append(
                        f"{m.label}: the agent's turn was not cut by the Stop (it took {turn}s "
                        "of its 30)"
                    )

    # -- the report --------------------------------------------------------------------

    def outcome(self, m: Message) -> str:
        got = Counter(self.transcripts.get(m.session, [])).get(m.text, 0)
        if got == 0:
            return "LOST"
        if got > 1:
            return f"DUPLICATED x{got}"
        path = self.watchers[m.session].path(m.entry_id)
        done = "delivered (verified)" if "verifying" in path else "delivered"
        return f"{done}; {m.note}" if m.note else done

    def table(self) -> str:
        rows = [("message", "session", "outcome", "attempts", "agent got", "states", "delivered")]
        for m in self.messages:
            watcher = self.watchers.get(m.session)
            path = watcher.path(m.entry_id) if watcher else []
            sent = watcher.sent_at(m.entry_id) if watcher else None
            took = f"{sent - m.posted_at:.2f}s" if sent and m.posted_at else "?"
            got = str(self.agent_posts.get(m.text, "?")) if self.fake else "-"
            rows.append(
                (
                    m.label,
                    f"{m.session} {self.sessions.get(m.session, '')[-8:]}",
                    self.outcome(m),
                    str(path.count("delivering")),
                    got,
                    ">".join(path),
                    took,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)


async def run_smoke(stack: Stack, *, deadline: float) -> bool:
    """Run the script against the started ``stack``; print the table; True if all is well."""
    started = time.monotonic()
    smoke = Smoke(stack)
    try:
        try:
            await asyncio.wait_for(smoke.scenario(), deadline)
        except SmokeFailure as exc:
            smoke.problems.append(str(exc))
        except TimeoutError:
            smoke.problems.append(f"the scripted run did not finish within {deadline:.0f}s")
        if not smoke.transcripts and smoke.sessions:
            try:
                await smoke.check()
            except Exception as exc:  # the report must still print
                smoke.problems.append(f"could not read the transcripts: {exc!r}")
    finally:
        await smoke.close()
    print()
    print(smoke.table())
    print()
    resyncs = sum(w.resyncs for w in smoke.watchers.values())
    seconds = time.monotonic() - started
    n, s = len(smoke.messages), len(smoke.sessions)
    if smoke.problems:
        for problem in smoke.problems:
            print(f"smoke: FAIL: {problem}")
        print(f"smoke: FAILED ({n} messages, {s} sessions, {seconds:.1f}s)")
        return False
    print(
        f"smoke: OK: {n} messages over {s} sessions, each in the agent's transcript exactly "
        f"once and in order; {stack.workers_started} workers (one SIGKILLed); "
        f"{resyncs} resync{'' if resyncs == 1 else 's'} after a lost event; {seconds:.1f}s"
    )
    return True
