"""The ``OUTBOX`` settings dict: defaults, validation, one immutable object read late.

``outbox_settings()`` returns the validated :class:`OutboxSettings`, built on
first use and rebuilt when ``settings.OUTBOX`` or ``CACHES`` changes
(``override_settings`` works; :func:`reset` forgets it by hand). A wrong type or
value raises ``ImproperlyConfigured`` naming the key and the rule. Keys
(README "Settings"):

``VALKEY_URL`` (default ``redis://127.0.0.1:6379/0``, or the environment's
``OUTBOX_VALKEY_URL``), ``CONNECTION_ALIAS`` (use the LOCATION of that
django-redis cache instead), ``CLUSTER``, ``KEY_PREFIX``, ``DELIVERER``,
``VERIFIER``, ``LEDGER_PROBE``, ``ACCESS_POLICY`` (callables or dotted paths),
and the tunables of :class:`django_outbox.core.config.Config` in upper case
(durations in seconds or as ``timedelta``).

This module imports nothing of the outbox it configures: caches built from these
settings (the process-wide outbox, the opencode clients) forget themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .core.config import Config, ConfigError

DEFAULT_ACCESS_POLICY = "django_outbox.policy.staff_only"
CALLABLE_KEYS = ("DELIVERER", "VERIFIER", "LEDGER_PROBE", "ACCESS_POLICY")
# OPENCODE configures the built-in opencode deliverer (django_outbox.delivery.opencode).
OWN_KEYS = {"VALKEY_URL", "CONNECTION_ALIAS", "CLUSTER", "OPENCODE", *CALLABLE_KEYS}


@dataclass(frozen=True)
class OutboxSettings:
    """Validated ``OUTBOX`` settings. Callables are resolved lazily by :meth:`resolve`."""

    valkey_url: str
    cluster: bool
    deliverer: Any
    verifier: Any
    ledger_probe: Any
    access_policy: Any
    config: Config

    def resolve(self, key: str) -> Callable[..., Any] | None:
        """Import and return the callable configured for ``key`` (e.g. ``"DELIVERER"``).

        Raises ``ImproperlyConfigured`` if the dotted path does not import or the
        object is not callable.
        """
        value = getattr(self, key.lower())
        if value is None:
            return None
        if isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ImproperlyConfigured(f"OUTBOX[{key!r}] cannot be imported: {exc}") from exc
        if not callable(value):
            raise ImproperlyConfigured(f"OUTBOX[{key!r}] must be callable, got {value!r}")
        return value


def _valkey_url(raw: dict[str, Any]) -> str:
    alias = raw.get("CONNECTION_ALIAS")
    if alias is not None:
        caches = getattr(settings, "CACHES", {})
        if alias not in caches:
            raise ImproperlyConfigured(
                f"OUTBOX['CONNECTION_ALIAS'] names cache {alias!r}, which is not in CACHES"
            )
        location = caches[alias].get("LOCATION")
        if isinstance(location, list | tuple):
            location = location[0] if location else None
        if not isinstance(location, str) or not location:
            raise ImproperlyConfigured(
                f"OUTBOX['CONNECTION_ALIAS']: CACHES[{alias!r}] has no LOCATION URL"
            )
        return location
    url = raw.get("VALKEY_URL") or os.environ.get("OUTBOX_VALKEY_URL") or "redis://127.0.0.1:6379/0"
    if not isinstance(url, str) or "://" not in url:
        raise ImproperlyConfigured(
            "OUTBOX['VALKEY_URL'] must be a URL such as redis://127.0.0.1:6379/0"
        )
    return url


def _build() -> OutboxSettings:
    raw = getattr(settings, "OUTBOX", {}) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("settings.OUTBOX must be a dict")
    tunables = {k.lower(): v for k, v in raw.items() if k not in OWN_KEYS}
    try:
        config = Config.from_mapping(tunables)
    except ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    cluster = raw.get("CLUSTER", False)
    if not isinstance(cluster, bool):
        raise ImproperlyConfigured("OUTBOX['CLUSTER'] must be True or False")
    for key in CALLABLE_KEYS:
        value = raw.get(key)
        if value is not None and not isinstance(value, str) and not callable(value):
            raise ImproperlyConfigured(
                f"OUTBOX[{key!r}] must be a callable or a dotted path to one"
            )
    return OutboxSettings(
        valkey_url=_valkey_url(raw),
        cluster=cluster,
        deliverer=raw.get("DELIVERER"),
        verifier=raw.get("VERIFIER"),
        ledger_probe=raw.get("LEDGER_PROBE"),
        access_policy=raw.get("ACCESS_POLICY", DEFAULT_ACCESS_POLICY),
        config=config,
    )


_cached: OutboxSettings | None = None


def outbox_settings() -> OutboxSettings:
    """The validated ``OUTBOX`` settings (built once, rebuilt after a change).

    Raises ``ImproperlyConfigured`` naming the first wrong key and its rule.
    """
    global _cached
    if _cached is None:
        _cached = _build()
    return _cached


def reset() -> None:
    """Forget the validated settings; the next :func:`outbox_settings` reads them again.

    Django's ``setting_changed`` does this for ``OUTBOX`` and ``CACHES``; call it
    after changing what they read some other way (e.g. ``OUTBOX_VALKEY_URL``). It
    does not touch the process-wide outbox (``django_outbox.outbox.reset_outbox``).
    """
    global _cached
    _cached = None


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in ("OUTBOX", "CACHES"):
        reset()
