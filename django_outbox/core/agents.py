"""Named agents and the router that picks one per session (no Django imports).

An :class:`Agent` is one backend the outbox delivers to: its deliverer, its verifier
and, optionally, its aborter, with the settings of its ``OUTBOX["AGENTS"]`` entry
(docs/howto/agents.md). A router ``(workspace_id, session_id) -> agent name`` picks
the agent of a session; :meth:`AgentRouting.agent_for` is the one place an entry's
agent is resolved, for the worker's deliver and verify steps and for cutting a turn
(:meth:`AgentRouting.aborter_for`).

While an agent's callable runs for the worker, :data:`current_agent` names that
agent, so a module-level deliverer that serves several ``AGENTS`` entries (the HTTP
agent, :mod:`django_outbox.delivery.http`) finds its own entry's settings there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import AgentMisconfigured, OutboxError
from .redaction import redact

#: The name of the agent made of the single ``DELIVERER`` / ``VERIFIER`` (/ ``ABORTER``).
DEFAULT_AGENT = "default"

_NO_OPTIONS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Agent:
    """One backend: ``name`` (its key in ``OUTBOX["AGENTS"]``, or ``"default"``),
    ``deliverer(entry, *, workspace_id, session_id, attempt)``, ``verifier(entry, *,
    workspace_id, session_id) -> Verdict`` (None: an unknown outcome ends in error
    ``unverifiable``), ``aborter(entry, *, workspace_id, session_id)`` (None: the
    agent cannot cut a turn), each sync or async, and ``options``: the entry's other
    keys, as given (read-only). docs/howto/agents.md."""

    name: str
    deliverer: Callable[..., Any] | None
    verifier: Callable[..., Any] | None = None
    aborter: Callable[..., Any] | None = None
    options: Mapping[str, Any] = field(default_factory=lambda: _NO_OPTIONS)


#: What a deliverer declares it carries out, in its ``outbox_capabilities`` attribute (a
#: set of names; docs/howto/agents.md#what-every-agent-carries). ``"merge"``: it sends every
#: part of a merged delivery (``entry.parts``) as one message, so ``if_busy="merge"`` may be
#: accepted for its sessions; without it such an accept is refused, nothing stored.
CAPABILITY_MERGE = "merge"


def capabilities_of(deliverer: Callable[..., Any] | None) -> frozenset[str]:
    """The names ``deliverer`` declares in its ``outbox_capabilities`` attribute (a bound
    method: its function's, else its object's), or an empty set: an undeclared capability
    is taken as missing, so a deliverer written before it existed never drops what it
    would carry."""
    declared = getattr(deliverer, "outbox_capabilities", None)
    if declared is None:
        declared = getattr(getattr(deliverer, "__self__", None), "outbox_capabilities", None)
    if not declared or isinstance(declared, str):
        return frozenset()
    try:
        return frozenset(str(name) for name in declared)
    except TypeError:
        return frozenset()


#: The agent whose callable runs now (set by the delivery step around each deliverer,
#: verifier and aborter call; None elsewhere). Copied into ``asyncio.to_thread`` calls.
current_agent: ContextVar[Agent | None] = ContextVar("outbox_current_agent", default=None)


#: Seconds one agent's start-up probe may take before the worker starts without its answer.
PROBE_TIMEOUT = 10.0


async def probe_agents(agents: Iterable[Agent], seconds: float = PROBE_TIMEOUT) -> list[str]:
    """Run the start-up probe of each agent whose deliverer has one (its ``outbox_probe``
    attribute: an async callable without arguments, called with :data:`current_agent`
    naming the agent; docs/howto/agents.md#the-start-up-probe). A probe returns when the
    agent takes what the settings name and raises :class:`AgentMisconfigured` when the
    agent says it does not: raised again here, naming the agent (the worker does not
    start). Returns a warning per probe that could not tell (any other error, or no answer
    within ``seconds``): the worker starts, and the deliveries will say more."""
    warnings: list[str] = []
    for agent in agents:
        probe = getattr(agent.deliverer, "outbox_probe", None)
        if probe is None:
            continue
        serving = current_agent.set(agent)
        try:
            async with asyncio.timeout(seconds):
                await probe()
        except AgentMisconfigured as exc:
            raise AgentMisconfigured(f"agent {agent.name!r}: {exc}") from exc
        except Exception as exc:
            said = f"no answer within {seconds:g}s" if isinstance(exc, TimeoutError) else exc
            warnings.append(
                f"agent {agent.name!r}: the start-up probe could not tell whether it takes "
                f"the settings ({type(exc).__name__}: {redact(str(said))}); starting anyway"
            )
        finally:
            current_agent.reset(serving)
    return warnings


class UnknownAgent(OutboxError, LookupError):
    """The router named no configured agent, returned something that is not a name, or
    raised. ``name`` is what it returned (None when it raised), ``known`` the configured
    names. The entry shows it as its ``lastError``; the worker goes on
    (docs/howto/agents.md#routing)."""

    def __init__(self, message: str, name: object = None, known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.known = known


class AgentRouting:
    """The agents of an outbox and its router; a mixin of
    :class:`~django_outbox.core.base.OutboxBase`, which sets :attr:`agents` and
    :attr:`router` from its ``agents=`` / ``router=`` arguments.

    ``agents``: ``{name: Agent}``; ``router``: a plain (not async) callable
    ``(workspace_id, session_id) -> name``, called on every delivery step in the
    worker's event loop, so it must be quick and must not block; None routes every
    session to the default agent (the only agent when ``agents`` holds one and no
    ``deliverer`` is set)."""

    deliverer: Callable[..., Any] | None
    verifier: Callable[..., Any] | None
    aborter: Callable[..., Any] | None
    agents: Mapping[str, Agent]
    router: Callable[[str, str], Any] | None

    def default_agent(self) -> Agent | None:
        """The agent of the single ``deliverer`` / ``verifier`` / ``aborter`` (read now:
        tests may set them after construction); with ``agents`` and no deliverer, the
        only agent, or the one named ``"default"``; None when there is no such agent."""
        if self.agents and self.deliverer is None:
            if len(self.agents) == 1:
                return next(iter(self.agents.values()))
            return self.agents.get(DEFAULT_AGENT)
        return self._single_agent()

    def _single_agent(self) -> Agent:
        """The agent of ``deliverer`` / ``verifier`` / ``aborter``, made again only when
        one of them was replaced (the worker asks at every step)."""
        made = self.__dict__.get("_single")
        deliverer, verifier, aborter = self.deliverer, self.verifier, self.aborter
        if (
            made is None
            or made.deliverer is not deliverer
            or made.verifier is not verifier
            or made.aborter is not aborter
        ):
            made = self.__dict__["_single"] = Agent(DEFAULT_AGENT, deliverer, verifier, aborter)
        return made

    def agent_names(self) -> tuple[str, ...]:
        """Every name the router may answer, sorted (the default agent's included)."""
        names = set(self.agents)
        if self.deliverer is not None:
            names.add(DEFAULT_AGENT)
        return tuple(sorted(names))

    def agent_for(self, workspace_id: str, session_id: str) -> Agent:
        """The agent that delivers, verifies and cuts the prompts of this session.

        Without a router: the default agent (:meth:`default_agent`). With one: the
        agent it names (``"default"`` names the single ``DELIVERER``'s unless
        ``AGENTS`` has an entry of that name). Raises :class:`UnknownAgent` when the
        router raises, answers something that is not a ``str``, or names no agent,
        and when there is no agent at all (docs/howto/agents.md#routing).
        """
        router = self.router
        if router is None:
            agent = self.default_agent()
            if agent is None:
                raise UnknownAgent(
                    "no agent for this session: AGENTS has several entries, none named "
                    "'default', and no ROUTER picks one",
                    None,
                    self.agent_names(),
                )
            return agent
        try:
            name = router(workspace_id, session_id)
        except Exception as exc:
            raise UnknownAgent(
                f"the ROUTER raised {type(exc).__name__} for {workspace_id}/{session_id}",
                None,
                self.agent_names(),
            ) from exc
        if not isinstance(name, str):
            raise UnknownAgent(
                f"the ROUTER returned a {type(name).__name__}, not an agent name, for "
                f"{workspace_id}/{session_id}",
                name,
                self.agent_names(),
            )
        agent = self.agents.get(name)
        if agent is None and name == DEFAULT_AGENT and self.deliverer is not None:
            agent = self._single_agent()
        if agent is None:
            known = self.agent_names()
            raise UnknownAgent(
                f"the ROUTER named agent {name!r} for {workspace_id}/{session_id}, which is "
                f"not configured (known: {', '.join(known) or 'none'})",
                name,
                known,
            )
        return agent

    def aborter_for(self, workspace_id: str, session_id: str) -> Callable[..., Any] | None:
        """The aborter of the session's agent (:meth:`agent_for`), or None when that agent
        cannot cut a turn. Raises :class:`UnknownAgent` as :meth:`agent_for` does."""
        return self.agent_for(workspace_id, session_id).aborter

    def carries(self, workspace_id: str, session_id: str, capability: str) -> bool:
        """Whether the session's agent declares ``capability`` (:data:`CAPABILITY_MERGE`,
        ...) on its deliverer (:func:`capabilities_of`). True when this outbox has no agent
        at all (a process that only accepts, built without agents, cannot tell; the
        Django outbox always has its settings' agents); False when the session's agent
        cannot be resolved now: what it needs is refused rather than risked."""
        if not self.agents and self.deliverer is None:
            return True
        try:
            agent = self.agent_for(workspace_id, session_id)
        except UnknownAgent:
            return False
        return capability in capabilities_of(agent.deliverer)

    def verifies(self, workspace_id: str, session_id: str) -> bool:
        """Whether an unknown outcome in this session is verified before anything is sent
        again: its agent has a verifier, or its agent cannot be resolved now (a
        verification of such a session stays inconclusive and never resends, so an
        operator's retry of an ``unverifiable`` entry is safe either way)."""
        try:
            return self.agent_for(workspace_id, session_id).verifier is not None
        except UnknownAgent:
            return True

    def any_verifier(self) -> bool:
        """Whether any agent (the default one included) has a verifier."""
        return self.verifier is not None or any(
            a.verifier is not None for a in self.agents.values()
        )
