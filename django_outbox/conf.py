"""The ``OUTBOX`` settings dict: defaults, validation, one immutable object read late.

``outbox_settings()`` returns the validated :class:`OutboxSettings`, built on
first use and rebuilt when ``settings.OUTBOX`` or ``CACHES`` changes
(``override_settings`` works; :func:`reset` forgets it by hand). A wrong type or
value raises ``ImproperlyConfigured`` naming the key and the rule.

Each key is declared once, with its default, rule and doc line: the tunables are the
fields of :class:`django_outbox.core.config.Config` in upper case, the keys only Django
reads are :data:`OWN_SETTINGS`, and the keys of the ``OPENCODE`` block are the fields of
:class:`OpencodeSettings`. docs/reference/settings.md is the reference (a test keeps its
tables equal to these declarations).

This module imports nothing of the outbox it configures: caches built from these
settings (the process-wide outbox, the opencode clients) forget themselves.
"""

from __future__ import annotations

import inspect
import os
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .core.agents import DEFAULT_AGENT, Agent
from .core.config import (
    DURATION,
    DURATION_OR_ZERO,
    FLAG,
    OPTIONAL_LIMIT,
    Config,
    ConfigError,
    Setting,
    declared,
    kinds,
    setting,
)
from .core.redaction import redact, remember_credentials, remember_secret, remember_url

DEFAULT_ACCESS_POLICY = "django_outbox.policy.staff_only"


def _callable_or_path(key: str, value: Any) -> Any:
    """A callable, or its dotted path (imported on first use, :meth:`OutboxSettings.resolve`)."""
    if value is not None and not isinstance(value, str) and not callable(value):
        raise ConfigError(key, "must be a callable or a dotted path to one")
    return value


#: The ``OUTBOX`` keys besides the tunables (:class:`Config`'s fields), checked in this
#: order after them. A key without a kind is checked with the keys it depends on:
#: ``VALKEY_URL`` and ``CONNECTION_ALIAS`` by :func:`_valkey_url`, ``OPENCODE`` by
#: :func:`_opencode` (its keys are :class:`OpencodeSettings`' fields).
OWN_SETTINGS: dict[str, Setting] = {
    "CLUSTER": Setting(False, kind=FLAG, doc="Valkey Cluster: VALKEY_URL names any node"),
    "DELIVERER": Setting(None, kind=_callable_or_path, doc="sends one entry to the agent"),
    "VERIFIER": Setting(
        None, kind=_callable_or_path, doc="asks the agent whether an unsure delivery arrived"
    ),
    "LEDGER_PROBE": Setting(
        None, kind=_callable_or_path, doc="asks the agent's ledger how far an error entry got"
    ),
    "ABORTER": Setting(
        None, kind=_callable_or_path, doc="ends the agent's running turn (cutting a turn)"
    ),
    "ACCESS_POLICY": Setting(
        DEFAULT_ACCESS_POLICY, kind=_callable_or_path, doc="who may use which workspace"
    ),
    "CONNECTION_ALIAS": Setting(
        None,
        kind=None,
        doc="a Redis cache (Django's or django-redis) whose LOCATION is the URL (wins)",
    ),
    "VALKEY_URL": Setting(
        "redis://127.0.0.1:6379/0",
        kind=None,
        doc="the server's URL; when unset, the environment's OUTBOX_VALKEY_URL, then this",
    ),
    "OPENCODE": Setting(None, kind=None, doc="the built-in opencode deliverer's block"),
    "AGENTS": Setting(
        None, kind=None, doc="named agents: {name: {DELIVERER, VERIFIER, ABORTER, settings}}"
    ),
    "ROUTER": Setting(
        None, kind=_callable_or_path, doc="(workspace_id, session_id) -> the agent's name"
    ),
    "LANGGRAPH": Setting(None, kind=None, doc="the built-in LangGraph backend's block"),
    "USER_ACCEPTS_PER_MINUTE_ALL": Setting(
        60,
        kind=OPTIONAL_LIMIT,
        doc="one user's REST accepts per minute over every workspace (a DRF throttle); 0/None: off",
    ),
}
OWN_KEYS = frozenset(OWN_SETTINGS)
#: The keys that name a callable (``OUTBOX[key]`` is resolved by :meth:`OutboxSettings.resolve`).
CALLABLE_KEYS = tuple(k for k, s in OWN_SETTINGS.items() if s.kind is _callable_or_path)
#: The keys of an ``OUTBOX["AGENTS"]`` entry that name its callables; its other keys are
#: the agent's own settings (:attr:`AgentSettings.options`).
AGENT_CALLABLE_KEYS = ("DELIVERER", "VERIFIER", "ABORTER")
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
    #: ``OUTBOX["AGENTS"]``, checked for shape (its callables are imported by
    #: :meth:`resolve_agents`); empty when absent.
    agents: Mapping[str, AgentSettings] = field(default_factory=dict)
    #: ``OUTBOX["ROUTER"]``: a callable or its dotted path, or None.
    router: Any = None
    #: ``OUTBOX["LANGGRAPH"]``, or None when the block is absent.
    langgraph: LangGraphSettings | None = None
    #: ``OUTBOX["USER_ACCEPTS_PER_MINUTE_ALL"]`` (0: off): django_outbox.api.throttling.
    user_accepts_per_minute_all: int = 60
    #: ``OUTBOX["ABORTER"]``: ``abort(entry, *, workspace_id, session_id)`` or its dotted
    #: path, or None (docs/howto/cutting.md).
    aborter: Any = None

    def resolve(self, key: str) -> Callable[..., Any] | None:
        """Import and return the callable configured for ``key`` (e.g. ``"DELIVERER"``).

        Raises ``ImproperlyConfigured`` if the dotted path does not import or the
        object is not callable.
        """
        return _import_callable(f"OUTBOX[{key!r}]", getattr(self, key.lower()))

    def resolve_agents(self) -> dict[str, Agent]:
        """The ``AGENTS`` entries as :class:`~django_outbox.core.agents.Agent` objects, their
        callables imported (docs/howto/agents.md). A callable that carries
        ``validate_agent_options(name, options)`` (the HTTP agent's do) checks the
        entry's own settings. Raises ``ImproperlyConfigured`` naming the entry and key:
        a path that does not import, an object that is not callable, settings its
        deliverer refuses."""
        return {name: agent.resolve() for name, agent in self.agents.items()}

    def resolve_router(self) -> Callable[[str, str], Any] | None:
        """The ``ROUTER`` callable, or None. Raises ``ImproperlyConfigured`` when it does not
        import, is not callable or is an ``async def`` (the worker calls it without
        awaiting, once per delivery step: docs/howto/agents.md#routing)."""
        router = self.resolve("ROUTER")
        if router is not None and (
            inspect.iscoroutinefunction(router)
            or inspect.iscoroutinefunction(getattr(router, "__call__", None))  # noqa: B004
        ):
            raise ImproperlyConfigured(
                "OUTBOX['ROUTER'] is an async function; it must be a plain, quick function "
                "(workspace_id, session_id) -> agent name"
            )
        return router


def _import_callable(name: str, value: Any) -> Callable[..., Any] | None:
    """``value`` imported if it is a dotted path; None stays None. Raises
    ``ImproperlyConfigured`` naming ``name`` when it does not import or is not callable."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{name} cannot be imported: {exc}") from exc
    if not callable(value):
        raise ImproperlyConfigured(f"{name} must be callable, got {value!r}")
    return value


@dataclass(frozen=True)
class AgentSettings:
    """One validated ``OUTBOX["AGENTS"]`` entry: ``name``, its ``deliverer`` (required),
    ``verifier`` and ``aborter`` (callables or dotted paths, or None) and ``options``
    (its other keys, as given). docs/howto/agents.md."""

    name: str
    deliverer: Any
    verifier: Any = None
    aborter: Any = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def key(self, key: str) -> str:
        """How a key of this entry is named in messages: ``OUTBOX['AGENTS']['x']['KEY']``."""
        return f"OUTBOX['AGENTS'][{self.name!r}][{key!r}]"

    def resolve(self) -> Agent:
        """This entry as an :class:`~django_outbox.core.agents.Agent` (see
        :meth:`OutboxSettings.resolve_agents`)."""
        deliverer = _import_callable(self.key("DELIVERER"), self.deliverer)
        verifier = _import_callable(self.key("VERIFIER"), self.verifier)
        aborter = _import_callable(self.key("ABORTER"), self.aborter)
        for fn in (deliverer, verifier, aborter):
            validate = getattr(fn, "validate_agent_options", None)
            if callable(validate):
                validate(self.name, self.options)
        return Agent(self.name, deliverer, verifier, aborter, MappingProxyType(dict(self.options)))


#: An agent's name: it is a metrics label and a settings key.
AGENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _agents(raw: Any, has_deliverer: bool, has_router: bool) -> dict[str, AgentSettings]:
    """Validate the shape of ``OUTBOX["AGENTS"]`` (``{}`` when absent); its callables are
    imported later (:meth:`OutboxSettings.resolve_agents`)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("OUTBOX['AGENTS'] must be a dict {name: {...}}")
    agents: dict[str, AgentSettings] = {}
    for name, entry in raw.items():
        if not isinstance(name, str) or not AGENT_NAME_RE.fullmatch(name):
            raise ImproperlyConfigured(
                f"OUTBOX['AGENTS'] key {name!r} is not an agent name: 1 to 64 letters, "
                "digits, '_', '.' or '-', starting with a letter or digit"
            )
        if not isinstance(entry, Mapping):
            raise ImproperlyConfigured(f"OUTBOX['AGENTS'][{name!r}] must be a dict")
        for key in AGENT_CALLABLE_KEYS:
            try:
                _callable_or_path(key, entry.get(key))
            except ConfigError as exc:
                raise ImproperlyConfigured(
                    f"OUTBOX['AGENTS'][{name!r}][{key!r}] {exc.rule}"
                ) from exc
        if entry.get("DELIVERER") is None:
            raise ImproperlyConfigured(f"OUTBOX['AGENTS'][{name!r}]['DELIVERER'] is required")
        if name == DEFAULT_AGENT and has_deliverer:
            raise ImproperlyConfigured(
                "OUTBOX['AGENTS']['default'] and OUTBOX['DELIVERER'] both define the default "
                "agent: keep one"
            )
        agents[name] = AgentSettings(
            name,
            entry["DELIVERER"],
            entry.get("VERIFIER"),
            entry.get("ABORTER"),
            {k: v for k, v in entry.items() if k not in AGENT_CALLABLE_KEYS},
        )
    if len(agents) > 1 and not has_deliverer and DEFAULT_AGENT not in agents and not has_router:
        raise ImproperlyConfigured(
            "OUTBOX['AGENTS'] has several agents and none is the default: set "
            "OUTBOX['ROUTER'] (workspace_id, session_id) -> agent name, or name one 'default'"
        )
    return agents


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
    url = (
        raw.get("VALKEY_URL")
        or os.environ.get("OUTBOX_VALKEY_URL")
        or OWN_SETTINGS["VALKEY_URL"].default
    )
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


# The kinds of the OPENCODE keys raise ConfigError naming the key inside the block (_opencode
# puts OUTBOX['OPENCODE'] in front), or, for a URL, ImproperlyConfigured naming the entry.


def _base_url(key: str, value: Any) -> str | None:
    return None if value is None else _http_url(_opencode_name(key), value)


def _workspace_urls_setting(key: str, value: Any) -> Any:
    """A dotted path is kept as it is: it is imported on first use (``_workspace_lookup``)."""
    return value if value is None or isinstance(value, str) else _workspace_urls(value)


def _username(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value or ":" in value:
        raise ConfigError(key, "must be a non-empty string without ':'")
    return value


def _password(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(key, "must be a string or None")
    return value


def _response_bytes(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"must be an integer >= 1 (bytes), got {value!r}")
    return value


@dataclass(frozen=True)
class OpencodeSettings:
    """Validated ``OUTBOX["OPENCODE"]`` (docs/howto/deliverer.md, "The built-in opencode
    deliverer"): each key is a field below, in lower case.

    As stored: ``base_url`` without a trailing slash; ``workspace_urls`` a dict with its
    URLs checked, a callable (sync or async), or its dotted path (imported on first use,
    see :meth:`aurl_for`); credentials in a URL's userinfo are used when ``password`` is
    None; timeouts and ``clock_skew`` in float seconds.
    """

    # Checked in this order (a block with two wrong keys names the first).
    base_url: str | None = setting(
        None, kind=_base_url, doc="the opencode serve URL; required unless WORKSPACE_URLS"
    )
    # setting() returns a dataclasses.field, which RUF009 cannot see through this annotation.
    workspace_urls: Mapping[str, str] | Callable[[str], Any] | str | None = setting(  # noqa: RUF009
        None,
        kind=_workspace_urls_setting,
        doc="{workspace_id: URL}, a callable (workspace_id) -> URL or None, or its path",
    )
    username: str = setting("opencode", kind=_username, doc="the HTTP Basic user")
    password: str | None = setting(
        None, kind=_password, doc="the HTTP Basic password; no auth when None"
    )
    max_response_bytes: int = setting(
        DEFAULT_MAX_RESPONSE_BYTES,
        kind=_response_bytes,
        doc="the most the verifier reads of one answer",
    )
    connect_timeout: float = setting(5.0, kind=DURATION, doc="connecting to the agent")
    timeout: float = setting(
        declared(Config)["delivery_timeout"].default,
        kind=DURATION,
        doc="one delivery request; the default is DELIVERY_TIMEOUT",
    )
    verify_timeout: float = setting(30.0, kind=DURATION, doc="each read of the verifier's GETs")
    clock_skew: float = setting(
        2.0, kind=DURATION_OR_ZERO, doc="tolerance comparing the agent's times with the entry's"
    )

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


_OPENCODE = declared(OpencodeSettings)
#: The keys of ``OUTBOX["OPENCODE"]``.
OPENCODE_KEYS = frozenset(name.upper() for name in _OPENCODE)


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
    if raw.get("BASE_URL") is None and raw.get("WORKSPACE_URLS") is None:
        raise ImproperlyConfigured(f"{_opencode_name('BASE_URL')} is required (or WORKSPACE_URLS)")
    defaults = {name: declaration.default for name, declaration in _OPENCODE.items()}
    defaults["timeout"] = delivery_timeout  # TIMEOUT's default is DELIVERY_TIMEOUT
    values: dict[str, Any] = {}
    try:
        for name, kind in kinds(OpencodeSettings).items():
            key = name.upper()
            values[name] = kind(key, raw.get(key, defaults[name]))
    except ConfigError as exc:
        raise ImproperlyConfigured(f"{_opencode_name(exc.key)} {exc.rule}") from exc
    finally:
        # Good credentials are redacted from now on, even when a later key is wrong.
        if "password" in values:
            remember_credentials(values["username"], values["password"])
    return OpencodeSettings(**values)


# --- OUTBOX["LANGGRAPH"] -----------------------------------------------------------------

#: Default of ``OUTBOX["LANGGRAPH"]["THREAD_NAMESPACE"]``: the UUID namespace of the
#: thread IDs (uuid5 of workspace and session; docs/howto/langgraph.md).
DEFAULT_LANGGRAPH_NAMESPACE = "6f7c2d0e-4b1a-5c8e-9a3d-0d1b2c3e4f50"


def _langgraph_url(key: str, value: Any) -> str:
    """An http(s) URL without a trailing slash and without credentials (the key goes in
    API_KEY); a URL's credentials are remembered for redaction all the same."""
    if isinstance(value, str):
        remember_url(value)
        try:
            parts = urlsplit(value)
        except ValueError:
            parts = None
        if parts is not None and parts.scheme in ("http", "https") and parts.netloc:
            if "@" in parts.netloc:
                raise ConfigError(key, "must not carry credentials; set API_KEY instead")
            return value.rstrip("/")
    shown = redact(value) if isinstance(value, str) else value
    raise ConfigError(key, f"must be an http(s) URL such as http://127.0.0.1:2024, got {shown!r}")


def _assistant_id(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, "must be a non-empty string (a graph name or assistant UUID)")
    return value


def _api_key(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or any(c in value for c in "\r\n"):
        raise ConfigError(key, "must be a non-empty string on one line, or None")
    return value


def _namespace(key: str, value: Any) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ConfigError(key, f"must be a UUID, got {value!r}") from None


@dataclass(frozen=True)
class LangGraphSettings:
    """Validated ``OUTBOX["LANGGRAPH"]`` (docs/howto/langgraph.md): each key is a field
    below, in lower case. ``url`` is stored without a trailing slash, timeouts in float
    seconds, ``thread_namespace`` as a canonical UUID string."""

    url: str = setting("", kind=_langgraph_url, doc="the LangGraph Agent Server; required")
    assistant_id: str = setting(
        "", kind=_assistant_id, doc="the graph name or assistant ID each run uses; required"
    )
    api_key: str | None = setting(None, kind=_api_key, doc="sent as X-Api-Key; no key when None")
    connect_timeout: float = setting(5.0, kind=DURATION, doc="connecting to the server")
    request_timeout: float = setting(
        30.0, kind=DURATION, doc="each read of a thread, run, search or cancel request"
    )
    timeout: float = setting(
        declared(Config)["delivery_timeout"].default,
        kind=DURATION,
        doc="waiting for a run to finish; the default is DELIVERY_TIMEOUT",
    )
    max_response_bytes: int = setting(
        DEFAULT_MAX_RESPONSE_BYTES, kind=_response_bytes, doc="the most read of one answer"
    )
    thread_namespace: str = setting(
        DEFAULT_LANGGRAPH_NAMESPACE,
        kind=_namespace,
        doc="the UUID namespace of the thread IDs",
    )


_LANGGRAPH = declared(LangGraphSettings)
#: The keys of ``OUTBOX["LANGGRAPH"]``.
LANGGRAPH_KEYS = frozenset(name.upper() for name in _LANGGRAPH)


def _langgraph(raw: Any, delivery_timeout: float) -> LangGraphSettings | None:
    """Validate ``OUTBOX["LANGGRAPH"]``; None when it is absent."""
    if raw is None:
        return None
    return langgraph_block(raw, delivery_timeout)


def langgraph_block(
    raw: Any, delivery_timeout: float, where: str = "OUTBOX['LANGGRAPH']"
) -> LangGraphSettings:
    """Validate one LangGraph block: ``OUTBOX["LANGGRAPH"]``, or the options of an
    ``AGENTS`` entry (``where`` names it in the errors). Raises ``ImproperlyConfigured``
    naming the key and its rule (docs/howto/langgraph.md#settings)."""
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict")
    unknown = sorted(set(raw) - LANGGRAPH_KEYS)
    if unknown:
        raise ImproperlyConfigured(
            f"{where} has unknown keys {unknown}; known: {sorted(LANGGRAPH_KEYS)}"
        )
    # Remembered before anything is checked: a wrong later key never shows the key.
    remember_secret(raw.get("API_KEY"))
    for key in ("URL", "ASSISTANT_ID"):
        if raw.get(key) is None:
            raise ImproperlyConfigured(f"{where}[{key!r}] is required")
    defaults = {name: declaration.default for name, declaration in _LANGGRAPH.items()}
    defaults["timeout"] = delivery_timeout  # TIMEOUT's default is DELIVERY_TIMEOUT
    values: dict[str, Any] = {}
    try:
        for name, kind in kinds(LangGraphSettings).items():
            key = name.upper()
            values[name] = kind(key, raw.get(key, defaults[name]))
    except ConfigError as exc:
        raise ImproperlyConfigured(f"{where}[{exc.key!r}] {exc.rule}") from exc
    return LangGraphSettings(**values)


# --- the whole OUTBOX dict ---------------------------------------------------------------


def _build() -> OutboxSettings:
    raw = getattr(settings, "OUTBOX", {}) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured("settings.OUTBOX must be a dict")
    tunables = {k.lower(): v for k, v in raw.items() if k not in OWN_KEYS}
    try:
        config = Config.from_mapping(tunables)
        own = {
            key: declaration.kind(key, raw.get(key, declaration.default))
            for key, declaration in OWN_SETTINGS.items()
            if declaration.kind is not None
        }
    except ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    return OutboxSettings(
        valkey_url=_valkey_url(raw),
        cluster=own["CLUSTER"],
        deliverer=own["DELIVERER"],
        verifier=own["VERIFIER"],
        ledger_probe=own["LEDGER_PROBE"],
        access_policy=own["ACCESS_POLICY"],
        config=config,
        opencode=_opencode(raw.get("OPENCODE"), config.delivery_timeout),
        agents=_agents(raw.get("AGENTS"), own["DELIVERER"] is not None, own["ROUTER"] is not None),
        router=own["ROUTER"],
        langgraph=_langgraph(raw.get("LANGGRAPH"), config.delivery_timeout),
        user_accepts_per_minute_all=own["USER_ACCEPTS_PER_MINUTE_ALL"],
        aborter=own["ABORTER"],
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
