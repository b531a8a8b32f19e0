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
``OPENCODE`` (the built-in opencode deliverer's block, :class:`OpencodeSettings`;
README "The built-in opencode deliverer"), and the tunables of
:class:`django_outbox.core.config.Config` in upper case (durations in seconds or
as ``timedelta``).

This module imports nothing of the outbox it configures: caches built from these
settings (the process-wide outbox, the opencode clients) forget themselves.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .core.config import Config, ConfigError, duration
from .core.redaction import redact, remember_credentials, remember_url

DEFAULT_ACCESS_POLICY = "django_outbox.policy.staff_only"
CALLABLE_KEYS = ("DELIVERER", "VERIFIER", "LEDGER_PROBE", "ACCESS_POLICY")
# OPENCODE configures the built-in opencode deliverer (django_outbox.delivery.opencode).
OWN_KEYS = {"VALKEY_URL", "CONNECTION_ALIAS", "CLUSTER", "OPENCODE", *CALLABLE_KEYS}
#: The keys of ``OUTBOX["OPENCODE"]``.
OPENCODE_KEYS = frozenset(
    {
        "BASE_URL",
        "WORKSPACE_URLS",
        "USERNAME",
        "PASSWORD",
        "CONNECT_TIMEOUT",
        "TIMEOUT",
        "VERIFY_TIMEOUT",
        "CLOCK_SKEW",
        "MAX_RESPONSE_BYTES",
    }
)
#: Default of ``OUTBOX["OPENCODE"]["MAX_RESPONSE_BYTES"]``: the most the verifier reads of
#: one answer from the agent (16 MiB).
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024


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
    #: ``OUTBOX["OPENCODE"]``, or None when the block is absent.
    opencode: OpencodeSettings | None = None

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
        remember_url(location)
        return location
    url = raw.get("VALKEY_URL") or os.environ.get("OUTBOX_VALKEY_URL") or "redis://127.0.0.1:6379/0"
    remember_url(url)
    if not isinstance(url, str) or "://" not in url:
        raise ImproperlyConfigured(
            "OUTBOX['VALKEY_URL'] must be a URL such as redis://127.0.0.1:6379/0"
        )
    return url


# --- OUTBOX["OPENCODE"] ------------------------------------------------------------------


def _opencode_name(key: str) -> str:
    return f"OUTBOX['OPENCODE'][{key!r}]"


def _http_url(name: str, value: Any) -> str:
    """``value`` without a trailing slash if it is an http(s) URL (its credentials are
    remembered for redaction), else raise naming ``name`` (credentials redacted)."""
    if isinstance(value, str):
        remember_url(value)
        try:
            parts = urlsplit(value)
        except ValueError:
            parts = None
        if parts is not None and parts.scheme in ("http", "https") and parts.netloc:
            return value.rstrip("/")
    shown = redact(value) if isinstance(value, str) else value
    raise ImproperlyConfigured(
        f"{name} must be an http(s) URL such as http://127.0.0.1:4096, got {shown!r}"
    )


def _workspace_urls(value: Any) -> Mapping[str, str] | Callable[[str], Any]:
    """A ``WORKSPACE_URLS`` dict with its URLs checked, or a callable; raises otherwise."""
    name = _opencode_name("WORKSPACE_URLS")
    if isinstance(value, Mapping):
        return {ws: _http_url(f"{name}[{ws!r}]", url) for ws, url in value.items()}
    if callable(value):
        return value
    raise ImproperlyConfigured(f"{name} must be a dict, a callable or a dotted path to one")


@dataclass(frozen=True)
class OpencodeSettings:
    """Validated ``OUTBOX["OPENCODE"]`` (README "The built-in opencode deliverer").

    ``base_url``: ``str`` without a trailing slash, or None when ``workspace_urls``
    is set. ``workspace_urls``: a dict ``{workspace_id: URL}`` (URLs checked), a
    callable ``(workspace_id) -> URL | None`` (sync or async), its dotted path
    (imported on first use, see :meth:`aurl_for`), or None. ``username`` /
    ``password``: HTTP Basic (no auth when ``password`` is None; credentials in a URL's
    userinfo are used when it is). Timeouts and ``clock_skew`` in float seconds;
    ``timeout`` defaults to ``DELIVERY_TIMEOUT``. ``max_response_bytes``: the most the
    verifier reads of one answer (README "Security").
    """

    base_url: str | None
    workspace_urls: Mapping[str, str] | Callable[[str], Any] | str | None
    username: str = "opencode"
    password: str | None = None
    connect_timeout: float = 5.0
    timeout: float = 600.0
    verify_timeout: float = 30.0
    clock_skew: float = 2.0
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES

    @cached_property
    def _workspace_lookup(self) -> Mapping[str, str] | Callable[[str], Any] | None:
        value = self.workspace_urls
        if isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"{_opencode_name('WORKSPACE_URLS')} cannot be imported: {exc}"
                ) from exc
            value = _workspace_urls(value)
        return value

    async def aurl_for(self, workspace_id: str) -> str:
        """The opencode server URL for ``workspace_id`` (no trailing slash).

        ``WORKSPACE_URLS`` first (a missing workspace or a callable's None falls back
        to ``BASE_URL``). Raises ``ImproperlyConfigured`` when there is no URL, when a
        dotted path does not import, or when the callable returns a non-http(s) URL.
        """
        lookup = self._workspace_lookup
        url: Any = None
        if isinstance(lookup, Mapping):
            url = lookup.get(workspace_id)
        elif lookup is not None:
            url = lookup(workspace_id)
            if inspect.isawaitable(url):
                url = await url
            if url is not None:
                url = _http_url(f"{_opencode_name('WORKSPACE_URLS')}({workspace_id!r})", url)
        url = url or self.base_url
        if url is None:
            raise ImproperlyConfigured(
                f"no opencode URL for workspace {workspace_id!r}: "
                f"{_opencode_name('WORKSPACE_URLS')} has none and BASE_URL is not set"
            )
        return url


def _opencode_seconds(raw: Mapping[str, Any], key: str, default: float, **rule: bool) -> float:
    try:
        return duration(key, raw.get(key, default), **rule)
    except ConfigError as exc:
        raise ImproperlyConfigured(f"{_opencode_name(key)} {exc.rule}") from exc


def _opencode(raw: Any, delivery_timeout: float) -> OpencodeSettings | None:
    """Validate ``OUTBOX["OPENCODE"]``; None when it is absent."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("OUTBOX['OPENCODE'] must be a dict")
    unknown = sorted(set(raw) - OPENCODE_KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"OUTBOX['OPENCODE'] has unknown keys {unknown}; known: {sorted(OPENCODE_KEYS)}"
        )
    base_url = raw.get("BASE_URL")
    if base_url is not None:
        base_url = _http_url(_opencode_name("BASE_URL"), base_url)
    workspace_urls = raw.get("WORKSPACE_URLS")
    if workspace_urls is not None and not isinstance(workspace_urls, str):
        workspace_urls = _workspace_urls(workspace_urls)
    if base_url is None and workspace_urls is None:
        raise ImproperlyConfigured(f"{_opencode_name('BASE_URL')} is required (or WORKSPACE_URLS)")
    username = raw.get("USERNAME", "opencode")
    if not isinstance(username, str) or not username or ":" in username:
        raise ImproperlyConfigured(
            f"{_opencode_name('USERNAME')} must be a non-empty string without ':'"
        )
    password = raw.get("PASSWORD")
    if password is not None and not isinstance(password, str):
        raise ImproperlyConfigured(f"{_opencode_name('PASSWORD')} must be a string or None")
    remember_credentials(username, password)
    max_bytes = raw.get("MAX_RESPONSE_BYTES", DEFAULT_MAX_RESPONSE_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ImproperlyConfigured(
            f"{_opencode_name('MAX_RESPONSE_BYTES')} must be an integer >= 1 (bytes), "
            f"got {max_bytes!r}"
        )
    return OpencodeSettings(
        base_url=base_url,
        workspace_urls=workspace_urls,
        username=username,
        password=password,
        connect_timeout=_opencode_seconds(raw, "CONNECT_TIMEOUT", 5.0),
        timeout=_opencode_seconds(raw, "TIMEOUT", delivery_timeout),
        verify_timeout=_opencode_seconds(raw, "VERIFY_TIMEOUT", 30.0),
        clock_skew=_opencode_seconds(raw, "CLOCK_SKEW", 2.0, zero_ok=True),
        max_response_bytes=max_bytes,
    )


# --- the whole OUTBOX dict ---------------------------------------------------------------


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
        opencode=_opencode(raw.get("OPENCODE"), config.delivery_timeout),
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
