"""Tunables of the outbox, each declared once: name, default, rule, doc (no Django imports).

A tunable is one field of :class:`Config`, ``name: type = setting(default, kind=…, doc=…)``.
Its ``OUTBOX`` key is the name in upper case; ``kind`` is the rule a given value must pass
(:data:`Kind`: it returns the value to store or raises :class:`ConfigError`); ``doc`` is one
line. The rules between two tunables close :meth:`Config.from_mapping`. The reference is
docs/reference/settings.md, whose table tests/django/test_conf.py keeps equal to these declarations.

Durations are seconds (int or float) or ``datetime.timedelta``, stored as float seconds
(:func:`duration` is the rule, also used for the opencode block's timeouts).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from .rules import min_snapshot_frame_bytes

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_T = TypeVar("_T")

#: The longest HISTORY_WINDOW (seconds): a month of per-minute HASHes per workspace.
MAX_HISTORY_WINDOW = 31 * 24 * 3600.0


class ConfigError(ValueError):
    """A tunable has the wrong type or value; ``key`` is its OUTBOX settings name."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"OUTBOX[{key!r}] {rule}")
        self.key = key
        self.rule = rule


# --- kinds: the rule of a setting --------------------------------------------------------

#: A setting's rule: ``kind(KEY, value)`` returns the value to store, or raises
#: :class:`ConfigError` naming ``KEY`` (the OUTBOX name) and the rule the value breaks.
Kind = Callable[[str, Any], Any]


def duration(key: str, value: Any, *, zero_ok: bool = False) -> float:
    """``value`` as float seconds: an int or float of seconds, or a ``timedelta``.

    It must be finite and positive (or zero, with ``zero_ok``; an int too large for a float
    is not finite). Raises
    :class:`ConfigError` with ``key`` (the setting's name) and the rule it breaks.
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(key, "must be a number of seconds or a timedelta")
    try:
        seconds = float(value)
    except OverflowError:  # an int past the float range: not a finite duration
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(key, "must be a finite, non-negative duration")
    if seconds == 0 and not zero_ok:
        raise ConfigError(key, "must be positive")
    return seconds


def integer(minimum: int, rule: str, *, none_is_zero: bool = False) -> Kind:
    """The kind of an int (never a bool) of at least ``minimum``; ``rule`` is the message.
    With ``none_is_zero``, None is taken and stored as 0."""

    def check(key: str, value: Any) -> int:
        if none_is_zero and value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(key, rule)
        return value

    return check


def one_of(*choices: str) -> Kind:
    """The kind of a value that must be one of ``choices``."""
    rule = "must be " + " or ".join(map(repr, choices))

    def check(key: str, value: Any) -> Any:
        if value not in choices:
            raise ConfigError(key, rule)
        return value

    return check


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, "must be True or False")
    return value


#: Seconds > 0 (:func:`duration`).
DURATION: Kind = duration
#: Seconds >= 0: zero means "at once" or "off", as the setting's doc says.
DURATION_OR_ZERO: Kind = partial(duration, zero_ok=True)
#: An integer >= 1.
POSITIVE_INT = integer(1, "must be an integer >= 1")
#: An integer >= 0.
COUNT = integer(0, "must be an integer >= 0")
#: A bound that 0 or None turns off (None is stored as 0).
OPTIONAL_LIMIT = integer(0, "must be an integer >= 0 (0 or None: no bound)", none_is_zero=True)
#: True or False.
FLAG: Kind = _flag


def _key_prefix(key: str, value: Any) -> str:
    """KEY_PREFIX starts every key name (``core.keys``): nothing in it may act as a
    separator, a cluster hash tag or a pattern."""
    if not isinstance(value, str) or not value or not value.isascii():
        raise ConfigError(key, "must be a non-empty ASCII string")
    if any(c in value for c in "{}: \t\r\n*?[]"):
        raise ConfigError(key, "must not contain braces, colons, whitespace or glob characters")
    return value


#: The most names or patterns ``MODELS`` may hold, and the longest one.
MAX_MODELS, MAX_MODEL_PATTERN = 1000, 512


def _models(key: str, value: Any) -> tuple[str, ...] | None:
    """MODELS: None (any valid model selector), or a list/tuple of ``"providerID/modelID"``
    names or ``fnmatch`` patterns, kept as a tuple (docs/reference/settings.md#models)."""
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) > MAX_MODELS:
        raise ConfigError(
            key, f"must be None or a list or tuple of at most {MAX_MODELS} model names"
        )
    for item in value:
        if (
            not isinstance(item, str)
            or not item.strip()
            or len(item) > MAX_MODEL_PATTERN
            or not item.isprintable()
        ):
            raise ConfigError(
                key,
                'must hold "providerID/modelID" names or patterns: non-blank printable '
                f"strings of at most {MAX_MODEL_PATTERN} characters",
            )
    return tuple(value)


# --- declaring a setting -----------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One declared setting: its default, its rule, and one line of doc.

    ``kind`` None: the value is checked together with other keys, by the function the
    declaration names (only ``django_outbox.conf`` has such keys).
    """

    default: Any
    kind: Kind | None
    doc: str


_SETTING = "django_outbox.setting"


def setting(default: _T, *, kind: Kind, doc: str) -> _T:
    """A field of a settings dataclass declared with its default, rule and doc line
    (kept as a :class:`Setting` in the field's metadata; :func:`declared` reads them)."""
    return field(default=default, metadata={_SETTING: Setting(default, kind, doc)})


def declared(cls: type[DataclassInstance]) -> dict[str, Setting]:
    """``{attribute name: Setting}`` of the fields of ``cls`` declared with :func:`setting`,
    in declaration order."""
    return {f.name: f.metadata[_SETTING] for f in fields(cls) if _SETTING in f.metadata}


def kinds(cls: type[DataclassInstance]) -> dict[str, Kind]:
    """``{attribute name: kind}`` of the fields of ``cls`` declared with :func:`setting`."""
    return {name: s.kind for name, s in declared(cls).items() if s.kind is not None}


# --- the tunables ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Config:
    """Validated tunables. Build with :meth:`from_mapping`; attribute names are snake_case."""

    key_prefix: str = setting(
        "outbox", kind=_key_prefix, doc="the first part of every Valkey key name of the outbox"
    )
    max_attempts: int = setting(
        5, kind=POSITIVE_INT, doc="failed deliveries before an entry ends in error"
    )
    cap: int = setting(25, kind=POSITIVE_INT, doc="entries per session (queued + in flight)")
    ordering: str = setting(
        "strict",
        kind=one_of("strict", "due"),
        doc="'strict': nothing overtakes an entry backing off; 'due': a later due entry may",
    )
    dedupe_ttl: float = setting(
        24 * 3600.0, kind=DURATION, doc="how long a dedupe marker outlives its accept"
    )
    delivery_timeout: float = setting(
        600.0, kind=DURATION, doc="one deliverer call; a timeout is ambiguous"
    )
    retry_backoff: float = setting(
        10.0,
        kind=DURATION_OR_ZERO,
        doc="the wait after a failed attempt, doubling up to MAX_BACKOFF",
    )
    max_backoff: float = setting(120.0, kind=DURATION, doc="the longest wait between attempts")
    lock_ttl: float = setting(
        30.0, kind=DURATION, doc="the session lease, renewed every LOCK_TTL / 3"
    )
    verify_delay: float = setting(
        3.0, kind=DURATION_OR_ZERO, doc="the wait before the first verification"
    )
    verify_backoff: float = setting(
        3.0,
        kind=DURATION_OR_ZERO,
        doc="the wait after an inconclusive check, doubling up to MAX_VERIFY_BACKOFF",
    )
    max_verify_backoff: float = setting(
        120.0, kind=DURATION, doc="the longest wait between verifications"
    )
    max_verify_attempts: int = setting(
        40, kind=POSITIVE_INT, doc="inconclusive verifications before error / unverifiable"
    )
    max_transient_failures: int = setting(
        20,
        kind=POSITIVE_INT,
        doc="transient failures in an entry's life before error / transient_exhausted",
    )
    hold_max: float = setting(
        300.0,
        kind=DURATION,
        doc="the longest an agent's Retry-After holds a session (longer ones are cut)",
    )
    hold_floor: float = setting(
        1.0,
        kind=DURATION,
        doc="the shortest hold, doubling with each hold in a row up to HOLD_MAX, whatever "
        "the agent's Retry-After says (0, a past date, garbage)",
    )
    hold_max_total: float = setting(
        3600.0,
        kind=DURATION,
        doc="how long holds in a row may last before error / hold_exhausted",
    )
    max_holds: int = setting(
        100,
        kind=POSITIVE_INT,
        doc="deprecated, no longer read: holds end by time held (HOLD_MAX_TOTAL)",
    )
    parked_sweep_interval: float = setting(
        60.0, kind=DURATION, doc="how often a worker asks the LEDGER_PROBE about error entries"
    )
    max_text_bytes: int = setting(
        102_400, kind=POSITIVE_INT, doc="the longest prompt text, in UTF-8 bytes"
    )
    concurrency: int = setting(64, kind=POSITIVE_INT, doc="sessions one worker delivers at once")
    tick: float = setting(1.0, kind=DURATION, doc="how often a worker scans for due entries")
    wait_replicas: int = setting(
        0, kind=COUNT, doc="replicas that must acknowledge a write before it is answered"
    )
    wait_aof: bool = setting(
        False, kind=FLAG, doc="answer a write only once the local AOF has it (WAITAOF)"
    )
    wait_timeout: float = setting(
        1.0,
        kind=DURATION,
        doc="the longest WAIT_REPLICAS / WAIT_AOF wait; then 503, the entry kept",
    )
    cluster_shards: int = setting(
        8, kind=POSITIVE_INT, doc="on a cluster, copies of each global index; same everywhere"
    )
    user_max_queued: int = setting(
        100,
        kind=OPTIONAL_LIMIT,
        doc="one user's entries queued or in flight in a workspace; 0/None: off",
    )
    user_accepts_per_minute: int = setting(
        30,
        kind=OPTIONAL_LIMIT,
        doc="one user's accepts into a workspace per minute (a burst); 0/None: off",
    )
    ws_max_sockets_per_user: int = setting(
        20,
        kind=OPTIONAL_LIMIT,
        doc="one user's open outbox WebSockets (one more: 4429); 0/None: off",
    )
    ws_check_interval: float = setting(
        30.0, kind=DURATION, doc="how often a socket re-authorises and checks its version"
    )
    ws_resync_interval: float = setting(
        1.0, kind=DURATION, doc="at most one snapshot per socket per interval"
    )
    ws_resync_budget: int = setting(
        30, kind=POSITIVE_INT, doc="resync frames a socket may send in 60 s; one more: 4429"
    )
    ws_max_frame_bytes: int = setting(
        768 * 1024, kind=POSITIVE_INT, doc="the largest snapshot frame (snapshots come in pages)"
    )
    history_window: float = setting(
        24 * 3600.0,
        kind=DURATION_OR_ZERO,
        doc="seconds of per-minute history for the dashboard; 0: none",
    )
    max_receiver_attempts: int = setting(
        5,
        kind=POSITIVE_INT,
        doc="failed firings of an owed entry_delivered before it waits for staff",
    )
    models: tuple[str, ...] | None = setting(
        None,
        kind=_models,
        doc="model selectors accept takes ('providerID/modelID' names or patterns); None: any",
    )

    @classmethod
    def setting_name(cls, attr: str) -> str:
        return attr.upper()

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Config:
        """Validate ``values`` (snake_case names) over the defaults.

        Raises :class:`ConfigError` naming the setting and the rule it breaks.
        Unknown names raise too, so a typo is not silently ignored.
        """
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name not in _KINDS:
                raise ConfigError(cls.setting_name(name), "is not a known setting")
            out[name] = _KINDS[name](cls.setting_name(name), value)
        config = cls(**out)
        if config.max_backoff < config.retry_backoff:
            raise ConfigError("MAX_BACKOFF", "must be at least RETRY_BACKOFF")
        if config.max_verify_backoff < config.verify_backoff:
            raise ConfigError("MAX_VERIFY_BACKOFF", "must be at least VERIFY_BACKOFF")
        if config.history_window > MAX_HISTORY_WINDOW:
            raise ConfigError("HISTORY_WINDOW", "must be at most 31 days (2,678,400 seconds)")
        smallest = min_snapshot_frame_bytes(config.max_text_bytes)
        if config.ws_max_frame_bytes < smallest:
            raise ConfigError(
                "WS_MAX_FRAME_BYTES",
                f"must be at least {smallest} bytes, so that one entry of MAX_TEXT_BYTES "
                f"({config.max_text_bytes}) always fits in a snapshot frame",
            )
        return config

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: ``{attribute: kind}`` of every tunable (a field declared without :func:`setting` would be
#: unknown to :meth:`Config.from_mapping`; a test says there is none).
_KINDS = kinds(Config)
