"""The lease keeper: every lease held on one event loop, renewed in one script call per round.

A worker holds a session's lease (``LOCK_TTL``) while its agent is called; the
delivery step (:mod:`~django_outbox.core.step`) hands each lease it takes to the
:class:`LeaseKeeper` of its event loop and takes it back when the step ends. The
keeper renews them every third of ``LOCK_TTL`` with ``renew.lua`` and notes a
lease it found lost, so the step knows its outcome is left to verification
(docs/explanation/lifecycle.md, docs/reference/commands.md "outbox_worker").
"""

from __future__ import annotations

import asyncio
import logging

from .base import OutboxBase
from .keys import SessionKeys
from .plans import Eval, Pipe, iter_once
from .scripts import renew_call

logger = logging.getLogger("django_outbox")


class LeaseKeeper:
    """Renews every lease held on one event loop, in one script call per round.

    A lease is renewed every third of ``LOCK_TTL`` (docs/reference/commands.md,
    "outbox_worker"); one background task serves all deliveries of the loop and ends when
    none is held.
    """

    def __init__(self, outbox: OutboxBase, loop: asyncio.AbstractEventLoop) -> None:
        self.outbox = outbox
        self.loop = loop
        self.held: dict[str, tuple[SessionKeys, str, str]] = {}
        self.lost: set[str] = set()
        self.task: asyncio.Task[None] | None = None

    def hold(self, token: str, keys: SessionKeys, workspace_id: str, session_id: str) -> None:
        self.held[token] = (keys, workspace_id, session_id)
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._run())

    def drop(self, token: str) -> bool:
        """Stop renewing; return True if the lease was seen lost meanwhile."""
        self.held.pop(token, None)
        if token in self.lost:
            self.lost.discard(token)
            return True
        return False

    async def _run(self) -> None:
        interval = self.outbox.config.lock_ttl / 3
        while self.held:
            await asyncio.sleep(interval)
            if not self.held:
                return
            try:
                await self.renew_now()
            except Exception:  # keep renewing: a lost round only shortens the lease
                logger.warning("outbox: lease renewal failed", exc_info=True)

    async def renew_now(self) -> None:
        batch = list(self.held.items())
        if not batch:
            return
        outbox = self.outbox
        # One script call for all leases on a standalone server; on a cluster one
        # per workspace (its keys share a slot), all in one pipeline.
        groups: dict[str, list[tuple[str, tuple[SessionKeys, str, str]]]] = {}
        for item in batch:
            groups.setdefault(item[1][1] if outbox.cluster else "", []).append(item)
        global_keys = [] if outbox.cluster else [outbox.keys.workspaces_due]
        calls = []
        for items in groups.values():
            leases = [
                (skeys.lock, skeys.due, token, session_id, workspace_id)
                for token, (skeys, workspace_id, session_id) in items
            ]
            keys, argv = renew_call(global_keys, outbox._now_us(), outbox._lock_ttl_ms, leases)
            calls.append(Eval("renew", keys, argv))
        results = await outbox._arun(iter_once(Pipe(calls)))
        for items, result in zip(groups.values(), results, strict=True):
            if isinstance(result, Exception):
                raise result
            for (token, _), ok in zip(items, result, strict=True):
                if not ok and token in self.held:
                    self.lost.add(token)
                    logger.warning("outbox: lease %s lost before the delivery ended", token)
