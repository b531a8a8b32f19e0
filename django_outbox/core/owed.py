"""Owed ``entry_delivered`` signals that keep failing: their failed firings, counted in
Valkey across workers, and the bound after which they wait for staff
(docs/reference/signals.md#a-receiver-that-keeps-failing).

A delivered entry whose opted-in receiver raised stays staged with its signal owed, and the
session's next claim fires it again (``step.py``). :class:`OwedSignals` counts each failed
firing in the session's HASH ``<prefix>owedfail:{ws}:<ses>`` (entry ID -> failures, kept
``DEDUPE_TTL`` after the last); at ``MAX_RECEIVER_ATTEMPTS`` the workers stop firing it and
log that it waits for staff, who read the counts (:meth:`OwedSignals.owed_failures`), the
owed entry (:meth:`OwedSignals.owed_entry`) and reset them (:meth:`reset_owed_failures`).
"""

from __future__ import annotations

import logging
from typing import Any

from .base import OutboxBase
from .entry import Entry
from .plans import Cmd, Pipe, Plan, iter_once
from .replies import SnapshotReply
from .transport import as_text

logger = logging.getLogger("django_outbox")


class OwedSignals(OutboxBase):
    """The failed firings of owed ``entry_delivered`` signals (see the module docstring)."""

    def _staged_delivered_plan(
        self, ws: str, ses: str, entry_id: str
    ) -> Plan[tuple[int, Entry | None]]:
        """``(version, entry)``: the session's version and the entry as its delivered-settle
        staged it (with its ``delivered_at``, the receivers' idempotency key), or ``None``
        when it is no longer staged (another holder fired and acknowledged its signal)."""
        snapshot = SnapshotReply.parse((yield self._session_eval("snapshot", ws, ses)))
        for raw in snapshot.staged:
            staged = Entry.from_json(raw)
            if staged.id == entry_id and staged.delivered_at is not None:
                return snapshot.version, staged
        return snapshot.version, None

    async def aowed_failures(self, workspace_id: str, session_id: str) -> dict[str, int]:
        """``{entry ID: failed firings}`` of the session's owed ``entry_delivered`` signals
        (an opted-in receiver raised); one at ``MAX_RECEIVER_ATTEMPTS`` or more is held
        for staff (docs/reference/signals.md#a-receiver-that-keeps-failing). Raises
        :class:`~django_outbox.core.errors.OutboxUnavailable`."""
        key = self.keys.owed_failures(workspace_id, session_id)
        raw = await self._arun(iter_once(Cmd(("HGETALL", key))))
        return _counts(raw)

    def owed_failures(self, workspace_id: str, session_id: str) -> dict[str, int]:
        """Sync :meth:`aowed_failures`."""
        key = self.keys.owed_failures(workspace_id, session_id)
        return _counts(self._run(iter_once(Cmd(("HGETALL", key)))))

    def owed_entry(self, workspace_id: str, session_id: str, entry_id: str) -> Entry | None:
        """The delivered entry whose ``entry_delivered`` is still owed (staged, with its
        ``delivered_at``: the receivers' idempotency key), or None. Raises
        ``InvalidIdentifier``, :class:`~django_outbox.core.errors.OutboxUnavailable`."""
        _, entry = self._run(self._staged_delivered_plan(workspace_id, session_id, entry_id))
        return entry

    def reset_owed_failures(self, workspace_id: str, session_id: str, entry_id: str) -> bool:
        """Forget the failed firings of ``entry_id``'s owed signal, so the session's next
        claim (within ``LOCK_TTL``) fires it again, up to ``MAX_RECEIVER_ATTEMPTS`` more
        times. Returns whether there were any. Raises ``InvalidIdentifier``,
        :class:`~django_outbox.core.errors.OutboxUnavailable`."""
        key = self.keys.owed_failures(workspace_id, session_id)
        return bool(self._run(iter_once(Cmd(("HDEL", key, entry_id)))))

    def _held_for_staff(self, ws: str, ses: str, ids: list[str], failures: dict[str, int]) -> bool:
        """Whether an owed signal of ``ids`` failed ``MAX_RECEIVER_ATTEMPTS`` times: then
        nothing is fired, and a WARNING says what staff can do."""
        held = [i for i in ids if failures.get(i, 0) >= self.config.max_receiver_attempts]
        if held:
            logger.warning(
                "outbox: %s/%s: entry_delivered of %s failed %d times and waits for staff: "
                "manage.py outbox owed %s %s <entry> --retry or --skip "
                "(docs/reference/signals.md#a-receiver-that-keeps-failing)",
                ws,
                ses,
                ", ".join(held),
                self.config.max_receiver_attempts,
                ws,
                ses,
            )
        return bool(held)

    async def _aforget_owed_failures(self, ws: str, ses: str, ids: list[str]) -> None:
        """Drop the counts of ``ids`` once their signal was fired and acknowledged."""
        await self._arun(iter_once(Cmd(("HDEL", self.keys.owed_failures(ws, ses), *ids))))

    async def _acount_owed_failures(self, ws: str, ses: str, ids: list[str]) -> None:
        """Count one failed firing of each of ``ids``' owed signal (never raises: a count
        lost to an unavailable Valkey only allows one more attempt)."""
        if not ids:
            return
        key = self.keys.owed_failures(ws, ses)
        ttl = self._dedupe_ttl_ms
        try:
            await self._arun(
                iter_once(
                    Pipe([*(Cmd(("HINCRBY", key, i, 1)) for i in ids), Cmd(("PEXPIRE", key, ttl))])
                )
            )
        except Exception:
            logger.exception("outbox: %s/%s: could not count a failed receiver", ws, ses)


def _counts(raw: Any) -> dict[str, int]:
    """An HGETALL answer (a dict, or a flat list) as ``{field: int}``."""
    if isinstance(raw, dict):
        pairs = list(raw.items())
    else:
        flat = list(raw or [])
        pairs = list(zip(flat[::2], flat[1::2], strict=True))
    return {as_text(k): int(v) for k, v in pairs}
