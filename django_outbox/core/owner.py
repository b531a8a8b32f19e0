"""One project per key space: the claim on a ``KEY_PREFIX`` in one Valkey database
(docs/howto/valkey.md#one-project-per-key-space).

Two projects pointed at the same prefix in the same database would deliver each other's
prompts and clean up each other's workspaces. So a project claims its key space: it
writes a :class:`Claim` (JSON) to the owner key (``KeySpace.owner``, ``<prefix>owner``):
its opaque identity, and for the operators of other projects a label, the host and the
time on Valkey's clock. The core does not know where the identity comes from: the Django
layer derives it from ``SECRET_KEY`` (``django_outbox.outbox.key_space_owner``) and passes
a :class:`KeySpaceOwner` as ``Outbox(key_space_owner=...)``. An outbox built without one
claims nothing and is refused nothing.

When the claim is made and checked (:class:`OwnedKeySpace`):

- a worker's start claims the space (or confirms the claim) before it recovers or
  delivers anything, and a running worker confirms it again every
  :data:`CLAIM_RECHECK` seconds: finding another project's claim there, it stops at
  once (``Worker``, :class:`~django_outbox.core.errors.KeySpaceTakenOver`);
- ``cleanup_workspace`` confirms it every time (claiming an unclaimed space);
- ``accept`` claims it on the process's first accept, then confirms it again when its
  last confirmation is :data:`CLAIM_RECHECK` seconds old or more (one GET at most that
  often per process), so a web process refuses accepts within about that long of
  another project's ``claim --force``;
- ``claim_key_space(force=True)`` takes the space over; ``release_key_space`` gives it up.
  Reads never write a claim (the system check only reads).

A space claimed by another identity raises :class:`KeySpaceClaimed`. A claim made with
one of the owner's ``former`` identities (a ``SECRET_KEY`` being rotated) is the owner's
own and is renewed with the current identity. A claim Valkey refuses to write (out of
memory, a read-only replica) is not needed to go on, since nobody else holds the space,
and the next operation tries again: a full Valkey must still drain.
"""

from __future__ import annotations

import enum
import json
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.exceptions import RedisClusterException

from .base import OutboxBase
from .entry import format_time
from .errors import KeySpaceClaimed, OutboxUnavailable
from .keys import KeySpace
from .plans import Cmd, Plan, iter_once
from .redaction import redact
from .transport import as_text

logger = logging.getLogger("django_outbox")

#: Seconds the system check's read of the claim waits for Valkey.
PROBE_TIMEOUT = 1.0
#: Seconds a process trusts the claim it last confirmed: an accept reads the owner key
#: again (one GET) once its last confirmation is this old, and a running worker reads it
#: this often. Another project's ``outbox claim --force`` is therefore seen within about
#: this long (docs/howto/valkey.md#taking-a-key-space-over): one GET per process every
#: two seconds at most, against the five-second bound the takeover promises.
CLAIM_RECHECK = 2.0


@dataclass(frozen=True, slots=True)
class KeySpaceOwner:
    """This project as the owner of its key space: ``id`` its identity (an opaque
    string: equal identities are one project), ``former`` identities it had (a claim
    made with one is still its own and is renewed with ``id``), ``label`` how other
    projects' operators are told who holds the space (shown, never compared)."""

    id: str
    former: tuple[str, ...] = ()
    label: str = ""

    def owns(self, claim: Claim) -> bool:
        """Whether ``claim`` was made by this project (under its current or a former
        identity)."""
        return claim.id == self.id or claim.id in self.former


@dataclass(frozen=True, slots=True)
class Claim:
    """What the owner key holds: the claimant's ``id``, ``label`` and ``host``, and
    ``claimed_at`` (RFC 3339 on Valkey's clock; "" when unknown)."""

    id: str
    label: str = ""
    host: str = ""
    claimed_at: str = ""

    def to_json(self) -> str:
        return json.dumps(
            {"id": self.id, "label": self.label, "host": self.host, "claimedAt": self.claimed_at},
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, raw: Any) -> Claim | None:
        """The claim stored as ``raw`` (a GET's answer); None for no claim. A value this
        module did not write is a claim by nobody this project can be."""
        if raw is None:
            return None
        text = as_text(raw)
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            return cls(id=f"unreadable:{text}")
        return cls(
            id=data["id"],
            label=str(data.get("label") or ""),
            host=str(data.get("host") or ""),
            claimed_at=str(data.get("claimedAt") or ""),
        )

    def describe(self) -> str:
        """Who holds the space, for messages: ``"'mysite.settings' on host web-1,
        claimed 2026-01-01T12:00:00.000000Z"``."""
        if self.id.startswith("unreadable:"):
            return "a value django-outbox did not write"
        parts = [repr(self.label) if self.label else "unnamed"]
        if self.host:
            parts.append(f"on host {self.host}")
        text = " ".join(parts)
        return f"{text}, claimed {self.claimed_at}" if self.claimed_at else text


class ClaimResult(enum.StrEnum):
    """What :meth:`OwnedKeySpace.claim_key_space` did."""

    #: The space was unclaimed: it is this project's now.
    CLAIMED = "claimed"
    #: The space was already this project's.
    OWNED = "owned"
    #: It was this project's under a former identity: the claim now names the current one.
    RENEWED = "renewed"
    #: ``force``: it was another project's and is this project's now.
    TAKEN_OVER = "taken_over"
    #: Unclaimed, and Valkey refused to store the claim (out of memory, read-only): the
    #: operation goes on and the next one tries again.
    UNWRITTEN = "unwritten"


def _claim_time(reply: Any) -> str:
    seconds, micros = (int(part) for part in reply)
    return format_time(seconds * 1_000_000 + micros)


class OwnedKeySpace(OutboxBase):
    """The key space's claim, a floor of :class:`~django_outbox.core.service.Outbox`
    (see the module docstring). ``key_space_owner`` (keyword-only) is this project's
    :class:`KeySpaceOwner`, or None: claim nothing, refuse nothing."""

    def __init__(
        self, *args: Any, key_space_owner: KeySpaceOwner | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.key_space_owner = key_space_owner
        #: Seconds between confirmations of the claim (:data:`CLAIM_RECHECK`): an accept's
        #: and a running worker's. A test may set its own.
        self.claim_recheck: float = CLAIM_RECHECK
        #: The clock of :attr:`claim_recheck` (monotonic seconds); a test may set its own.
        self.claim_clock: Callable[[], float] = time.monotonic
        #: When (:attr:`claim_clock`) this process last saw the space claimed by its owner;
        #: None: not yet, or another project holds it (an accept asks first then).
        self._key_space_confirmed_at: float | None = None

    def _key_space_due(self) -> bool:
        """Whether an accept must confirm the claim first: never confirmed, or last
        confirmed :attr:`claim_recheck` seconds ago or more."""
        confirmed = self._key_space_confirmed_at
        return confirmed is None or self.claim_clock() - confirmed >= self.claim_recheck

    def _key_space_confirmed(self, confirmed: bool) -> None:
        self._key_space_confirmed_at = self.claim_clock() if confirmed else None

    def _key_space_plan(self, force: bool = False) -> Plan[ClaimResult | None]:
        owner = self.key_space_owner
        if owner is None:
            return None
        key = self.keys.owner
        held = Claim.parse((yield Cmd(("GET", key))))
        if held is not None and not force:
            if held.id == owner.id:
                self._key_space_confirmed(True)
                return ClaimResult.OWNED
            if not owner.owns(held):
                self._key_space_confirmed(False)
                raise KeySpaceClaimed(self.keys.prefix, held.describe())
        now = _claim_time((yield Cmd(("TIME",))))
        claim = Claim(owner.id, owner.label, socket.gethostname(), now).to_json()
        only_if_unclaimed = ("NX",) if held is None and not force else ()
        try:
            written = yield Cmd(("SET", key, claim, *only_if_unclaimed))
        except OutboxUnavailable as exc:
            if force:
                raise
            logger.warning(
                "outbox: the claim on key space %r was not written (%s); going on, and the "
                "next operation tries again",
                self.keys.prefix,
                exc,
            )
            return ClaimResult.UNWRITTEN
        if not written:
            # Claimed meanwhile (NX wrote nothing): by this project, or refused.
            held = Claim.parse((yield Cmd(("GET", key))))
            if held is not None and not owner.owns(held):
                self._key_space_confirmed(False)
                raise KeySpaceClaimed(self.keys.prefix, held.describe())
            self._key_space_confirmed(held is not None)
            return ClaimResult.OWNED
        self._key_space_confirmed(True)
        if held is None:
            return ClaimResult.CLAIMED
        if held.id == owner.id:
            return ClaimResult.OWNED
        return ClaimResult.RENEWED if owner.owns(held) else ClaimResult.TAKEN_OVER

    def key_space_claim(self) -> Claim | None:
        """Who the key space belongs to now: the stored :class:`Claim`, or None when it is
        unclaimed. Writes nothing. Raises :class:`OutboxUnavailable`."""
        return Claim.parse(self._run(iter_once(Cmd(("GET", self.keys.owner)))))

    def claim_key_space(self, *, force: bool = False) -> ClaimResult | None:
        """Claim the key space for this outbox's :class:`KeySpaceOwner` and say what that
        did (:class:`ClaimResult`); None when the outbox has no owner (nothing to claim
        with). ``force`` takes over a space another project holds: that project's running
        workers stop and its web processes refuse accepts within about
        :data:`CLAIM_RECHECK` seconds (docs/howto/valkey.md#taking-a-key-space-over).

        Raises :class:`KeySpaceClaimed` when another project holds the space (without
        ``force``) and :class:`OutboxUnavailable`.
        """
        return self._run(self._key_space_plan(force))

    async def aclaim_key_space(self, *, force: bool = False) -> ClaimResult | None:
        """Async :meth:`claim_key_space` (a worker's start calls it, and its key space
        watch every :attr:`claim_recheck` seconds while it runs)."""
        return await self._arun(self._key_space_plan(force))

    def release_key_space(self) -> bool:
        """Give the key space up: delete the claim if this project made it (under its
        current or a former identity). True if a claim was deleted, False if there was
        none (or the outbox has no owner). Queued prompts stay; the next accept, cleanup
        or worker start of any project claims the space again.

        Raises :class:`KeySpaceClaimed` when another project holds it, and
        :class:`OutboxUnavailable`.
        """
        owner = self.key_space_owner
        held = self.key_space_claim()
        if owner is None or held is None:
            return False
        if not owner.owns(held):
            raise KeySpaceClaimed(self.keys.prefix, held.describe())
        self._key_space_confirmed(False)
        return bool(self._run(iter_once(Cmd(("DEL", self.keys.owner)))))


def read_claim(
    url: str, prefix: str, *, cluster: bool = False, timeout: float = PROBE_TIMEOUT
) -> Claim | None:
    """:meth:`OwnedKeySpace.key_space_claim` of the key space ``prefix`` at ``url``,
    through a client of its own that waits at most ``timeout`` seconds and is closed
    afterwards (for the system checks, which build no ``Outbox``). Writes nothing.

    Raises :class:`OutboxUnavailable` (its message is the client's) when it cannot be read.
    """
    options = {"socket_connect_timeout": timeout, "socket_timeout": timeout}
    key = KeySpace(prefix).owner
    try:
        if cluster:
            from redis.cluster import RedisCluster

            client: Any = RedisCluster.from_url(url, **options)
        else:
            client = redis.Redis.from_url(url, **options)
        try:
            return Claim.parse(client.get(key))
        finally:
            nodes = client.get_nodes() if cluster else []
            client.close()
            for node in nodes:  # a cluster client's close() leaves its nodes' pools open
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
    except (redis.ConnectionError, redis.TimeoutError, RedisClusterException) as exc:
        raise OutboxUnavailable(redact(str(exc))) from exc
