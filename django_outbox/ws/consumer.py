"""The queue WebSocket consumer: a snapshot on connect, then every ``queue.update``.

docs/reference/websocket.md describes the frames. Route:
``ws/outbox/workspaces/<ws>/sessions/<ses>/`` (see :mod:`django_outbox.ws.routing`).
The user comes from the scope (``AuthMiddlewareStack``, or any middleware that
sets ``scope["user"]``, e.g. a token middleware); the access policy decides
(action ``view``, docs/howto/access-policy.md), on connect, on every resync and at
every periodic check, with the user read afresh from the database and, when the
scope has a Django login session, that session read afresh (a refusal, a logout
or a password change closes with 4403), after the scope's ``outbox_revalidate`` and
at once when a revocation is pushed (:mod:`django_outbox.ws.revoke`,
docs/explanation/security.md#live-connections). Frames the client may send:
``{"type": "resync"}`` → a fresh ``queue.snapshot`` (at most one per
``WS_RESYNC_INTERVAL``, resyncs in between coalesce; more than
``WS_RESYNC_BUDGET`` in 60 s close with 4429; nothing changed since the last snapshot →
``queue.current``); ``{"type": "ack", "ack": <token>}`` → the client read up to the frame
that carried the token (docs/reference/websocket.md#acknowledgements: a requested snapshot
waits while the last one is unacknowledged, and a socket that stays behind closes with
4408, docs/explanation/security.md#slow-readers). Anything else gets an error frame
and the socket stays open; binary frames (close 1003) and frames over
``MAX_FRAME_BYTES`` (close 1009) close that socket only.

Staying true (docs/reference/websocket.md#staying-true): every ``WS_CHECK_INTERVAL``
seconds each socket re-authorises, re-joins its group (channels-redis forgets
members after ``group_expiry``), and compares the session's version in Valkey
with the highest version it sent; behind (the channel layer lost something) or
ahead (Valkey lost something) → a fresh snapshot. Snapshots go out in pages of at
most ``WS_MAX_FRAME_BYTES`` (:func:`django_outbox.ws.truth.snapshot_frames`); when
they go, and what the client acknowledged, is :mod:`django_outbox.ws.snapshots`.

Every refusal accepts the handshake and then closes with its code, so the code
reaches the client through a real server (a close before accepting is an HTTP 403
on the wire, seen as 1006): 4400 an invalid ID, 4403 refused by the access policy,
4429 the user holds ``WS_MAX_SOCKETS_PER_USER`` sockets already (or a resync
flood), 4408 a client that stopped reading, 4503 Valkey or the channel layer unreachable
(after one retry), 4500 no
channel layer configured or an unexpected error. No frame is sent before such a
close. Whatever fails while a message is handled, the socket's registrations
(watcher count, group, socket count) are undone when it closes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from importlib import import_module
from typing import Any

from asgiref.sync import sync_to_async
from channels.auth import get_user
from channels.exceptions import StopConsumer
from django.conf import settings
from django.db.models import Model

from ..conf import outbox_settings
from ..core.redaction import redact
from ..core.rules import IDENTIFIER_RE, entry_for_viewer
from ..outbox import get_outbox
from ..policy import is_allowed, reads_error_excerpts
from .publish import group_name
from .revoke import join_user_group, leave_user_group, rejoin_user_group, revalidate
from .snapshots import CLOSE_BEHIND as CLOSE_BEHIND
from .snapshots import ERROR_TEXT as ERROR_TEXT
from .snapshots import SnapshotSocket
from .truth import PUBLISH_GRACE, ResyncBudget, is_behind

# The logger keeps the name it had before the module moved into ws/ (logging configs use it).
logger = logging.getLogger("django_outbox.consumers")

MAX_FRAME_BYTES = 64 * 1024
CLOSE_UNSUPPORTED = 1003  # binary frames
CLOSE_TOO_BIG = 1009
CLOSE_FORBIDDEN = 4403
CLOSE_INVALID = 4400
CLOSE_UNAVAILABLE = 4503
CLOSE_TOO_MANY = 4429
#: Server error (no channel layer, an unexpected failure). Not 1011: daphne (autobahn)
#: refuses an application close code outside 1000 and 3000-4999.
CLOSE_INTERNAL = 4500
#: A socket counts towards its user's ``WS_MAX_SOCKETS_PER_USER`` for this many
#: ``WS_CHECK_INTERVAL`` after it was counted or last refreshed (every periodic check
#: refreshes it), and at least :data:`MIN_SOCKET_TTL` seconds: a socket of a server
#: process that died stops counting after this long.
SOCKET_TTL_CHECKS = 3
MIN_SOCKET_TTL = 60.0
#: A client sending more than ``WS_RESYNC_BUDGET`` resyncs a minute ("slow down", as 4429).
CLOSE_TOO_MANY_RESYNCS = CLOSE_TOO_MANY
#: Seconds the socket's clean-up on disconnect (group, watcher and socket counts) may
#: take before it is given up: an unreachable Valkey must not hold a server's shutdown
#: (the counts expire on their own).
RELEASE_DEADLINE = 1.0
#: Seconds between two cancellations of a channel-layer receive that a cancellation did
#: not end (see :func:`receive_until_cancelled`); given up after :data:`RELEASE_DEADLINE`.
RECEIVE_CANCEL_REPEAT = 0.05


class OutboxConsumer(SnapshotSocket):
    """One client watching one session's queue: who may connect and stay, what the client
    asks, what the channel layer relays; what is sent and when (snapshots, pages, read
    receipts, the close) is :class:`~django_outbox.ws.snapshots.SnapshotSocket`'s."""

    group: str | None = None
    #: True while this socket is counted in the session's watcher count.
    watching = False
    #: The user whose socket count holds this socket (None: not counted).
    socket_user: str | None = None
    socket_id = ""

    #: Attempts of the channel layer's receive before the socket gives up (a pooled
    #: connection may be stale after a Valkey restart), with doubling delays from
    #: :data:`LAYER_RETRY_DELAY` seconds.
    LAYER_RECEIVE_ATTEMPTS = 5
    LAYER_RETRY_DELAY = 0.1
    RETRY_PAUSE = 0.2  #: seconds before a failed step of connect is tried again

    @property
    def channel_receive(self) -> Callable[[], Awaitable[dict[str, Any]]]:
        """The channel layer's receive for this socket, retried on failure (channels
        calls it outside :meth:`dispatch`, so a failure there would end the socket with
        a traceback instead of a close code), and ended by the socket's end: cancelled,
        it ends even when the layer swallows the cancellation
        (:func:`receive_until_cancelled`), and once the socket is closing a failure is
        neither retried nor raised (the socket's end cancels it)."""
        return self._channel_receive

    @channel_receive.setter
    def channel_receive(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        async def resilient() -> dict[str, Any]:
            delay = self.LAYER_RETRY_DELAY
            for attempt in range(1, self.LAYER_RECEIVE_ATTEMPTS + 1):
                try:
                    return await receive_until_cancelled(receive)
                except Exception as exc:
                    if self._live.closing:
                        # Channels cancels this receive as the socket ends: raised, the
                        # failure would end the application with a traceback instead.
                        await asyncio.Event().wait()
                    if attempt == self.LAYER_RECEIVE_ATTEMPTS:
                        logger.warning(
                            "outbox: the channel layer's receive failed %d times: %s",
                            attempt,
                            redact(f"{type(exc).__name__}: {exc}"),
                        )
                        raise
                    await asyncio.sleep(delay)
                    delay *= 2
            raise AssertionError("unreachable")  # pragma: no cover

        self._channel_receive = resilient

    async def connect(self) -> None:
        """Check the IDs and the access policy, count the user's socket and the session's
        watcher, join the group, accept and send the snapshot. A refusal accepts and
        closes: 4400 (bad ID), 4403 (denied), 4429 (too many sockets), 4503 (Valkey or
        the channel layer down), 4500 (no channel layer, or an unexpected error)."""
        try:
            code = await self._admit()
        except Exception:
            logger.exception("outbox: WebSocket connect to %s failed", self.scope.get("path"))
            code = CLOSE_INTERNAL
        if code is not None:
            await self._release()
            await self._refuse(code)
            return
        await self.accept()
        try:
            await self._send_snapshot()
        except Exception:
            logger.exception("outbox: cannot send the snapshot to %s", self.scope.get("path"))
            await self.close(code=CLOSE_INTERNAL)
            return
        self._start_checks()

    async def _admit(self) -> int | None:
        """Everything :meth:`connect` does before accepting; the close code of a refusal,
        or None once the socket is counted and in its group."""
        if self.channel_layer is None:
            logger.error(
                "outbox: WebSocket to %s closed with 4500: CHANNEL_LAYERS is missing from "
                "the settings, so no queue update could reach it "
                "(docs/reference/websocket.md, close code 4500)",
                self.scope.get("path"),
            )
            return CLOSE_INTERNAL
        kwargs = self.scope["url_route"]["kwargs"]
        self.workspace_id = kwargs.get("workspace_id", "")
        self.session_id = kwargs.get("session_id", "")
        if not (
            IDENTIFIER_RE.fullmatch(self.workspace_id) and IDENTIFIER_RE.fullmatch(self.session_id)
        ):
            return CLOSE_INVALID
        try:  # before the policy is asked: a revocation from then on reaches this socket
            user_id = socket_user_id(self.scope.get("user"))
            await self._retry_once("join the user's group", lambda: join_user_group(self, user_id))
        except Exception:
            return CLOSE_UNAVAILABLE
        if not await self._allowed(fresh=False):
            return CLOSE_FORBIDDEN
        try:
            if not await self._retry_once("count the user's socket", self._open_socket):
                return CLOSE_TOO_MANY
            # Count this client before joining the group and reading the snapshot, so
            # every change is either in the snapshot or published (see publish.py).
            await self._retry_once("register a watcher", self._count_watcher)
            await self._retry_once("join the session's group", self._join_group)
        except Exception:
            return CLOSE_UNAVAILABLE
        return None

    async def disconnect(self, code: int) -> None:
        """Stop the periodic check, leave the group, uncount the watcher and the user's
        socket (best effort: the counts expire on their own), giving up after
        :data:`RELEASE_DEADLINE` seconds so that a hung Valkey never holds a server's
        shutdown (docs/howto/deploy.md#stopping-the-server)."""
        self._live.cancel()
        try:
            await asyncio.wait_for(self._release(), RELEASE_DEADLINE)
        except TimeoutError:
            logger.warning(
                "outbox: leaving %s took over %.0f s (Valkey unreachable?); its counts "
                "expire on their own",
                self.scope.get("path"),
                RELEASE_DEADLINE,
            )

    async def dispatch(self, message: dict[str, Any]) -> None:
        """Channels' dispatch, made to survive what a handler raises: a frame that fails
        gets an error frame (the socket stays open); any other failure is logged and
        closes the socket with 4500; a failed disconnect still undoes the counts."""
        try:
            await super().dispatch(message)
        except StopConsumer:
            raise
        except Exception:
            kind = message.get("type")
            logger.exception("outbox: WebSocket %s failed on %s", kind, self.scope.get("path"))
            if kind == "websocket.disconnect":
                await self._release()
                raise StopConsumer() from None
            try:
                if kind == "websocket.connect":
                    await self._release()
                    await self._refuse(CLOSE_INTERNAL)
                elif kind == "websocket.receive":
                    await self._error("internal")
                else:
                    await self.close(code=CLOSE_INTERNAL)
            except Exception as exc:  # the client is gone: its disconnect releases
                logger.warning("outbox: cannot answer a failure: %s", redact(str(exc)))

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        """Answer ``{"type": "resync"}`` (see :meth:`resync`); anything else with an error
        frame."""
        if bytes_data is not None:
            await self.close(code=CLOSE_UNSUPPORTED)
            return
        text = text_data or ""
        if len(text.encode("utf-8", "surrogatepass")) > MAX_FRAME_BYTES:
            await self.close(code=CLOSE_TOO_BIG)
            return
        try:
            message = json.loads(text)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            await self._error("malformed", "frames must be JSON objects")
            return
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "resync":
            await self.resync()
        elif kind == "ack":
            await self.acknowledged(message.get("ack"))
        else:
            await self._error(
                "unknown_type",
                'a client may send {"type": "resync"} or {"type": "ack", "ack": "<token>"}',
            )

    async def queue_update(self, message: dict[str, Any]) -> None:
        """Relay a ``queue.update`` from the channel layer (never between the pages of a
        snapshot, nothing once a close is decided)."""
        live = self._live
        async with live.lock:
            if live.closing:
                return
            entry = message.get("entry")
            if isinstance(entry, dict):
                message = {**message, "entry": entry_for_viewer(entry, excerpt=self.error_excerpts)}
            text = json.dumps(message, ensure_ascii=False)
            if not await self._fits(len(text.encode("utf-8", "surrogatepass"))):
                return
            await self.send(text_data=text)
            version = message.get("version")
            if isinstance(version, int):
                live.sent_update(version)

    # -- the client leaving -----------------------------------------------------------

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Channels' entry point, noting the server's ``websocket.disconnect`` as soon as
        it is handed over (before the running handler ends): nothing is sent after it,
        not even a close, which uvicorn would raise on ("Unexpected ASGI message").
        Cancelled (a server stopping, a connection dropped without a disconnect), it
        cancels this socket's tasks too and re-raises: nothing of the socket runs on."""

        async def receive_noting_disconnect() -> Any:
            message = await receive()
            if message.get("type") == "websocket.disconnect":
                self._live.closing = True
            return message

        try:
            await super().__call__(scope, receive_noting_disconnect, send)
        finally:
            # The server cancels the application at shutdown or when the connection
            # drops without a disconnect message: this socket's own tasks (its checks,
            # a coalesced snapshot) end with it (docs/howto/deploy.md#stopping-the-server).
            self._live.cancel()

    # -- staying true (docs/reference/websocket.md#staying-true) --------------------

    _budget: ResyncBudget | None = None

    def _start_checks(self) -> None:
        """Start this socket's periodic check (when the socket is open and in its group)."""
        if self.group is not None and not self._live.closing:
            self._live.spawn(self._checks())

    async def _checks(self) -> None:
        interval = get_outbox().config.ws_check_interval
        task = asyncio.current_task()
        while not self._live.closing:
            if task is not None and task.cancelling():
                # A cancellation a library swallowed (Python 3.11's wait_for, in
                # redis-py's send, returns a result that arrived with the cancel): the
                # checks end anyway instead of running on unowned.
                raise asyncio.CancelledError()
            await asyncio.sleep(interval)
            try:
                await self.check(grace=min(PUBLISH_GRACE, interval / 2))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed check is tried again next interval
                logger.warning(
                    "outbox: live check of %s/%s failed: %s",
                    self.workspace_id,
                    self.session_id,
                    exc,
                )

    async def check(self, grace: float = 0.0) -> None:
        """One periodic check: re-authorise (refused → close 4403), re-join the group,
        renew the watcher count, and send a fresh snapshot if the socket is behind or
        ahead of the session's version in Valkey. ``grace``: seconds an update already
        published may take to arrive before the socket counts as behind."""
        live = self._live
        if live.closing:
            return
        refused = await self._reauthorise()
        if refused is not None:
            await self.close(code=refused)
            return
        if not await self._check_reading():
            return
        if self.group is not None:
            try:
                await self.channel_layer.group_add(self.group, self.channel_name)
            except Exception as exc:  # the version check below still converges
                logger.warning("outbox: cannot re-join group %s: %s", self.group, exc)
        await rejoin_user_group(self)
        await self.refresh_socket()
        before = live.version
        held = await get_outbox().asession_version(
            self.workspace_id, self.session_id, watching=True
        )
        if is_behind(live, held, before) and grace > 0 and held is not None:
            await asyncio.sleep(grace)  # an update on its way arrives meanwhile
        if is_behind(live, held, before):
            logger.info(
                "outbox: watcher of %s/%s at version %s, Valkey at %s: a fresh snapshot",
                self.workspace_id,
                self.session_id,
                live.version,
                held,
            )
            self._want_snapshot(server=True)

    # -- re-validation (docs/explanation/security.md#live-connections) ------------

    #: This socket's user's group and login session's digest (:mod:`~django_outbox.ws.revoke`).
    user_group: str | None = None
    session_digest: str | None = None

    async def outbox_revoke(self, message: dict[str, Any]) -> None:
        """A revocation pushed to this user's sockets (:mod:`django_outbox.ws.revoke`): its
        login session ended → close 4403; else re-authorise now (:meth:`_reauthorise`)."""
        if self._live.closing:
            return
        ended = message.get("session")
        if ended is not None and ended == self.session_digest:
            refused: int | None = CLOSE_FORBIDDEN
        else:
            refused = await self._reauthorise()
        if refused is not None:
            logger.info(
                "outbox: WebSocket to %s closed with %d: its user's access was revoked",
                self.scope.get("path"),
                refused,
            )
            await self.close(code=refused)

    async def _reauthorise(self) -> int | None:
        """What a live socket must still pass, as a close code (None: it does): the scope's
        ``outbox_revalidate`` (:func:`~django_outbox.ws.revoke.revalidate`; raised: 4503,
        the client reconnects and re-authenticates), then :meth:`_still_allowed` (4403)."""
        valid = await revalidate(self.scope)
        if valid is None:
            return CLOSE_UNAVAILABLE
        if not valid or not await self._still_allowed():
            return CLOSE_FORBIDDEN
        return None

    async def _still_allowed(self) -> bool:
        """The access policy's answer for the user as it is now: with a Django login
        session in the scope, the user that session (read afresh) belongs to, which must
        be the one the socket connected as (a logout, a flushed session or a password
        change give none); otherwise the scope's user read afresh from the database."""
        session = self.scope.get("session")
        key = getattr(session, "session_key", None) if session is not None else None
        user = self.scope.get("user")
        if key is None or not getattr(user, "is_authenticated", False):
            return await self._allowed(fresh=True)
        store = import_module(settings.SESSION_ENGINE).SessionStore(key)
        current = await get_user({"session": store})
        if not current.is_authenticated or current.pk != getattr(user, "pk", None):
            return False
        return await sync_to_async(self._may_view)(current)

    async def resync(self) -> None:
        """Answer a client's ``{"type": "resync"}``: past ``WS_RESYNC_BUDGET`` resyncs in
        60 s close with 4429; a policy that refuses now (or a login that is gone) closes
        with 4403; else a fresh snapshot, now or when ``WS_RESYNC_INTERVAL`` has passed
        since the last one (resyncs meanwhile share it). Nothing once a close is decided."""
        if self._live.closing:
            return
        if self._budget is None:
            self._budget = ResyncBudget(get_outbox().config.ws_resync_budget, self.clock)
        if not self._budget.spend():
            await self.close(code=CLOSE_TOO_MANY_RESYNCS, reason="too many resyncs")
            return
        refused = await self._reauthorise()
        if refused is not None:
            await self.close(code=refused)
            return
        self._want_snapshot()

    # -- helpers -----------------------------------------------------------------

    async def refresh_socket(self) -> None:
        """Keep this socket counted towards its user's ``WS_MAX_SOCKETS_PER_USER`` for
        another :func:`socket_ttl` seconds (every periodic check calls it).
        Logs and returns on failure (the count expires, it never blocks wrongly)."""
        if self.socket_user is None:
            return
        try:
            await get_outbox().arefresh_socket(self.socket_user, self.socket_id, ttl=socket_ttl())
        except Exception as exc:
            logger.warning("outbox: cannot refresh a socket's count: %s", redact(str(exc)))

    async def _watch(self, delta: int) -> None:
        await get_outbox().awatch(self.workspace_id, self.session_id, delta)

    async def _refuse(self, code: int) -> None:
        """Accept, then close with ``code``: the only way a code reaches the client."""
        await self.accept()
        await self.close(code=code)

    async def _retry_once(self, what: str, step: Callable[[], Awaitable[Any]]) -> Any:
        """``step()``, once more RETRY_PAUSE s later if it fails (a stale pooled connection, a
        pool a burst exhausted: MaxConnectionsError); the second failure is logged, raised."""
        try:
            return await step()
        except Exception as exc:
            logger.info("outbox: cannot %s (%s); trying once more", what, redact(str(exc)))
        await asyncio.sleep(self.RETRY_PAUSE)
        try:
            return await step()
        except Exception as exc:
            logger.warning(
                "outbox: WebSocket to %s closed with 4503: cannot %s: %s",
                self.scope.get("path"),
                what,
                redact(f"{type(exc).__name__}: {exc}"),
            )
            raise

    async def _open_socket(self) -> bool:
        """Count this socket for its user; False when the user holds too many."""
        limit = outbox_settings().config.ws_max_sockets_per_user
        user_id = socket_user_id(self.scope.get("user"))
        if not limit or user_id is None:
            return True
        self.socket_id = self.socket_id or uuid.uuid4().hex
        if not await get_outbox().aopen_socket(
            user_id, self.socket_id, limit=limit, ttl=socket_ttl()
        ):
            logger.warning(
                "outbox: WebSocket to %s closed with 4429: the user already holds %d sockets "
                "(WS_MAX_SOCKETS_PER_USER)",
                self.scope.get("path"),
                limit,
            )
            return False
        self.socket_user = user_id
        return True

    async def _count_watcher(self) -> None:
        if not self.watching:
            await self._watch(+1)
            self.watching = True

    async def _join_group(self) -> None:
        group = group_name(self.workspace_id, self.session_id)
        await self.channel_layer.group_add(group, self.channel_name)
        self.group = group

    async def _release(self) -> None:
        """Undo what :meth:`_admit` registered, each step on its own (never raises)."""
        await leave_user_group(self)
        if self.group is not None:
            group, self.group = self.group, None
            try:
                await self.channel_layer.group_discard(group, self.channel_name)
            except Exception as exc:  # the layer's group expiry drops it
                logger.warning("outbox: cannot leave a group: %s", redact(str(exc)))
        if self.watching:
            self.watching = False
            try:
                await self._watch(-1)
            except Exception as exc:  # the count expires on its own (WATCH_TTL)
                logger.warning("outbox: cannot unregister a watcher: %s", redact(str(exc)))
        if self.socket_user is not None:
            user, self.socket_user = self.socket_user, None
            try:
                await get_outbox().aclose_socket(user, self.socket_id)
            except Exception as exc:  # it expires on its own (socket_ttl())
                logger.warning("outbox: cannot uncount a socket: %s", redact(str(exc)))

    @sync_to_async
    def _allowed(self, fresh: bool) -> bool:
        """Whether the access policy lets the scope's user ``view`` this session; with
        ``fresh``, the user as the database holds it now (Django caches permissions
        on a user object, and the scope's is as old as the connection)."""
        user = self.scope.get("user")
        if fresh and isinstance(user, Model) and user.pk is not None:
            user = user.__class__._default_manager.filter(pk=user.pk).first()
        return self._may_view(user)

    def _may_view(self, user: Any) -> bool:
        """The access policy's ``view`` for ``user``; notes whether it reads ``lastError``
        excerpts (docs/explanation/security.md). Sync: the policy may query the database."""
        allowed = is_allowed(user, self.workspace_id, self.session_id, "view")
        self.error_excerpts = allowed and reads_error_excerpts(user)
        return allowed


async def receive_until_cancelled(receive: Callable[[], Awaitable[dict[str, Any]]]) -> Any:
    """``await receive()``, run in a task of its own so that a cancellation of the caller
    always ends it. channels-redis's receive loops until a message comes (a BZPOPMIN every
    few seconds) and sends each command through redis-py, which sends under
    ``asyncio.wait_for`` whenever a ``socket_timeout`` is set (redis-py 8's default is 5 s);
    on Python 3.11 that loses a cancellation arriving as the send completes, and the
    receive runs on with nothing ever to receive. Channels awaits the cancelled receive
    when a consumer stops, so the consumer ran on with it, and a server's exit waited
    for it (a refused socket's receive is cancelled right as it sends its first
    commands: a shutdown held by a lost cancellation, docs/howto/deploy.md#stopping-the-server).
    Cancelled, this cancels the task again every
    :data:`RECEIVE_CANCEL_REPEAT` seconds until it ends, for at most
    :data:`RELEASE_DEADLINE` seconds (then leaves it, logged), and re-raises."""
    task = asyncio.ensure_future(receive())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await _cancel_until_done(task)
        raise


async def _cancel_until_done(task: asyncio.Future[Any]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + RELEASE_DEADLINE
    while not task.done():
        left = deadline - loop.time()
        if left <= 0:
            logger.warning(
                "outbox: the channel layer's receive did not end %.0f s after it was "
                "cancelled; it is left to end on its own",
                RELEASE_DEADLINE,
            )
            return
        task.cancel()
        await asyncio.wait({task}, timeout=min(left, RECEIVE_CANCEL_REPEAT))
    if not task.cancelled():
        task.exception()  # a failure of a receive nobody waits for any more is no news


def socket_user_id(user: Any) -> str | None:
    """Whose socket this is, for ``WS_MAX_SOCKETS_PER_USER``: the primary key (as text)
    of an authenticated user; None (not counted) for an anonymous one or a user object
    without a primary key."""
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    pk = getattr(user, "pk", None)
    return None if pk is None else str(pk)


def socket_ttl() -> float:
    """Seconds a socket stays counted for ``WS_MAX_SOCKETS_PER_USER`` without a refresh:
    :data:`SOCKET_TTL_CHECKS` periodic checks, at least :data:`MIN_SOCKET_TTL`."""
    interval = outbox_settings().config.ws_check_interval
    return max(MIN_SOCKET_TTL, SOCKET_TTL_CHECKS * interval)
