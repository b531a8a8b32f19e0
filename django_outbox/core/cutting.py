"""Cutting a running turn: "Stop", and the in-flight branch of cancel (docs/howto/cutting.md).

:class:`TurnCuts` adds to :class:`~django_outbox.core.step.DeliveryStep`:

* :meth:`TurnCuts.interrupt` / :meth:`TurnCuts.cut` (and async twins): ``cut.lua``
  marks the entry in flight ``interrupted`` (a durable state member of the entry) and
  sets the session's cut signal, in one script, whichever process runs it;
* the lease holder's side: while an attempt runs, :class:`CutWatch` looks at the cut
  signals of every session its event loop holds, every :data:`CUT_POLL` seconds, in
  one round trip. On a cut, a delivery is cancelled (a prompt not yet sent is never
  sent), the aborter ends the agent's turn, and the attempt is recorded as ambiguous:
  the verifier decides. A verification of a cut entry aborts first (its turn may still
  run, e.g. after a worker died mid-cut);
* the settle (``lib/settle.lua``): a cut entry confirmed delivered stays ``interrupted``
  (``entry_delivered`` fires); one proven absent leaves as ``cancelled``, never sent.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from typing import Any, cast

from .actors import SYSTEM, check_actor, user_actor
from .agents import Agent, UnknownAgent
from .entry import Entry, InterruptResult, OutboxEvent, SendNowResult
from .errors import CutNotSupported, InvalidContent
from .plans import Cmd, Emit, Pipe, Plan, iter_once
from .replies import OperatorReply
from .rules import check_identifier, describe_error
from .scripts import cut_argv, send_now_argv
from .step import DeliveryStep
from .transport import as_text

logger = logging.getLogger("django_outbox")

#: Seconds between the lease holder's looks at the cut signals of its sessions.
CUT_POLL = 0.25
#: Outcomes a delivery may still reach after its cut: the agent has it (delivered), or it
#: provably does not (the settle then removes the cut entry as cancelled).
ENDED_BEFORE_THE_CUT = frozenset({"delivered", "failed", "transient", "prior_pending", "held"})
#: Seconds an aborter may take before the cut goes on without it (logged).
ABORT_TIMEOUT = 10.0
#: Seconds a cut delivery call is given to end once cancelled before the aborter is
#: called while it still runs: a deliverer (or a client library under it) that swallows
#: the cancellation often returns only when the agent's turn ends.
CANCEL_GRACE = 1.0


def _interrupting(accept: dict[str, Any]) -> dict[str, Any]:
    """``accept`` (keyword arguments of ``Outbox.accept``) with ``if_busy="interrupt"``;
    raises ``InvalidContent`` when it asks for another ``if_busy``."""
    if accept.get("if_busy", "interrupt") != "interrupt":
        raise InvalidContent("accept_interrupting takes ifBusy interrupt only")
    return {**accept, "if_busy": "interrupt"}


class CutWatch:
    """Looks at the cut signals of the attempts running on one event loop.

    Every :data:`CUT_POLL` seconds while at least one attempt is watched, one pipeline
    of ``GET``s reads the cut signal key of each watched session; a signal naming the
    watched entry sets that attempt's event. One background task per loop; it ends when
    nothing is watched.
    """

    def __init__(self, outbox: TurnCuts, loop: asyncio.AbstractEventLoop) -> None:
        self.outbox = outbox
        self.loop = loop
        #: attempt -> (signal key, entry ID, event set on a cut)
        self.watched: dict[str, tuple[str, str, asyncio.Event]] = {}
        self.task: asyncio.Task[None] | None = None

    def watch(self, token: str, key: str, entry_id: str) -> asyncio.Event:
        """Watch the attempt of ``entry_id`` named ``token`` (unique per attempt); its
        event is set once the signal ``key`` names the entry."""
        event = asyncio.Event()
        self.watched[token] = (key, entry_id, event)
        # A task that :meth:`unwatch` has just asked to stop ends at its next await, even
        # though it now has something to watch: start another.
        if self.task is None or self.task.done() or self.task.cancelling():
            self.task = self.loop.create_task(self._run())
        return event

    def unwatch(self, token: str) -> None:
        """Stop watching ``token``'s attempt; the last one ends the background task (so
        no look is left half-way when the outbox is closed)."""
        self.watched.pop(token, None)
        if not self.watched and self.task is not None and not self.task.done():
            self.task.cancel()

    async def _run(self) -> None:
        while self.watched:
            await asyncio.sleep(CUT_POLL)
            if not self.watched:
                return
            try:
                await self.look()
            except Exception:  # the next round looks again
                logger.warning("outbox: looking for cut turns failed", exc_info=True)

    async def look(self) -> None:
        """One round: read every watched signal, set the events of the cut attempts."""
        batch = list(self.watched.values())
        answers = await self.outbox._arun(iter_once(Pipe([Cmd(("GET", k)) for k, _, _ in batch])))
        for (_, entry_id, event), value in zip(batch, answers, strict=True):
            if isinstance(value, Exception):
                raise value
            if value is not None and as_text(value) == entry_id:
                event.set()


class TurnCuts(DeliveryStep):
    """Cutting a running turn (see the module docstring); constructed like
    :class:`~django_outbox.core.step.DeliveryStep` (``aborter=...``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cut_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CutWatch] = (
            weakref.WeakKeyDictionary()
        )
        self._last_cut_watch: CutWatch | None = None

    def _aborter(self, ws: str, ses: str) -> Callable[..., Any] | None:
        """The session's aborter (:meth:`aborter_for`), or None when turns cannot be cut:
        no aborter, or no agent the session's router names."""
        try:
            return self.aborter_for(ws, ses)
        except UnknownAgent:
            return None

    # -- the request: mark the cut ---------------------------------------------------------

    def _cut_plan(
        self,
        ws: str,
        ses: str,
        entry_id: str,
        named: str | None = None,
        actor: Any = SYSTEM,
    ) -> Plan[InterruptResult]:
        """``entry_id``: the entry whose turn :meth:`cut` cuts (``""``: the one in flight);
        ``named``: the entry a Stop names (:meth:`interrupt`), compared with the one in
        flight inside ``cut.lua``, in the same script that cuts; ``actor``: recorded as
        the cut entry's ``stoppedBy``."""
        check_identifier("workspace ID", ws)
        check_identifier("session ID", ses)
        if entry_id:
            check_identifier("entry ID", entry_id)
        if named is not None:
            check_identifier("entry ID", named)
        check_actor(actor)
        if self._aborter(ws, ses) is None:
            return InterruptResult.NOT_SUPPORTED
        argv = cut_argv(entry_id, self._lock_ttl_ms, named or "", actor)
        call = self._session_eval(
            "cut", ws, ses, extra_args=argv, extra_keys=[self.keys.cut(ws, ses)]
        )
        reply = OperatorReply.parse((yield call))
        if reply.result == "cut":
            yield Emit(
                self._events("updated", reply.changed, ws, ses, reply.version, None, reply.watched)
            )
        return InterruptResult(reply.result)

    def interrupt(
        self,
        workspace_id: str,
        session_id: str,
        *,
        entry_id: str | None = None,
        actor: str = SYSTEM,
    ) -> InterruptResult:
        """ "Stop": cut the session's running turn and send nothing new (docs/howto/cutting.md).

        Marks the entry in flight (or, when none is staged, the first one being verified)
        ``interrupted``; the lease holder, in whichever process, notices within
        :data:`CUT_POLL` seconds, stops a send not yet made and calls the aborter. The
        entry then ends verified: ``delivered`` with ``interrupted: true`` if the agent
        has it, else removed as ``cancelled``; it is never sent again. Queued entries
        stay queued.

        ``entry_id`` names the entry whose turn to stop: the one the caller showed in
        flight. Its turn is cut only while it is the entry in flight, checked and cut in
        one script; else nothing is cut and the answer is ``NOT_IN_FLIGHT`` (it was
        delivered, is gone or queued, or another entry is in flight). Without it, the
        Stop cuts whatever turn is in flight when it arrives: one sent as a turn ends may
        cut the next prompt's turn.

        ``actor`` (:mod:`~django_outbox.core.actors`) is recorded as the cut entry's
        ``stoppedBy`` (a turn cut before keeps its first). Returns
        :class:`InterruptResult` (``IDLE`` when nothing is in flight and no entry is named,
        ``NOT_SUPPORTED`` without an aborter). Raises ``ValueError`` for a bad ID or actor,
        :class:`~django_outbox.core.errors.OutboxUnavailable`.
        """
        return self._run(self._cut_plan(workspace_id, session_id, "", entry_id, actor))

    async def ainterrupt(
        self,
        workspace_id: str,
        session_id: str,
        *,
        entry_id: str | None = None,
        actor: str = SYSTEM,
    ) -> InterruptResult:
        """Async :meth:`interrupt`."""
        return await self._arun(self._cut_plan(workspace_id, session_id, "", entry_id, actor))

    def cut(
        self, workspace_id: str, session_id: str, entry_id: str, *, actor: str = SYSTEM
    ) -> InterruptResult:
        """Cut the turn of entry ``entry_id`` if it is in flight or being verified (the
        in-flight branch of cancel); as :meth:`interrupt` otherwise (``actor``: its
        ``stoppedBy``). ``QUEUED``: the entry waits in the queue and was never sent
        (remove it as a queued prompt instead); ``NOT_FOUND``: it is not in the session."""
        return self._run(self._cut_plan(workspace_id, session_id, entry_id, None, actor))

    async def acut(
        self, workspace_id: str, session_id: str, entry_id: str, *, actor: str = SYSTEM
    ) -> InterruptResult:
        """Async :meth:`cut`."""
        return await self._arun(self._cut_plan(workspace_id, session_id, entry_id, None, actor))

    def _send_now_plan(
        self, ws: str, ses: str, entry_id: str, actor: Any = SYSTEM, cut_only: str | None = None
    ) -> Plan[SendNowResult]:
        check_identifier("workspace ID", ws)
        check_identifier("session ID", ses)
        check_identifier("entry ID", entry_id)
        if cut_only:
            check_identifier("entry ID", cut_only)
        check_actor(actor)
        if self._aborter(ws, ses) is None:
            return SendNowResult.NOT_SUPPORTED
        argv = send_now_argv(entry_id, self._lock_ttl_ms, actor, cut_only)
        call = self._session_eval(
            "send_now", ws, ses, extra_args=argv, extra_keys=[self.keys.cut(ws, ses)]
        )
        reply = OperatorReply.parse((yield call))
        if reply.changed and self.listening("updated", reply.watched):
            moved, *cut = (Entry.from_json(raw) for raw in reply.changed)
            version, watched = reply.version, reply.watched
            events = [OutboxEvent("updated", "moved", moved, ws, ses, version, watched)]
            events += [
                OutboxEvent("updated", str(e.status), e, ws, ses, version, watched) for e in cut
            ]
            yield Emit(events)
        return SendNowResult(reply.result)

    def send_now(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        actor: str = SYSTEM,
        cut_only: str | None = None,
    ) -> SendNowResult:
        """Make queued prompt ``entry_id`` the session's next and cut the running turn
        (docs/howto/cutting.md). The prompt goes in front of every pending entry (entries
        being verified stay ahead: a cut turn is verified before anything else is sent);
        the turn in flight is cut as by :meth:`interrupt`. Only a ``pending`` prompt can
        be sent now (else ``BUSY``). Without an aborter nothing moves (``NOT_SUPPORTED``).
        ``actor`` is recorded as the prompt's ``movedBy`` and the cut entry's
        ``stoppedBy``. ``cut_only`` (an entry ID) cuts the turn only while it is that entry's
        (the one a caller was allowed to stop: docs/howto/access-policy.md#one-persons-prompt),
        ``""`` cuts none; else the prompt moves and nothing is cut (``MOVED``). Returns
        :class:`SendNowResult`; raises ``ValueError`` for a bad ID or actor,
        :class:`~django_outbox.core.errors.OutboxUnavailable`."""
        return self._run(self._send_now_plan(workspace_id, session_id, entry_id, actor, cut_only))

    async def asend_now(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        actor: str = SYSTEM,
        cut_only: str | None = None,
    ) -> SendNowResult:
        """Async :meth:`send_now`."""
        plan = self._send_now_plan(workspace_id, session_id, entry_id, actor, cut_only)
        return await self._arun(plan)

    def _interrupting(
        self, ws: str, ses: str, cut_only: str | None, accept: dict[str, Any]
    ) -> dict[str, Any]:
        """What :meth:`accept_interrupting` checks before anything is stored: ``accept``
        with ``if_busy="interrupt"`` (``InvalidContent`` for another), a well-formed
        ``cut_only``, an aborter (:class:`~django_outbox.core.errors.CutNotSupported`)."""
        accept = _interrupting(accept)
        if cut_only:
            check_identifier("entry ID", cut_only)
        if self._aborter(ws, ses) is None:
            raise CutNotSupported("no aborter is configured: the running turn cannot be cut")
        return accept

    def accept_interrupting(
        self, workspace_id: str, session_id: str, *, cut_only: str | None = None, **accept: Any
    ) -> tuple[Entry, SendNowResult]:
        """``ifBusy: "interrupt"``: accept a prompt (``accept``: the keyword arguments of
        :meth:`Outbox.accept`), make it the session's next, ahead of queued prompts, and
        cut the running turn (docs/howto/cutting.md). Returns the stored entry and what
        :meth:`send_now` did with it (``BUSY``: a worker claimed it first, so it runs
        already). Raises :class:`~django_outbox.core.errors.CutNotSupported` without an
        aborter, before anything is stored (no idempotency marker either), and whatever
        ``accept`` raises (a resend of the same key raises ``Duplicate`` and cuts nothing).
        ``accept(if_busy="interrupt")`` comes here; the entry's ``mode`` is ``interrupt``;
        an ``if_busy`` other than ``"interrupt"`` raises ``InvalidContent``. ``cut_only``: as
        for :meth:`send_now`."""
        accept = self._interrupting(workspace_id, session_id, cut_only, accept)
        entry: Entry = cast(Any, self)._accept_stored(workspace_id, session_id, **accept)
        # The accepting user's own act: the prompt's author moves it and cuts the turn.
        by = user_actor(entry.user_id)
        return entry, self.send_now(workspace_id, session_id, entry.id, actor=by, cut_only=cut_only)

    async def aaccept_interrupting(
        self, workspace_id: str, session_id: str, *, cut_only: str | None = None, **accept: Any
    ) -> tuple[Entry, SendNowResult]:
        """Async :meth:`accept_interrupting`."""
        accept = self._interrupting(workspace_id, session_id, cut_only, accept)
        entry: Entry = await cast(Any, self)._aaccept_stored(workspace_id, session_id, **accept)
        by = user_actor(entry.user_id)
        return entry, await self.asend_now(
            workspace_id, session_id, entry.id, actor=by, cut_only=cut_only
        )

    # -- the holder: watch the attempt, abort, let the verifier decide -------------------

    def _cut_watch(self) -> CutWatch:
        return self._loop_local("_last_cut_watch", self._cut_watches, lambda lp: CutWatch(self, lp))

    async def _deliver(
        self, agent: Agent, entry: Entry, ws: str, ses: str
    ) -> tuple[str, str, float, str]:
        if agent.aborter is None:
            return await super()._deliver(agent, entry, ws, ses)
        task = asyncio.ensure_future(super()._deliver(agent, entry, ws, ses))
        if not await self._until_cut(task, ws, ses, entry):
            return task.result()
        logger.info("outbox: %s/%s %s: turn cut during its delivery", ws, ses, entry.id)
        # Stop a send not yet made; one under way is settled by the verifier.
        task.cancel()
        if (await asyncio.wait({task}, timeout=CANCEL_GRACE))[0]:
            if not task.cancelled() and task.exception() is None:
                outcome, error, hold, ref = task.result()
                if outcome in ENDED_BEFORE_THE_CUT:
                    return outcome, error, hold, ref
            await self._abort(agent.aborter, entry, ws, ses)
        else:
            # The call swallowed the cancellation and may run until the turn ends: abort
            # it while it runs (a send it makes later starts a turn the verification
            # aborts again) and wait for it all the same, so nothing is recorded while it
            # may still send. How it then ends may be the abort's doing and proves
            # nothing: the verifier decides.
            logger.warning(
                "outbox: %s/%s %s: the delivery call did not end %ss after its cancellation;"
                " aborting the turn while it runs",
                ws,
                ses,
                entry.id,
                CANCEL_GRACE,
            )
            await self._abort(agent.aborter, entry, ws, ses)
            await asyncio.wait({task})
        unknown = "ambiguous" if agent.verifier is not None else "unverifiable"
        return unknown, "interrupted: the turn was cut; the verifier decides", 0.0, ""

    async def _verify(
        self, entry: Entry, ws: str, ses: str, verifier: Callable[..., Any] | None
    ) -> tuple[str, str, str]:
        aborter = self._aborter(ws, ses)
        if aborter is None:
            return await super()._verify(entry, ws, ses, verifier)
        if entry.interrupted:
            # Cut before (a worker may have died mid-cut): the turn may still run.
            await self._abort(aborter, entry, ws, ses)
        task = asyncio.ensure_future(super()._verify(entry, ws, ses, verifier))
        try:
            if await self._until_cut(task, ws, ses, entry):
                logger.info("outbox: %s/%s %s: turn cut during its verification", ws, ses, entry.id)
                await self._abort(aborter, entry, ws, ses)
            return await task
        finally:
            if not task.done():
                task.cancel()

    async def _until_cut(self, task: asyncio.Future[Any], ws: str, ses: str, entry: Entry) -> bool:
        """Wait until ``task`` ends or the session's cut signal names ``entry``; True when
        the cut came first. A cancellation of the caller cancels ``task`` too."""
        watch = self._cut_watch()
        key = f"{ws} {ses} {entry.id} {id(task)}"
        cut = asyncio.ensure_future(watch.watch(key, self.keys.cut(ws, ses), entry.id).wait())
        try:
            await asyncio.wait({task, cut}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            watch.unwatch(key)
            cut.cancel()
        return not task.done()

    async def _abort(self, aborter: Callable[..., Any], entry: Entry, ws: str, ses: str) -> bool:
        """Call the aborter (bounded by :data:`ABORT_TIMEOUT`); False (logged) if it
        failed. A failed abort changes no outcome: the verifier still decides."""
        try:
            async with asyncio.timeout(ABORT_TIMEOUT):
                await self._invoke(aborter, entry, workspace_id=ws, session_id=ses)
        except Exception as exc:
            logger.warning(
                "outbox: abort of %s/%s %s failed: %s", ws, ses, entry.id, describe_error(exc)
            )
            return False
        return True
