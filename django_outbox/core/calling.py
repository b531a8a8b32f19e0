"""Calling the agent: which one serves a step, its deliverer and verifier, their endings.

:class:`AgentCalls` adds to :class:`~django_outbox.core.base.OutboxBase` what the
delivery step (:mod:`~django_outbox.core.step`) does between its claim and its
settle: resolve the session's agent (:meth:`~AgentCalls._route`, through
:meth:`~django_outbox.core.agents.AgentRouting.agent_for`), call its deliverer under
``DELIVERY_TIMEOUT`` or its verifier, and classify how the call ended into an
outcome the settle records: ``delivered``, ``failed``, ``transient``,
``prior_pending``, ``held``, ``ambiguous`` or ``unverifiable`` for a delivery;
``delivered``, ``absent`` or ``inconclusive`` for a verification
(docs/explanation/lifecycle.md, "What happens to a message"; docs/howto/agents.md).
:class:`~django_outbox.core.cutting.TurnCuts` wraps both calls to watch for a cut.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from .agents import Agent, UnknownAgent
from .base import OutboxBase
from .entry import Entry, Verdict
from .errors import (
    AmbiguousError,
    HoldDeliveryError,
    PriorAttemptPendingError,
    TransientDeliveryError,
)
from .rules import agent_ref_json, describe_error
from .transport import is_async_callable

logger = logging.getLogger("django_outbox")


class AgentCalls(OutboxBase):
    """The agent's calls of one delivery step (see the module docstring); constructed
    like :class:`~django_outbox.core.base.OutboxBase`."""

    def _route(
        self, ws: str, ses: str, deliverer: Callable[..., Any] | None
    ) -> tuple[Agent | None, str]:
        """``(the session's agent, "")``, its deliverer replaced by ``deliverer`` when one
        is given, or ``(None, why not)`` when the router fails or names no agent."""
        try:
            agent = self.agent_for(ws, ses)
        except UnknownAgent as exc:
            logger.warning("outbox: %s/%s: %s", ws, ses, describe_error(exc, with_type=False))
            return None, f"no agent: {describe_error(exc, with_type=False)}"
        if deliverer is not None and deliverer is not agent.deliverer:
            agent = Agent(agent.name, deliverer, agent.verifier, agent.aborter, agent.options)
        return agent, ""

    async def _deliver(
        self, agent: Agent, entry: Entry, ws: str, ses: str
    ) -> tuple[str, str, float, str]:
        """Call the agent's deliverer; classify its ending as ``(outcome, error text,
        hold seconds, agent reference)`` (the hold only for ``held``: a
        :class:`~django_outbox.core.errors.HoldDeliveryError`, the agent's ``Retry-After``;
        the reference only for ``delivered``: what the deliverer returned, as
        :func:`~django_outbox.core.rules.agent_ref_json` keeps it, else ``""``).

        Once ``DELIVERY_TIMEOUT`` has passed, the call's outcome is unknown whatever
        the deliverer does next — returns, raises, or swallows the cancellation —
        so any ending after the deadline is ambiguous and the verifier decides
        (docs/explanation/lifecycle.md, "What happens to a message"). A cancellation of the
        step that the deliverer swallowed is raised again here, after the fact, so the step
        records the attempt as ambiguous. The error text is built by
        :func:`~django_outbox.core.rules.describe_error`, which no exception's
        ``__str__`` can break.
        """
        deliverer = agent.deliverer
        if deliverer is None:
            return "transient", f"transient: agent {agent.name!r} has no deliverer", 0.0, ""
        timeout = self.config.delivery_timeout
        task = asyncio.current_task()
        cancelling = task.cancelling() if task is not None else 0
        deadline = time.monotonic() + timeout
        unknown = "ambiguous" if agent.verifier is not None else "unverifiable"
        try:
            if is_async_callable(deliverer):
                async with asyncio.timeout(timeout):
                    returned = await deliverer(
                        entry, workspace_id=ws, session_id=ses, attempt=entry.attempts + 1
                    )
            else:
                returned = await self._invoke_sync_deliverer(deliverer, entry, ws, ses)
        except AmbiguousError as exc:
            return unknown, f"ambiguous: {describe_error(exc, with_type=False)}", 0.0, ""
        except TimeoutError as exc:
            return unknown, self._timed_out(exc), 0.0, ""
        except Exception as exc:
            if time.monotonic() >= deadline:
                return unknown, self._timed_out(exc), 0.0, ""
            if isinstance(exc, TransientDeliveryError):
                return "transient", f"transient: {describe_error(exc, with_type=False)}", 0.0, ""
            if isinstance(exc, PriorAttemptPendingError):
                text = describe_error(exc, with_type=False)
                return "prior_pending", f"prior attempt pending: {text}", 0.0, ""
            if isinstance(exc, HoldDeliveryError):
                text = describe_error(exc, with_type=False)
                return "held", f"held for {exc.retry_after:g}s: {text}", exc.retry_after, ""
            return "failed", describe_error(exc), 0.0, ""
        if task is not None and task.cancelling() > cancelling:
            raise asyncio.CancelledError("the deliverer swallowed a cancellation")
        if time.monotonic() >= deadline:
            return unknown, self._timed_out(None), 0.0, ""
        return "delivered", "", 0.0, _agent_ref(agent, entry, returned)

    def _timed_out(self, exc: BaseException | None) -> str:
        text = f"timed out after {self.config.delivery_timeout}s"
        if exc is None or isinstance(exc, TimeoutError):
            return text
        return f"{text}, then {describe_error(exc)}"

    async def _invoke_sync_deliverer(
        self, deliverer: Callable[..., Any], entry: Entry, ws: str, ses: str
    ) -> Any:
        """Run a sync deliverer in a thread and wait for it to *finish*; returns what it
        returned (awaited when it is awaitable).

        A thread cannot be interrupted: abandoning it at ``DELIVERY_TIMEOUT``
        would release the lease while it still sends, and a verification that
        finds nothing yet would send the message again alongside it. So the
        lease is kept (renewed) until the call returns, and its real outcome is
        recorded; overstaying the timeout is logged. Sync deliverers must bound
        their own I/O (e.g. an HTTP client timeout).
        """
        call = asyncio.ensure_future(
            asyncio.to_thread(
                deliverer, entry, workspace_id=ws, session_id=ses, attempt=entry.attempts + 1
            )
        )
        done, _ = await asyncio.wait({call}, timeout=self.config.delivery_timeout)
        if not done:
            logger.warning(
                "outbox: sync deliverer for %s/%s %s exceeded DELIVERY_TIMEOUT (%ss); waiting for "
                "it to return (a thread cannot be interrupted)",
                ws,
                ses,
                entry.id,
                self.config.delivery_timeout,
            )
        result = await asyncio.shield(call)
        if inspect.isawaitable(result):
            async with asyncio.timeout(self.config.delivery_timeout):
                return await result
        return result

    async def _verify(
        self, entry: Entry, ws: str, ses: str, verifier: Callable[..., Any] | None
    ) -> tuple[str, str, str]:
        """Call the verifier; ``(outcome, error text, agent reference)``. A verifier returns
        a :class:`~django_outbox.core.entry.Verdict`, or ``(Verdict.DELIVERED, reference)``
        (docs/howto/deliverer.md#what-it-returns): the reference as in :meth:`_deliver`."""
        if verifier is None:
            return "unverifiable", "outcome unknown and no verifier is configured", ""
        try:
            async with asyncio.timeout(self.config.delivery_timeout):
                verdict = await self._invoke(verifier, entry, workspace_id=ws, session_id=ses)
        except Exception as exc:
            return "inconclusive", f"verifier failed: {describe_error(exc)}", ""
        verdict, ref = Verdict.split(verdict)
        if verdict is Verdict.DELIVERED:
            return "delivered", "", _agent_ref(None, entry, ref)
        if verdict is Verdict.ABSENT:
            return "absent", "verifier: the agent does not have it (absent)", ""
        if verdict is not Verdict.INCONCLUSIVE:
            logger.warning("outbox: verifier returned a %s, not a Verdict", type(verdict).__name__)
        return "inconclusive", "verifier: inconclusive", ""

    async def _invoke(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if is_async_callable(fn):
            return await fn(*args, **kwargs)
        result = await asyncio.to_thread(fn, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result


def _agent_ref(agent: Agent | None, entry: Entry, returned: Any) -> str:
    """What the entry keeps of ``returned`` as its ``agentRef``
    (:func:`~django_outbox.core.rules.agent_ref_json`); a mapping that breaks its rules is
    logged and dropped: the delivery stands."""
    ref, why = agent_ref_json(returned)
    if why:
        said = f"agent {agent.name!r}'s deliverer" if agent is not None else "the verifier"
        logger.warning("outbox: %s for %s returned %s; not kept", said, entry.id, why)
    return ref
