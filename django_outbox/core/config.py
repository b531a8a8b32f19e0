"""Tunables of the outbox, their defaults and validation (no Django imports).

Durations are seconds (int or float) or ``datetime.timedelta``; they are
stored as float seconds (:func:`duration` is the rule, also used for the
opencode block's timeouts). The defaults are the table in README "Settings"
(``LOCK_TTL`` is a short, renewed lease).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from datetime import timedelta
from typing import Any, ClassVar

from .rules import min_snapshot_frame_bytes

#: The longest HISTORY_WINDOW (seconds): a month of per-minute HASHes per workspace.
MAX_HISTORY_WINDOW = 31 * 24 * 3600.0


class ConfigError(ValueError):
    """A tunable has the wrong type or value; ``key`` is its OUTBOX settings name."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"OUTBOX[{key!r}] {rule}")
        self.key = key
        self.rule = rule


def duration(key: str, value: Any, *, zero_ok: bool = False) -> float:
    """``value`` as float seconds: an int or float of seconds, or a ``timedelta``.

    It must be finite and positive (or zero, with ``zero_ok``). Raises
    :class:`ConfigError` with ``key`` (the setting's name) and the rule it breaks.
    """
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(key, "must be a number of seconds or a timedelta")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(key, "must be a finite, non-negative duration")
    if seconds == 0 and not zero_ok:
        raise ConfigError(key, "must be positive")
    return seconds


@dataclass(frozen=True, slots=True)
class Config:
    """Validated tunables. Build with :meth:`from_mapping`; attribute names are snake_case."""

    key_prefix: str = "outbox"
    max_attempts: int = 5
    cap: int = 25
    ordering: str = "strict"
    dedupe_ttl: float = 24 * 3600.0
    delivery_timeout: float = 600.0
    retry_backoff: float = 10.0
    max_backoff: float = 120.0
    lock_ttl: float = 30.0
    verify_delay: float = 3.0
    verify_backoff: float = 3.0
    max_verify_backoff: float = 120.0
    max_verify_attempts: int = 40
    max_transient_failures: int = 20
    parked_sweep_interval: float = 60.0
    max_text_bytes: int = 102_400
    concurrency: int = 64
    tick: float = 1.0
    wait_replicas: int = 0
    wait_aof: bool = False
    wait_timeout: float = 1.0
    #: On a cluster: how many shards each global index is split into. Every
    #: process of a deployment must use the same number.
    cluster_shards: int = 8
    #: Per-user bounds (README "Per-user bounds"): entries one user may have queued or in
    #: flight across the sessions of one workspace, and accepts per minute into one
    #: workspace (a burst of that many, then one every 60/n seconds). 0 turns a bound off.
    user_max_queued: int = 100
    user_accepts_per_minute: int = 30
    #: Outbox WebSockets one user may hold open at once, across server processes
    #: (README "Live updates (WebSocket)"); one more is closed with 4429. 0 turns it off.
    ws_max_sockets_per_user: int = 20
    #: Live updates (README "Live updates (WebSocket)"): seconds between a socket's
    #: checks (its position against the session's version, its access, its group).
    ws_check_interval: float = 30.0
    #: Seconds between two snapshots of one socket (resyncs inside coalesce).
    ws_resync_interval: float = 1.0
    #: Resync frames one socket may send in 60 s; one more closes it with 4429.
    ws_resync_budget: int = 30
    #: Largest snapshot frame in bytes (a snapshot is split into pages). Must hold
    #: the largest possible entry (see rules.min_snapshot_frame_bytes).
    ws_max_frame_bytes: int = 768 * 1024
    #: Seconds of per-minute history kept in Valkey for the admin dashboard (README
    #: "Dashboard"); 0 turns history off (no counter is written).
    history_window: float = 24 * 3600.0

    DURATIONS: ClassVar[set[str]] = {
        "dedupe_ttl",
        "delivery_timeout",
        "retry_backoff",
        "max_backoff",
        "lock_ttl",
        "verify_delay",
        "verify_backoff",
        "max_verify_backoff",
        "parked_sweep_interval",
        "tick",
        "wait_timeout",
        "ws_check_interval",
        "ws_resync_interval",
        "history_window",
    }
    POSITIVE_INTS: ClassVar[set[str]] = {
        "max_attempts",
        "cap",
        "max_verify_attempts",
        "max_transient_failures",
        "max_text_bytes",
        "concurrency",
        "cluster_shards",
        "ws_resync_budget",
        "ws_max_frame_bytes",
    }
    #: Integers that may be 0 (a bound turned off); None means 0 too.
    OPTIONAL_LIMITS: ClassVar[set[str]] = {
        "user_max_queued",
        "user_accepts_per_minute",
        "ws_max_sockets_per_user",
    }
    #: Durations that may be zero (everything else must be > 0).
    ZERO_OK: ClassVar[set[str]] = {
        "retry_backoff",
        "verify_delay",
        "verify_backoff",
        "history_window",
    }

    @classmethod
    def setting_name(cls, attr: str) -> str:
        return attr.upper()

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> Config:
        """Validate ``values`` (snake_case names) over the defaults.

        Raises :class:`ConfigError` naming the setting and the rule it breaks.
        Unknown names raise too, so a typo is not silently ignored.
        """
        known = {f.name for f in fields(cls)}
        out: dict[str, Any] = {}
        for name, value in values.items():
            if name not in known:
                raise ConfigError(cls.setting_name(name), "is not a known setting")
            out[name] = cls._check(name, value)
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

    @classmethod
    def _check(cls, name: str, value: Any) -> Any:
        key = cls.setting_name(name)
        if name in cls.DURATIONS:
            return duration(key, value, zero_ok=name in cls.ZERO_OK)
        if name in cls.POSITIVE_INTS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(key, "must be an integer >= 1")
            return value
        if name in cls.OPTIONAL_LIMITS:
            if value is None:
                return 0
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(key, "must be an integer >= 0 (0 or None: no bound)")
            return value
        if name == "wait_replicas":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(key, "must be an integer >= 0")
            return value
        if name == "wait_aof":
            if not isinstance(value, bool):
                raise ConfigError(key, "must be True or False")
            return value
        if name == "ordering":
            if value not in ("strict", "due"):
                raise ConfigError(key, "must be 'strict' or 'due'")
            return value
        if name == "key_prefix":
            if not isinstance(value, str) or not value or not value.isascii():
                raise ConfigError(key, "must be a non-empty ASCII string")
            if any(c in value for c in "{}: \t\r\n*?[]"):
                raise ConfigError(
                    key, "must not contain braces, colons, whitespace or glob characters"
                )
            return value
        raise AssertionError(name)  # pragma: no cover

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
