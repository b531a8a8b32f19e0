"""What the Lua scripts answer, as types: one small frozen class per reply shape.

Each script's header (``core/lua/<name>.lua``) states its reply as a Lua table; the
``parse`` of its type here is the one place that table is read by position, beside the
ARGV builders of :mod:`~django_outbox.core.scripts`. Everything above reads named
fields (``reply.version``, not ``int(answer[2])``). Entries stay raw JSON (``bytes``
or ``str``, as Valkey answered): they are parsed only when someone needs them.
A cluster's ``{reply, hint}`` wrapping is taken off before a reply reaches ``parse``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .entry import Ending, Entry, format_time

#: One stored entry, as the script answered it (JSON).
RawEntry = bytes | str


_CONTENT = ',"clientMessageID":'
_CONTENT_B = _CONTENT.encode()
_EXPIRED = '"status":"expired"'
_EXPIRED_B = _EXPIRED.encode()
_DELIVERING = '"status":"delivering"'
_DELIVERING_B = _DELIVERING.encode()


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _entries(values: Sequence[Any]) -> tuple[RawEntry, ...]:
    return tuple(values)


@dataclass(frozen=True, slots=True)
class AcceptReply:
    """``accept.lua``: ``status`` is ``ok`` (stored now), ``own`` (this very entry was
    stored before: a replay), ``duplicate``/``conflict`` (another entry holds the key:
    ``existing_id``), ``full``, ``user_full`` or ``rate_limited`` (``retry_after``
    seconds). ``version``, ``watched``, ``accepted_at`` (server time, ISO) and ``seq``
    are set for ``ok``/``own``; ``held`` is the park reason when the entry is stored
    parked (its workspace is parked: docs/explanation/lifecycle.md), else ""."""

    status: str
    version: int = 0
    watched: bool = False
    accepted_at: str = ""
    seq: int = 0
    existing_id: str = ""
    retry_after: int = 0
    held: str = ""

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> AcceptReply:
        status = _text(answer[0])
        if status == "ok":
            version = int(answer[1])
            held = _text(answer[4] or "") if len(answer) > 4 else ""
            return cls(status, version, bool(answer[2]), _text(answer[3] or ""), version, held=held)
        if status == "own":
            held = _text(answer[5] or "") if len(answer) > 5 else ""
            return cls(
                status,
                int(answer[1]),
                bool(answer[2]),
                _text(answer[4] or ""),
                int(answer[3]),
                held=held,
            )
        if status in ("duplicate", "conflict"):
            return cls(status, existing_id=_text(answer[1]))
        if status == "rate_limited":
            return cls(status, retry_after=int(answer[1]))
        return cls(status)


@dataclass(frozen=True, slots=True)
class SeedReply:
    """``seed.lua``: ``status`` ``ok`` (stored at ``version``) or ``exists``."""

    status: str
    version: int = 0
    watched: bool = False

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> SeedReply:
        status = _text(answer[0])
        if status == "ok":
            return cls(status, int(answer[1]), bool(answer[2]))
        return cls(status)


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """``lib/claim.lua`` (``claim.lua``, the claim half of ``settle_next.lua``).

    ``kind``: ``busy`` (another holder: ``pttl`` ms left), ``idle``, ``deliver``
    (``entry`` staged as delivering), ``verify`` (``entry`` awaits verification) or
    ``owed`` (``owed``: delivered entries whose ``entry_delivered`` is owed).
    ``recovered``: entries a dead holder left staged, now verifying; ``expired``: entries
    the claim found past their ``expiresAt``, now expired (docs/howto/steering.md#expiry);
    ``members``: for a merged delivery, the entries staged with ``entry`` in one agent
    message, in order (docs/howto/steering.md#merging)."""

    kind: str
    entry: RawEntry | None = None
    version: int = 0
    watched: bool = False
    recovered: tuple[RawEntry, ...] = ()
    owed: tuple[RawEntry, ...] = ()
    pttl: int = 0
    expired: tuple[RawEntry, ...] = ()
    members: tuple[RawEntry, ...] = ()

    @property
    def changed(self) -> tuple[RawEntry, ...]:
        """The entries the claim changed besides the one it hands over: recovered, expired."""
        return (*self.recovered, *self.expired)

    def delivery(self) -> tuple[Entry | None, list[Entry]]:
        """The entry handed over and the other entries of its merged message, parsed: the
        entry carries their texts as ``parts``, its own first, in accept order (one agent
        message; docs/howto/steering.md#merging). No members: the entry as stored."""
        entry = Entry.from_json(self.entry) if self.entry else None
        members = [Entry.from_json(raw) for raw in self.members]
        if entry is not None and members:
            entry = entry.evolve(parts=(entry.text, *(m.text for m in members)))
        return entry, members

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> ClaimReply:
        kind = _text(answer[0])
        if kind == "busy":
            return cls(kind, pttl=int(answer[1]))
        version, watched = int(answer[2]), bool(answer[3])
        if kind == "owed":
            return cls(kind, None, version, watched, owed=_entries(answer[4:]))
        recovered: list[RawEntry] = []
        expired: list[RawEntry] = []
        members: list[RawEntry] = []
        for raw in answer[4:]:
            binary = isinstance(raw, bytes)
            state = raw[: raw.find(_CONTENT_B if binary else _CONTENT)]
            if (_EXPIRED_B if binary else _EXPIRED) in state:
                expired.append(raw)
            elif (_DELIVERING_B if binary else _DELIVERING) in state:
                members.append(raw)
            else:
                recovered.append(raw)
        return cls(
            kind,
            answer[1] or None,
            version,
            watched,
            tuple(recovered),
            expired=tuple(expired),
            members=tuple(members),
        )


@dataclass(frozen=True, slots=True)
class SettleReply:
    """``lib/settle.lua`` (``settle.lua``, ``settle_delivered.lua``).

    ``kind``: ``removed`` (delivered: ``entry`` staged as delivered), ``updated``
    (``entry`` as it is now), ``cancelled`` (a cut entry proven absent, removed:
    ``entry`` as it was; docs/howto/cutting.md), ``replayed`` (this settle ran before
    and its reply was lost: ``replayed`` says ``removed``, ``updated`` or
    ``cancelled``), ``lost`` (the lease is not the
    holder's) or ``gone``. ``delivered`` is True when the delivery is recorded (now or
    by the replayed call). ``members``: for ``removed`` and ``updated``, the other entries
    of a merged message, which took the same outcome, as they are now
    (docs/howto/steering.md#merging)."""

    kind: str
    entry: RawEntry | None = None
    version: int = 0
    watched: bool = False
    replayed: str = ""
    members: tuple[RawEntry, ...] = ()

    @property
    def changed(self) -> tuple[RawEntry, ...]:
        """The entry as settled, then the members of its merged message."""
        return (*((self.entry,) if self.entry is not None else ()), *self.members)

    @property
    def delivered(self) -> bool:
        return self.kind == "removed" or (self.kind == "replayed" and self.replayed == "removed")

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> SettleReply:
        kind = _text(answer[0])
        if kind in ("removed", "updated", "cancelled"):
            return cls(
                kind, answer[1], int(answer[2]), bool(answer[3]), members=_entries(answer[4:])
            )
        if kind == "replayed":
            return cls(kind, replayed=_text(answer[1]))
        return cls(kind)


@dataclass(frozen=True, slots=True)
class SettleNextReply:
    """``settle_next.lua``: the settle's reply and, when it recorded the delivery, the
    claim that followed under the same lease (else ``claim`` is None)."""

    settled: SettleReply
    claim: ClaimReply | None

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> SettleNextReply:
        if _text(answer[0]) == "next":
            return cls(SettleReply.parse(answer[1]), ClaimReply.parse(answer[2]))
        return cls(SettleReply.parse(answer), None)


@dataclass(frozen=True, slots=True)
class OperatorReply:
    """The operator transitions (``retry``, ``dismiss``, ``park``, ``unpark``,
    ``unpause``, ``rearm_unverifiable``, ``ledger_complete``, ``ledger_rearm``, ``cut``) and
    ``recover.lua`` (``lib/operator.lua``): ``result`` (``updated``, ``removed``,
    ``not_found``, ``busy`` or ``ok``), the session's ``version``, ``count`` (how many
    entries; for ``unpause`` 1 when the pause ended), ``watched`` and the ``changed``
    entries (as they are now; as they were for a removal)."""

    result: str
    version: int
    count: int
    watched: bool
    changed: tuple[RawEntry, ...]

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> OperatorReply:
        return cls(
            _text(answer[0]), int(answer[1]), int(answer[2]), bool(answer[3]), _entries(answer[4:])
        )


@dataclass(frozen=True, slots=True)
class CleanupReply:
    """``cleanup.lua``: ``done`` (False: markers were added meanwhile, call again),
    keys ``removed``, and when done the session's last ``version``, ``watched`` and the
    entries that are ``gone``."""

    done: bool
    removed: int
    version: int = 0
    watched: bool = False
    gone: tuple[RawEntry, ...] = ()

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> CleanupReply:
        if _text(answer[0]) != "done":
            return cls(False, int(answer[1]))
        return cls(True, int(answer[1]), int(answer[2]), bool(answer[3]), _entries(answer[4:]))


def _ending(value: Any) -> Ending | None:
    """One item of the record of endings (``lua/lib/endings.lua``), ``"<entry-id> <how>
    <ms>"``; None for an item that is not of that shape."""
    parts = _text(value).split(" ")
    if len(parts) != 3 or not parts[2].isdigit():
        return None
    return Ending(parts[0], parts[1], format_time(int(parts[2]) * 1000))


@dataclass(frozen=True, slots=True)
class SnapshotReply:
    """``snapshot.lua``: the session's ``version``, ``queued`` and ``staged`` entries,
    the lease's value (``lock``, None without one) and ``lock_pttl`` (ms), the
    server's ``now_us``, and how recent entries ended (``endings``, newest first), all
    read at one instant."""

    version: int
    queued: tuple[RawEntry, ...]
    staged: tuple[RawEntry, ...]
    lock: str | None
    lock_pttl: int
    now_us: int
    endings: tuple[Ending, ...] = ()

    @classmethod
    def parse(cls, answer: Sequence[Any]) -> SnapshotReply:
        endings = (_ending(item) for item in (answer[6] if len(answer) > 6 else ()))
        return cls(
            int(answer[0]),
            _entries(answer[1]),
            _entries(answer[2]),
            None if not answer[3] else _text(answer[3]),
            int(answer[4]),
            int(answer[5]),
            tuple(e for e in endings if e is not None),
        )
