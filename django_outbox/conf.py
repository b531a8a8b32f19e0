"""The ``OUTBOX`` settings dict: defaults, validation, one immutable object read late.

``outbox_settings()`` returns the validated :class:`OutboxSettings`, built on
first use and rebuilt when ``settings.OUTBOX`` or ``CACHES`` changes
(``override_settings`` works; :func:`reset` forgets it by hand). A wrong type or
value raises ``ImproperlyConfigured`` naming the key and the rule.

Each key is declared once, with its default, rule and doc line: the tunables are the
fields of :class:`django_outbox.core.config.Config` in upper case, the keys only Django
reads are :data:`OWN_SETTINGS`, and a built-in backend's own block of settings (:data:`BLOCKS`)
is declared and parsed by the backend's module, loaded only when the block is set.
docs/reference/settings.md is the reference (a test keeps its tables equal to these
declarations).

This module imports nothing of the outbox it configures: caches built from these
settings (the process-wide outbox, the opencode clients) forget themselves.
"""

from __future__ import annotations

import inspect
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import import_module
from types import MappingProxyType
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

from .core.agents import DEFAULT_AGENT, Agent
from .core.config import FLAG, OPTIONAL_LIMIT, Config, ConfigError, Setting
from .core.redaction import remember_url

DEFAULT_ACCESS_POLICY = "django_outbox.policy.staff_only"


def _callable_or_path(key: str, value: Any) -> Any:
    """A callable, or its dotted path (imported on first use, :meth:`OutboxSettings.resolve`)."""
    if value is not None and not isinstance(value, str) and not callable(value):
        raise ConfigError(key, "must be a callable or a dotted path to one")
    return value


#: The backends whose settings are a block of ``OUTBOX``: the key -> the module (relative to
#: this package) that declares the block and parses it (its ``parse_settings(raw,
#: delivery_timeout)``), imported only when the block is set.
BLOCKS = {"OPENCODE": ".delivery.opencode", "LANGGRAPH": ".delivery.langgraph"}

#: The ``OUTBOX`` keys besides the tunables (:class:`Config`'s fields), checked in this
#: order after them. A key without a kind is checked with the keys it depends on:
#: ``VALKEY_URL`` and ``CONNECTION_ALIAS`` by :func:`_valkey_url`, a backend's block
#: (:data:`BLOCKS`) by its module.
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
    "AGENTS": Setting(
        None, kind=None, doc="named agents: {name: {DELIVERER, VERIFIER, ABORTER, settings}}"
    ),
    "ROUTER": Setting(
        None, kind=_callable_or_path, doc="(workspace_id, session_id) -> the agent's name"
    ),
    "USER_ACCEPTS_PER_MINUTE_ALL": Setting(
        60,
        kind=OPTIONAL_LIMIT,
        doc="one user's REST accepts per minute over every workspace (a DRF throttle); 0/None: off",
    ),
}
OWN_SETTINGS.update(
    (key, Setting(None, kind=None, doc=f"the built-in {module[10:]} backend's block"))
    for key, module in BLOCKS.items()
)
OWN_KEYS = frozenset(OWN_SETTINGS)
#: The keys that name a callable (``OUTBOX[key]`` is resolved by :meth:`OutboxSettings.resolve`).
CALLABLE_KEYS = tuple(k for k, s in OWN_SETTINGS.items() if s.kind is _callable_or_path)
#: The keys of an ``OUTBOX["AGENTS"]`` entry that name its callables; its other keys are
#: the agent's own settings (:attr:`AgentSettings.options`).
AGENT_CALLABLE_KEYS = ("DELIVERER", "VERIFIER", "ABORTER")


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
    #: ``OUTBOX["AGENTS"]``, checked for shape (its callables are imported by
    #: :meth:`resolve_agents`); empty when absent.
    agents: Mapping[str, AgentSettings] = field(default_factory=dict)
    #: ``OUTBOX["ROUTER"]``: a callable or its dotted path, or None.
    router: Any = None
    #: The backends' blocks that are set (:data:`BLOCKS`), parsed by their modules: read
    #: one as ``blocks["KEY"]`` or as the attribute of its name in lower case
    #: (``outbox_settings().opencode``: None when the block is absent).
    blocks: Mapping[str, Any] = field(default_factory=dict)
    #: ``OUTBOX["USER_ACCEPTS_PER_MINUTE_ALL"]`` (0: off): django_outbox.api.throttling.
    user_accepts_per_minute_all: int = 60
    #: ``OUTBOX["ABORTER"]``: ``abort(entry, *, workspace_id, session_id)`` or its dotted
    #: path, or None (docs/howto/cutting.md).
    aborter: Any = None

    def __getattr__(self, name: str) -> Any:
        if name.upper() in BLOCKS:
            return self.blocks.get(name.upper())
        raise AttributeError(name)

    def resolve(self, key: str) -> Callable[..., Any] | None:
        """Import and return the callable configured for ``key`` (e.g. ``"DELIVERER"``).

        Raises ``ImproperlyConfigured`` if the dotted path does not import or the
        object is not callable, and, for the single ``DELIVERER``, ``VERIFIER`` or
        ``ABORTER``, when the callable's ``validate_agent_options`` refuses the settings it
        needs (a built-in backend whose block is missing: docs/howto/agents.md).
        """
        found = _import_callable(f"OUTBOX[{key!r}]", getattr(self, key.lower()))
        validate = getattr(found, "validate_agent_options", None)
        if key in AGENT_CALLABLE_KEYS and callable(validate):
            validate(DEFAULT_AGENT, {})
        return found

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
        blocks={
            key: _block(module, raw[key], config.delivery_timeout)
            for key, module in BLOCKS.items()
            if raw.get(key) is not None
        },
        agents=_agents(raw.get("AGENTS"), own["DELIVERER"] is not None, own["ROUTER"] is not None),
        router=own["ROUTER"],
        user_accepts_per_minute_all=own["USER_ACCEPTS_PER_MINUTE_ALL"],
        aborter=own["ABORTER"],
    )


def _block(module: str, raw: Any, delivery_timeout: float) -> Any:
    """A backend's block parsed by its module (:data:`BLOCKS`)."""
    return import_module(module, __package__).parse_settings(raw, delivery_timeout)


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


#: Names that lived here before the backends declared their own settings
#: (docs/howto/agents.md): still importable from here.
_MOVED = {
    "OpencodeSettings": "opencode",
    "LangGraphSettings": "langgraph",
    "DEFAULT_LANGGRAPH_NAMESPACE": "langgraph",
    "langgraph_block": "langgraph",
    "DEFAULT_MAX_RESPONSE_BYTES": "base",
}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        return getattr(import_module(f".delivery.{_MOVED[name]}", __package__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
