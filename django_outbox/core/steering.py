"""Steering the queue: edit, move and cancel a waiting prompt (docs/howto/steering.md).

A mixin of :class:`~django_outbox.core.service.Outbox`. Each operation is one Lua
script (``edit.lua``, ``move.lua``, ``cancel.lua``, sharing ``lib/steering.lua``) run by
a plan, so the sync and async twins share everything but the I/O. The prompt in flight
or being verified is never changed here: it answers ``BUSY`` / ``IN_FLIGHT``. Each takes
the ``actor`` who asks (:mod:`~django_outbox.core.actors`, ``system`` by default), which
its script records on the entry (``editedBy``, ``movedBy``, ``cancelledBy``).
"""

from __future__ import annotations

from typing import Any

from .actors import SYSTEM, check_actor
from .base import OutboxBase
from .entry import CONTENT_MARKER, CancelResult, EditResult, Entry, MoveResult
from .errors import InvalidContent
from .plans import Cmd, Emit, Plan
from .replies import OperatorReply
from .rules import check_identifier, check_model_allowed, validate_content
from .scripts import cancel_argv, edit_argv, move_argv

#: Times edit reads the entry again when another edit changed it meanwhile.
EDIT_TRIES = 5
#: Where ``move(to=...)`` may put a prompt (docs/howto/steering.md#reorder).
MOVE_TO = ("next", "last")


class QueueSteering(OutboxBase):
    """Edit, move and cancel (with async twins) for :class:`Outbox`."""

    def _steer_plan(
        self, script: str, workspace_id: str, session_id: str, argv: list[Any], state: str
    ) -> Plan[OperatorReply]:
        """Run one steering script and emit the events of what it changed, in ``state``
        (``edited``, ``moved``, ``cancelled``)."""
        reply = OperatorReply.parse(
            (yield self._session_eval(script, workspace_id, session_id, extra_args=argv))
        )
        if reply.changed:
            yield Emit(
                self._events(
                    "updated",
                    reply.changed,
                    workspace_id,
                    session_id,
                    reply.version,
                    state,
                    reply.watched,
                )
            )
        return reply

    def _edit_plan(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        text: Any,
        model: Any,
        if_version: Any,
        actor: Any = SYSTEM,
    ) -> Plan[EditResult]:
        check_identifier("entry ID", entry_id)
        check_actor(actor)
        if text is None and model is None:
            raise InvalidContent("nothing to edit: give text, model or both")
        if if_version is not None and (
            isinstance(if_version, bool) or not isinstance(if_version, int) or if_version < 0
        ):
            raise InvalidContent("if_version must be a session version (an integer >= 0)")
        # The rules of accept, checked before anything is read.
        validate_content("-" if text is None else text, model, "-", self.config.max_text_bytes)
        check_model_allowed(model, self.config.models)  # an edit is held to accept's list
        queue = self.keys.session(workspace_id, session_id).queue
        prefix = f'{{"id":"{entry_id}",'.encode()
        for _ in range(EDIT_TRIES):
            seen, content = "", ""
            for raw in (yield Cmd(("LRANGE", queue, 0, -1))):
                raw = raw if isinstance(raw, bytes) else str(raw).encode()
                if raw.startswith(prefix):
                    stored = raw.decode("utf-8")
                    seen = stored[stored.index(CONTENT_MARKER) :]
                    entry = Entry.from_json(stored)
                    changes: dict[str, Any] = {}
                    if text is not None:
                        changes["text"] = text
                    if model is not None:
                        changes["model"] = model
                    edited = entry.evolve(**changes).to_json()
                    content = edited[edited.index(CONTENT_MARKER) :]
                    break
            argv = edit_argv(entry_id, if_version, seen, content, self._history_ttl_ms, actor)
            reply = yield from self._steer_plan("edit", workspace_id, session_id, argv, "edited")
            if reply.result != "changed":
                return EditResult(reply.result)
        return EditResult.BUSY  # edited under us every time: let the caller read again

    def edit(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        text: str | None = None,
        model: dict[str, Any] | None = None,
        if_version: int | None = None,
        actor: str = SYSTEM,
    ) -> EditResult:
        """Replace the text and/or model (None: keep it) of a prompt that waits: pending,
        parked, expired or error (docs/howto/steering.md#edit). ``if_version``: the
        session version the caller saw (REST ``If-Match``); another version answers
        ``VERSION_MISMATCH`` and changes nothing. ``BUSY`` once it is being delivered or
        verified, ``NOT_FOUND`` if absent. The entry keeps its ID, place and state; its
        idempotency key still answers a resend of the original request as a duplicate of
        this entry (the key is bound to what was first sent; the same key with the edited
        text answers :class:`IdempotencyConflict`). ``actor`` (:mod:`~django_outbox.core.actors`:
        ``user:<userID>``, ``staff:<pk>``, ...) is recorded as the entry's ``editedBy``.
        Watchers get state ``edited``. Raises :class:`InvalidContent` (nothing to edit,
        text/model breaking accept's rules, a malformed ``actor``; :class:`ContentTooLarge`
        for sizes) and :class:`InvalidIdentifier`.
        """
        return self._run(
            self._edit_plan(workspace_id, session_id, entry_id, text, model, if_version, actor)
        )

    async def aedit(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        text: str | None = None,
        model: dict[str, Any] | None = None,
        if_version: int | None = None,
        actor: str = SYSTEM,
    ) -> EditResult:
        """Async :meth:`edit`."""
        return await self._arun(
            self._edit_plan(workspace_id, session_id, entry_id, text, model, if_version, actor)
        )

    def _move_plan(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        before: Any,
        to: Any,
        actor: Any = SYSTEM,
    ) -> Plan[MoveResult]:
        check_identifier("entry ID", entry_id)
        check_actor(actor)
        if (before is None) == (to is None):
            raise InvalidContent('give exactly one of before (an entry ID) or to ("next", "last")')
        if before is not None:
            check_identifier("entry ID", before)
            if before == entry_id:
                raise InvalidContent("an entry cannot move before itself")
            where = "before"
        elif to in MOVE_TO:
            where = to
        else:
            raise InvalidContent(f"to must be one of {', '.join(MOVE_TO)}")
        argv = move_argv(entry_id, where, before or "", self._history_ttl_ms, actor)
        reply = yield from self._steer_plan("move", workspace_id, session_id, argv, "moved")
        return MoveResult(reply.result)

    def move(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        before: str | None = None,
        to: str | None = None,
        actor: str = SYSTEM,
    ) -> MoveResult:
        """Reorder a queued prompt (docs/howto/steering.md#reorder): ``before`` another
        queued entry's ID, or ``to`` ``"next"`` (first after the entries held in place) or
        ``"last"``; exactly one. The prompt in flight or being verified never moves and
        nothing moves ahead of it: ``BUSY``. ``NOT_FOUND`` when the entry or ``before`` is
        not queued. ``MOVED`` also when it already stood there (nothing changes then).
        ``actor`` is recorded as the entry's ``movedBy`` when it moves. Watchers get state
        ``moved``. Raises :class:`InvalidContent` for a bad ``to``, both/neither given or a
        malformed ``actor``, :class:`InvalidIdentifier`.
        """
        return self._run(self._move_plan(workspace_id, session_id, entry_id, before, to, actor))

    async def amove(
        self,
        workspace_id: str,
        session_id: str,
        entry_id: str,
        *,
        before: str | None = None,
        to: str | None = None,
        actor: str = SYSTEM,
    ) -> MoveResult:
        """Async :meth:`move`."""
        return await self._arun(
            self._move_plan(workspace_id, session_id, entry_id, before, to, actor)
        )

    def _cancel_plan(
        self, workspace_id: str, session_id: str, entry_id: str, actor: Any = SYSTEM
    ) -> Plan[CancelResult]:
        check_identifier("entry ID", entry_id)
        check_actor(actor)
        argv = cancel_argv(entry_id, self._history_ttl_ms, actor)
        reply = yield from self._steer_plan("cancel", workspace_id, session_id, argv, "cancelled")
        return CancelResult(reply.result)

    def cancel(
        self, workspace_id: str, session_id: str, entry_id: str, *, actor: str = SYSTEM
    ) -> CancelResult:
        """Cancel a queued prompt (docs/howto/steering.md#cancel): removed as by
        :meth:`dismiss` (its key stays used), watchers get state ``cancelled`` with the
        removed entry carrying ``cancelledBy``: ``actor``. ``IN_FLIGHT`` when it is being
        delivered or verified (nothing changes: cutting the turn is another operation),
        ``NOT_FOUND`` if absent. Raises :class:`InvalidContent` for a malformed ``actor``.
        """
        return self._run(self._cancel_plan(workspace_id, session_id, entry_id, actor))

    async def acancel(
        self, workspace_id: str, session_id: str, entry_id: str, *, actor: str = SYSTEM
    ) -> CancelResult:
        """Async :meth:`cancel`."""
        return await self._arun(self._cancel_plan(workspace_id, session_id, entry_id, actor))
