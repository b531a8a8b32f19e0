"""Every Valkey key name, built in one place (docs/explanation/storage.md).

All keys of a workspace carry the hash tag ``{<ws>}`` so one workspace lives
in one cluster slot and every per-workspace script is legal on Valkey Cluster.
Identifiers are checked against the allow-list before they reach a key name.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass

from .rules import check_identifier

#: The indices that live outside any workspace's slot (one copy on a standalone
#: server, ``shards`` copies on a cluster), in the order of ``global_keys()``.
#: How many sessions' key sets KeySpace.session keeps (cleared, not evicted, when full).
SESSION_CACHE_SIZE = 4096
INDEX_NAMES = ("wsdue", "workspaces", "wake", "allsessions", "attention")


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session; ``KEYS`` order used by the per-session scripts."""

    queue: str  # LIST: FIFO of JSON entries
    staging: str  # LIST: entries being delivered right now
    lock: str  # STRING: delivery lease, "<token> <acquired-ms>"
    version: str  # STRING: INCR'd by every mutation
    markers: str  # ZSET: marker (see dedupe_marker) -> marker expiry (ms), for cleanup
    receipt: str  # STRING: "<token> <entry-id>" of the last completion (lost-reply replay)
    due: str  # ZSET of the workspace: session -> due time (ms)
    sessions: str  # SET of the workspace's sessions
    watch: str  # STRING: number of WebSocket clients watching (events are skipped at 0)
    attention: str  # ZSET of the workspace: session -> since (ms); kept on a cluster only
    pause: str  # STRING of the workspace: the reason it is parked (absent: not parked)
    users: str  # HASH of the workspace: user digest -> "<queued> <bucket full at>" (user bounds)
    ended: str  # LIST: "<entry-id> <how> <ms>", how recent entries ended (lua/lib/endings.lua)

    def script_keys(self) -> list[str]:
        return [
            self.queue,
            self.staging,
            self.lock,
            self.version,
            self.markers,
            self.receipt,
            self.due,
            self.sessions,
            self.watch,
            self.attention,
            self.pause,
            self.users,
            self.ended,
        ]


class KeySpace:
    """Builds key names under a prefix (``KEY_PREFIX``, default ``"outbox"``).

    ``shards`` is 0 on a standalone server: the global indices are single keys
    that the scripts keep exact. On a cluster it is ``CLUSTER_SHARDS``: each
    global index is split into that many copies, ``<prefix><index>:{s<k>}``,
    and a workspace belongs to shard ``crc32(ws) % shards`` (see
    :meth:`shard_of`). The ``{s<k>}`` hash tag puts every index of one shard in
    one slot, so the per-shard index script (``index.lua``) is legal there.
    """

    def __init__(self, prefix: str = "outbox", shards: int = 0) -> None:
        self.prefix = prefix
        self.shards = shards
        self._sessions: dict[tuple[str, str], SessionKeys] = {}
        #: ZSET workspace -> earliest due time (ms) of its sessions.
        self.workspaces_due = f"{prefix}wsdue"
        #: SET of every workspace with sessions (recover() walks it, never SCAN).
        self.workspaces = f"{prefix}workspaces"
        #: LIST of "<ws> <ses>" items: an accept pushes one so an idle worker
        #: blocked in BLMPOP wakes at once.
        self.wake = f"{prefix}wake"
        #: ZSET worker ID -> last heartbeat (ms); heartbeat values live in their own keys.
        self.workers = f"{prefix}workers"
        #: ZSET "<ws> <ses>" -> first accept (ms): every session, for paging in the admin.
        self.all_sessions = f"{prefix}allsessions"
        #: ZSET "<ws> <ses>" -> since (ms): sessions with error, parked or verifying
        #: entries, pending ones blocked behind a lease, or staging without a lease.
        self.attention = f"{prefix}attention"
        #: Prefix of worker heartbeat keys.
        self.heartbeat_prefix = f"{prefix}worker:"
        #: STRING: the claim of the project this key space belongs to (JSON, see
        #: core/owner.py; docs/howto/valkey.md#one-project-per-key-space).
        self.owner = f"{prefix}owner"

    def session(self, workspace_id: str, session_id: str) -> SessionKeys:
        """The keys of one session (cached: the hot paths ask for the same ones again).

        Raises :class:`~django_outbox.core.errors.InvalidIdentifier` for an ID that
        breaks the allow-list (checked before it is cached)."""
        if type(workspace_id) is str and type(session_id) is str:  # (unhashable input: no)
            cached = self._sessions.get((workspace_id, session_id))
            if cached is not None:
                return cached
        ws = check_identifier("workspace ID", workspace_id)
        ses = check_identifier("session ID", session_id)
        if len(self._sessions) >= SESSION_CACHE_SIZE:
            self._sessions.clear()
        keys = self._sessions[(ws, ses)] = self._build_session(ws, ses)
        return keys

    def _build_session(self, ws: str, ses: str) -> SessionKeys:
        p = self.prefix
        return SessionKeys(
            queue=f"{p}q:{{{ws}}}:{ses}",
            staging=f"{p}d:{{{ws}}}:{ses}",
            lock=f"{p}lock:{{{ws}}}:{ses}",
            version=f"{p}ver:{{{ws}}}:{ses}",
            markers=f"{p}markers:{{{ws}}}:{ses}",
            receipt=f"{p}receipt:{{{ws}}}:{ses}",
            due=self.due(ws),
            sessions=self.sessions(ws),
            watch=f"{p}watch:{{{ws}}}:{ses}",
            attention=f"{p}attn:{{{ws}}}",
            pause=self.pause(ws),
            users=self.users(ws),
            ended=f"{p}ended:{{{ws}}}:{ses}",
        )

    def dedupe(self, workspace_id: str, session_id: str, marker: str) -> str:
        """Dedupe marker key of ``marker`` (see :func:`dedupe_marker`; printable ASCII,
        checked by the caller)."""
        ws = check_identifier("workspace ID", workspace_id)
        ses = check_identifier("session ID", session_id)
        return f"{self.prefix}dedupe:{{{ws}}}:{ses}:{marker}"

    def pause(self, workspace_id: str) -> str:
        """The workspace's pause: a STRING holding the park reason while it is parked."""
        ws = check_identifier("workspace ID", workspace_id)
        return f"{self.prefix}pause:{{{ws}}}"

    def users(self, workspace_id: str) -> str:
        """The workspace's HASH user digest (:func:`user_digest`) -> ``"<n> <full-at>"``:
        ``n`` of the user's entries are queued or in flight there, and the user's accept
        bucket is full again at ``full-at`` (microseconds).
        docs/explanation/idempotency.md#per-user-bounds."""
        ws = check_identifier("workspace ID", workspace_id)
        return f"{self.prefix}users:{{{ws}}}"

    def sockets(self, user_id: str) -> str:
        """A user's ZSET socket ID -> expiry (ms, server clock): their open outbox
        WebSockets across server processes, hash-tagged by :func:`user_digest`
        (docs/reference/websocket.md)."""
        return f"{self.prefix}sockets:{{u{user_digest(user_id)}}}"

    def cut(self, workspace_id: str, session_id: str) -> str:
        """STRING ``<prefix>cut:{ws}:ses``: the ID of the entry whose turn was just cut,
        for the lease holder to notice (expires after ``LOCK_TTL``; the durable mark is
        the entry's ``interrupted``, docs/howto/cutting.md)."""
        ws = check_identifier("workspace ID", workspace_id)
        ses = check_identifier("session ID", session_id)
        return f"{self.prefix}cut:{{{ws}}}:{ses}"

    def due(self, workspace_id: str) -> str:
        ws = check_identifier("workspace ID", workspace_id)
        return f"{self.prefix}due:{{{ws}}}"

    def sessions(self, workspace_id: str) -> str:
        ws = check_identifier("workspace ID", workspace_id)
        return f"{self.prefix}sessions:{{{ws}}}"

    def global_keys(self) -> list[str]:
        """Keys outside any workspace's slot, passed to scripts on a standalone server."""
        return [self.workspaces_due, self.workspaces, self.wake, self.all_sessions, self.attention]

    # -- cluster shards of the global indices ----------------------------------------

    def shard_of(self, workspace_id: str) -> int:
        """The shard (0 .. shards-1) of a workspace; 0 on a standalone server."""
        if not self.shards:
            return 0
        return zlib.crc32(workspace_id.encode("utf-8")) % self.shards

    def shard_keys(self, shard: int) -> list[str]:
        """One shard's copies of the global indices, in ``INDEX_NAMES`` order, plus the
        attention-version HASH (session -> version of the last attention verdict)."""
        tag = f"{{s{shard}}}"
        return [f"{self.prefix}{name}:{tag}" for name in (*INDEX_NAMES, "attnver")]

    def index(self, name: str, shard: int = 0) -> str:
        """Key of global index ``name`` (one of ``INDEX_NAMES``) in ``shard``."""
        if not self.shards:
            return self.global_keys()[INDEX_NAMES.index(name)]
        return self.shard_keys(shard)[INDEX_NAMES.index(name)]

    def index_keys(self, name: str) -> list[str]:
        """Every copy of global index ``name``: one key standalone, one per shard on a cluster."""
        if not self.shards:
            return [self.index(name)]
        return [self.index(name, k) for k in range(self.shards)]

    def history(self, minute: int, workspace_id: str | None = None) -> str:
        """The per-minute history HASH of ``minute`` (epoch seconds // 60 on Valkey's
        clock): the workspace's, in its slot, or the total over every workspace when
        ``workspace_id`` is None (docs/howto/observe.md#the-dashboard; the fields are listed
        in :mod:`django_outbox.core.history`). ``lib/history.lua`` count_history builds the
        same names from the pause key."""
        if workspace_id is None:
            return f"{self.prefix}hist:{minute}"
        ws = check_identifier("workspace ID", workspace_id)
        return f"{self.prefix}hist:{{{ws}}}:{minute}"

    def history_sample(self, minute: int) -> str:
        """The claim of the one worker that samples depth for ``minute`` (a STRING)."""
        return f"{self.prefix}histsample:{minute}"

    def history_depth(self) -> str:
        """When the depth sample last walked every session: ``"<minute> <changes>"`` (a
        STRING; the changes counted in that minute's total HASH at the walk)."""
        return f"{self.prefix}histdepth"

    def heartbeat(self, worker_id: str) -> str:
        return f"{self.heartbeat_prefix}{worker_id}"

    def owed_failures(self, workspace_id: str, session_id: str) -> str:
        """HASH entry ID -> how many firings of its owed ``entry_delivered`` failed (an
        opted-in receiver raised); ``MAX_RECEIVER_ATTEMPTS`` of them hold it for staff
        (docs/reference/signals.md#a-receiver-that-keeps-failing). Expires
        ``DEDUPE_TTL`` after its last failure."""
        ws = check_identifier("workspace ID", workspace_id)
        ses = check_identifier("session ID", session_id)
        return f"{self.prefix}owedfail:{{{ws}}}:{ses}"


def dedupe_marker(user_id: str, client_message_id: str) -> str:
    """The name of an idempotency key's marker within its session:
    ``"<user digest>:<clientMessageID>"``.

    Keys are scoped to the session *and* the accepting user (docs/explanation/idempotency.md):
    two users of one session who both send key ``"1"`` send two prompts, and neither
    learns the other's entry ID. The user ID (any text up to 255 characters) enters
    as the first 24 hex digits of its SHA-256, a fixed width, so no user ID can
    alias another user's keys and the marker stays printable ASCII.
    """
    return f"{user_digest(user_id)}:{client_message_id}"


def user_digest(user_id: str) -> str:
    """A user ID as it enters key names and the per-user counts: the first 24 hex digits
    of its SHA-256 (fixed width, printable; no user ID can alias another's)."""
    return hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:24]
