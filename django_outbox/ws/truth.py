"""What keeps one queue socket true: its position, its snapshot pages, its resync budget.

docs/reference/websocket.md#staying-true states the guarantees; the consumer
(:mod:`django_outbox.ws.consumer`) drives these pieces:

- :class:`SocketState`: per socket, the highest session version it was sent,
  whether its view is the empty one, when its last snapshot went out, and the
  decision to close (after which nothing more is sent);
- :func:`is_behind`: the periodic check's verdict from the version Valkey holds;
- :func:`snapshot_frames`: a snapshot split into ``queue.snapshot`` pages of at
  most ``WS_MAX_FRAME_BYTES`` each;
- :class:`ResyncBudget`: resync frames per socket per minute;
- :class:`ReadReceipts`: the bytes sent to a socket that its client has not yet
  acknowledged reading (docs/explanation/security.md#slow-readers).

Nothing here does I/O or imports Django.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

#: The window of :class:`ResyncBudget` (seconds).
BUDGET_WINDOW = 60.0
#: How long a check waits for an update already published (a version Valkey holds but
#: the socket has not sent yet) before it calls the socket behind (seconds; at most half
#: the check interval).
PUBLISH_GRACE = 1.0

_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


@dataclass
class SocketState:
    """One socket's position in its session's stream (all times from ``clock``).

    ``version``: the highest version sent (snapshot or update), None before the first
    snapshot. ``empty_view``: the last snapshot had no entries and no update followed
    (what a session without a version looks like). ``last_snapshot``: when the last
    snapshot went out (``-inf``: never). ``closing``: a close was decided; nothing
    more is sent. ``lock`` keeps a snapshot's pages and updates from interleaving.
    """

    clock: Callable[[], float] = time.monotonic
    version: int | None = None
    empty_view: bool = False
    last_snapshot: float = float("-inf")
    closing: bool = False
    snapshot_wanted: bool = False
    snapshots: int = 0
    #: The version of the last snapshot sent (None: none yet).
    snapshot_version: int | None = None
    #: Since when (``clock``) a wanted snapshot waits for the last one's acknowledgement
    #: (None: none waits).
    held_since: float | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def sent_snapshot(self, version: int, empty: bool) -> None:
        """Record a snapshot of ``version`` (its pages all sent)."""
        self.version = version
        self.snapshot_version = version
        self.empty_view = empty
        self.snapshots += 1

    def unchanged_since_snapshot(self, held: int | None) -> bool:
        """Whether a snapshot now would repeat the last one: Valkey ``held`` the version
        of the last snapshot sent and no newer update was sent since (or the session has
        no version and the socket shows it empty)."""
        if self.snapshots == 0:
            return False
        if held is None:
            return self.empty_view
        return held == self.snapshot_version == self.version

    def sent_update(self, version: int) -> None:
        """Record a relayed ``queue.update`` of ``version``."""
        self.version = version if self.version is None else max(self.version, version)
        self.empty_view = False

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """Run ``coro`` as a task this socket owns (cancelled by :meth:`cancel`)."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks = [t for t in self.tasks if not t.done()] + [task]
        return task

    def cancel(self) -> None:
        """Cancel every task of this socket (its checks, a coalesced snapshot)."""
        for task in self.tasks:
            task.cancel()
        self.tasks = []


def is_behind(state: SocketState, held: int | None, before: int | None) -> bool:
    """Whether a socket must get a fresh snapshot, given the version Valkey ``held``
    (None: the session has no version, so no entries) and the socket's version
    ``before`` the read started. Behind: Valkey is ahead of what the socket sent;
    Valkey went below what the socket had (data lost: versions never go backwards
    otherwise); or the session is gone and the socket's view is not the empty one."""
    if held is None:
        return not state.empty_view
    if state.version is None:
        return True
    return held > state.version or (before is not None and held < before)


def snapshot_frames(
    workspace_id: str,
    session_id: str,
    version: int,
    entries: Iterable[dict[str, Any]],
    max_bytes: int,
    ack: str | None = None,
    ended: Iterable[dict[str, Any]] | None = None,
) -> list[str]:
    """The ``queue.snapshot`` frames (JSON text) of one snapshot, each at most
    ``max_bytes`` UTF-8 bytes unless one entry alone is larger (it then has a page of
    its own; the settings' minimum prevents that). Every page carries ``version``,
    ``page`` (1-based) and ``pages``; entries keep their order. A snapshot that fits
    in one frame is one page, ``{"type", "workspaceID", "sessionID", "version",
    "page": 1, "pages": 1, "entries"}``. ``ack``: a token the last page carries as
    ``"ack"`` (:class:`ReadReceipts`; counted in every page's size). ``ended``: how the
    session's recent entries ended (``[{"id", "how", "at"}]``, newest first,
    docs/reference/websocket.md#how-prompts-ended), which the last page carries as
    ``"ended"`` (counted in every page's size too; None: not carried)."""
    head = (
        f'{{"type":"queue.snapshot","workspaceID":{_encode(workspace_id)},'
        f'"sessionID":{_encode(session_id)},"version":{int(version)},'
    )
    # The page numbers are not known yet: count them at their widest.
    tail = "" if ack is None else f'"ack":{_encode(ack)},'
    if ended is not None:
        tail += f'"ended":{_encode(list(ended))},'
    envelope = len(head.encode()) + len('"page":,"pages":,"entries":[]}') + 2 * 20 + len(tail)
    pages: list[list[str]] = []
    current: list[str] = []
    size = envelope
    for entry in entries:
        text = _encode(entry)
        n = len(text.encode("utf-8")) + 1  # and its comma
        if current and size + n > max_bytes:
            pages.append(current)
            current, size = [], envelope
        current.append(text)
        size += n
    pages.append(current)
    total = len(pages)
    return [
        f'{head}"page":{i},"pages":{total},{tail if i == total else ""}'
        f'"entries":[{",".join(page)}]}}'
        for i, page in enumerate(pages, start=1)
    ]


class ResyncBudget:
    """At most ``budget`` resync frames per ``BUDGET_WINDOW`` seconds (sliding)."""

    def __init__(self, budget: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.clock = clock
        self._times: deque[float] = deque(maxlen=budget + 1)

    def spend(self) -> bool:
        """Count one resync now; False when it is one too many for the window."""
        now = self.clock()
        self._times.append(now)
        return len(self._times) <= self.budget or now - self._times[0] >= BUDGET_WINDOW


#: Acknowledgement tokens a socket remembers (older ones are forgotten: acknowledging a
#: newer one covers them).
MAX_PENDING_TOKENS = 8


class ReadReceipts:
    """What a socket's client has acknowledged reading, in bytes (UTF-8 on the wire).

    ``sent``: bytes of every frame sent; ``acked``: the offset up to which the client
    acknowledged reading (echoing a token, docs/reference/websocket.md#acknowledgements);
    ``snapshot_end``: the offset just after the last snapshot's last page. Tokens are
    random (a client cannot acknowledge what it has not read) and stand for the offset
    of the end of the frame that carried them.
    """

    def __init__(self) -> None:
        self.sent = 0
        self.acked = 0
        self.snapshot_end = 0
        self.token_end = 0
        self._tokens: OrderedDict[str, int] = OrderedDict()

    @property
    def unread(self) -> int:
        """Bytes sent and not (yet) acknowledged."""
        return self.sent - self.acked

    @property
    def snapshot_unread(self) -> bool:
        """Whether the last snapshot sent may still be unread (not acknowledged)."""
        return self.acked < self.snapshot_end

    def count(self, nbytes: int) -> None:
        """Record a frame of ``nbytes`` bytes sent."""
        self.sent += nbytes

    @staticmethod
    def new_token() -> str:
        """A fresh random token (16 URL-safe characters) to put on a frame."""
        return secrets.token_urlsafe(12)

    def expect(self, token: str, end: int) -> None:
        """``token`` went out on a frame ending at offset ``end``: echoing it
        acknowledges every byte up to there."""
        self._tokens[token] = end
        self.token_end = max(self.token_end, end)
        while len(self._tokens) > MAX_PENDING_TOKENS:
            self._tokens.popitem(last=False)

    def ack(self, token: object) -> bool:
        """The client echoed ``token``: everything up to its offset was read. False for a
        token this socket did not hand out (or forgot); nothing changes then."""
        if not isinstance(token, str) or token not in self._tokens:
            return False
        end = self._tokens[token]
        self.acked = max(self.acked, end)
        for known in [t for t, at in self._tokens.items() if at <= end]:
            del self._tokens[known]
        return True
