"""What a queue socket sends: its frames counted, its snapshots, its acknowledgements.

:class:`SnapshotSocket` is the part of the queue consumer
(:class:`~django_outbox.ws.consumer.OutboxConsumer`) that decides what goes out and
when: every frame counted against the client's read receipts, a close that happens
once (nothing is sent after it), a snapshot read from Valkey and sent in pages
(:func:`~django_outbox.ws.truth.snapshot_frames`) now or when ``WS_RESYNC_INTERVAL``
has passed, ``queue.current`` when nothing changed, and a client that does not read
what it was sent closed with 4408 (docs/reference/websocket.md#acknowledgements,
docs/explanation/security.md#slow-readers). The consumer drives it: who may connect,
resyncs, updates and the periodic check are its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from channels.generic.websocket import AsyncWebsocketConsumer

from ..core.redaction import redact
from ..core.rules import entry_for_viewer
from ..errors import OutboxUnavailable
from ..outbox import get_outbox
from .truth import ReadReceipts, SocketState, snapshot_frames

# The consumer's logger (logging configs name it).
logger = logging.getLogger("django_outbox.consumers")

#: What an error frame says (the cause, which may name servers, goes to the log only).
ERROR_TEXT = {
    "unavailable": "the queue store is unavailable right now; ask again with a resync",
    "internal": "the server could not handle this frame",
}
#: The client did not read what was sent (a slow or stopped reader,
#: docs/explanation/security.md#slow-readers): it may reconnect for a fresh snapshot.
CLOSE_BEHIND = 4408


class SnapshotSocket(AsyncWebsocketConsumer):
    """The sending side of one queue socket (see the module docstring). A subclass sets
    ``workspace_id`` and ``session_id`` before the first snapshot, and
    ``error_excerpts`` each time it asks the access policy."""

    workspace_id = ""
    session_id = ""
    #: Whether this socket's user reads ``lastError`` excerpts (staff; set each time the
    #: access policy is asked, :func:`~django_outbox.policy.reads_error_excerpts`).
    error_excerpts = False
    #: Bytes sent and not acknowledged (:class:`~django_outbox.ws.truth.ReadReceipts`)
    #: past which the next frame closes the socket with 4408 instead; a snapshot sent
    #: when everything before it was acknowledged always goes, whatever its size.
    MAX_UNREAD_BYTES = 16 * 1024 * 1024

    #: Seconds of a monotonic clock (tests may replace it).
    clock = staticmethod(time.monotonic)
    _state: SocketState | None = None

    @property
    def _live(self) -> SocketState:
        if self._state is None:
            self._state = SocketState(clock=self.clock)
        return self._state

    async def send(
        self, text_data: str | None = None, bytes_data: bytes | None = None, close: bool = False
    ) -> None:
        """Send a frame, unless a close of this socket was decided (then nothing)."""
        if self._live.closing:
            return
        if text_data is not None:
            self._reads.count(len(text_data.encode("utf-8", "surrogatepass")))
        await super().send(text_data=text_data, bytes_data=bytes_data, close=close)

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        """Close the socket with ``code`` (once: a second close is ignored, and so is a
        client that left first); every frame after this is dropped."""
        if self._live.closing:
            return
        self._live.closing = True
        try:
            await super().close(code=code, reason=reason)
        except OSError:  # the client left first (uvicorn's ClientDisconnected): closed
            logger.debug(
                "outbox: WebSocket to %s was gone before its close", self.scope.get("path")
            )

    # -- snapshots ---------------------------------------------------------------

    def _want_snapshot(self, server: bool = False) -> None:
        """Send a fresh snapshot now, or when ``WS_RESYNC_INTERVAL`` has passed since the
        last one (every request meanwhile is answered by that one snapshot). ``server``:
        the periodic check found the socket behind (sent even while the last snapshot
        is unacknowledged, within ``MAX_UNREAD_BYTES``); otherwise the client asked
        (:meth:`_snapshot_needed` decides)."""
        live = self._live
        if live.closing:
            return
        if server:
            self._server_wants = True
        already = live.snapshot_wanted
        live.snapshot_wanted = True
        if server and live.held_since is not None:
            # The client's request waits for an acknowledgement (nothing runs for it):
            # this snapshot answers it too.
            live.held_since = None
            already = False
        if not already:
            live.spawn(self._snapshot_when_due())

    async def _snapshot_when_due(self) -> None:
        live = self._live
        interval = get_outbox().config.ws_resync_interval
        wait = live.last_snapshot + interval - self.clock()
        if wait > 0:
            await asyncio.sleep(wait)
        if await self._snapshot_needed():
            await self._send_snapshot(wanted=True)

    async def _send_snapshot(self, wanted: bool = False) -> None:
        """Read the session and send it as ``queue.snapshot`` pages (no update between
        them); an unavailable Valkey gets an error frame. ``wanted``: this answers the
        requests :meth:`_want_snapshot` collected (later ones start another wait; while
        this one waits for a slow reader, none does)."""
        live = self._live
        if live.closing:
            return
        outbox = get_outbox()
        async with live.lock:
            if wanted:
                live.snapshot_wanted = False
                live.held_since = None
                self._server_wants = False
            live.last_snapshot = self.clock()
            try:
                snapshot = await outbox.asnapshot(self.workspace_id, self.session_id)
            except OutboxUnavailable as exc:
                await self._error("unavailable", str(exc))
                return
            token = ReadReceipts.new_token()
            frames = snapshot_frames(
                self.workspace_id,
                self.session_id,
                snapshot.version,
                (
                    entry_for_viewer(e.to_dict(), excerpt=self.error_excerpts)
                    for e in snapshot.entries
                ),
                outbox.config.ws_max_frame_bytes,
                ack=token,
                ended=[ending.to_dict() for ending in snapshot.endings],
            )
            if not await self._fits(sum(len(f.encode("utf-8", "surrogatepass")) for f in frames)):
                return
            for frame in frames:
                await self.send(text_data=frame)
            live.sent_snapshot(snapshot.version, not snapshot.entries)
            self._reads.expect(token, self._reads.sent)
            self._reads.snapshot_end = self._reads.sent

    # -- slow readers (docs/explanation/security.md#slow-readers) -----------------

    _receipts: ReadReceipts | None = None
    #: The periodic check wants a snapshot (the socket is behind Valkey).
    _server_wants = False

    @property
    def _reads(self) -> ReadReceipts:
        if self._receipts is None:
            self._receipts = ReadReceipts()
        return self._receipts

    async def acknowledged(self, token: Any) -> None:
        """Answer ``{"type": "ack", "ack": token}``: the client read everything up to the
        frame that carried ``token``. A snapshot the client asked for while the last one
        was unacknowledged goes now. An unknown token changes nothing."""
        if self._live.closing or not self._reads.ack(token):
            return
        live = self._live
        if live.held_since is not None and not self._reads.snapshot_unread:
            live.held_since = None
            live.spawn(self._snapshot_when_due())

    async def _snapshot_needed(self) -> bool:
        """Whether a wanted snapshot goes now. One the periodic check wants always does.
        One the client asked for waits while the last snapshot may be unread (it is not
        acknowledged: :meth:`acknowledged` sends it) and the unacknowledged bytes reach
        ``WS_MAX_FRAME_BYTES`` (below that, a small queue's snapshots go to a client
        that does not acknowledge); when the session's version is still the last
        snapshot's, a ``queue.current`` frame answers instead."""
        live = self._live
        if live.closing:
            return False
        if self._server_wants:
            return True
        unread = self._reads.unread
        if self._reads.snapshot_unread and unread >= get_outbox().config.ws_max_frame_bytes:
            if live.held_since is None:
                live.held_since = self.clock()
            return False
        try:
            held = await get_outbox().asession_version(self.workspace_id, self.session_id)
        except OutboxUnavailable:
            return True  # the snapshot's read reports it
        if not live.unchanged_since_snapshot(held) or self._server_wants:
            return True
        async with live.lock:
            live.snapshot_wanted = False
            live.last_snapshot = self.clock()
            await self._send_current()
        return False

    async def _send_current(self) -> None:
        """Send ``{"type": "queue.current", "workspaceID", "sessionID", "version", "ack"}``:
        the socket was sent everything up to ``version``; the client echoes the token
        ``ack``. Call with the socket's lock held."""
        token = ReadReceipts.new_token()
        frame = {
            "type": "queue.current",
            "workspaceID": self.workspace_id,
            "sessionID": self.session_id,
            "version": self._live.version,
            "ack": token,
        }
        await self.send(text_data=json.dumps(frame))
        self._reads.expect(token, self._reads.sent)

    async def _fits(self, nbytes: int) -> bool:
        """Whether a frame (or snapshot) of ``nbytes`` may go: nothing unacknowledged, or
        the unacknowledged bytes stay within ``MAX_UNREAD_BYTES``. Otherwise the socket
        is closed with 4408 (behind) and False returned."""
        unread = self._reads.unread
        if unread == 0 or unread + nbytes <= self.MAX_UNREAD_BYTES:
            return True
        logger.warning(
            "outbox: WebSocket to %s closed with 4408: %d bytes sent are unacknowledged "
            "(a client that stopped reading)",
            self.scope.get("path"),
            unread,
        )
        await self.close(code=CLOSE_BEHIND)
        return False

    async def _check_reading(self) -> bool:
        """The periodic check's part for slow readers: a snapshot the client asked for
        that waited a whole ``WS_CHECK_INTERVAL`` for the last one's acknowledgement
        closes the socket with 4408 (False); updates sent since the last token get a
        ``queue.current`` with a new token, so a reading client acknowledges them."""
        live = self._live
        interval = get_outbox().config.ws_check_interval
        if live.held_since is not None and self.clock() - live.held_since >= interval:
            logger.warning(
                "outbox: WebSocket to %s closed with 4408: its last snapshot is still "
                "unacknowledged after %.0f s",
                self.scope.get("path"),
                self.clock() - live.held_since,
            )
            await self.close(code=CLOSE_BEHIND)
            return False
        reads = self._reads
        # Not while a snapshot or an update is being sent (uvicorn's send waits for a
        # reader that does not read): the next check asks.
        if live.snapshots and reads.sent > reads.token_end and not live.lock.locked():
            async with live.lock:
                if not live.closing and await self._fits(64):
                    await self._send_current()
        return not live.closing

    async def _error(self, code: str, detail: str = "") -> None:
        """Send an error frame ``{"type": "error", "code", "detail"}``. For the codes of
        :data:`ERROR_TEXT` the client gets that fixed text and ``detail`` (which may
        name a server) is logged instead."""
        public = ERROR_TEXT.get(code)
        if public is not None:
            if detail:
                logger.warning(
                    "outbox: error frame %r to %s: %s", code, self.scope.get("path"), redact(detail)
                )
            detail = public
        await self.send(text_data=json.dumps({"type": "error", "code": code, "detail": detail}))
