"""System checks (``manage.py check``, ``--deploy``): docs/reference/checks.md.

IDs are stable; the letter matches the level (``E`` errors, ``W`` warnings):

- ``E001`` the ``OUTBOX`` settings are invalid
- ``E002`` a DELIVERER / VERIFIER / LEDGER_PROBE / ABORTER / ACCESS_POLICY / ROUTER does not import
  or call
- ``E003`` Valkey's ``maxmemory-policy`` is not ``noeviction`` (it would delete queued messages)
- ``E004`` the outbox WebSocket consumer is routed (by ``ASGI_APPLICATION``, or by the
  project's ``asgi`` module next to the settings) but no channel layer is configured
- ``W001`` the default access policy (staff only) is in use
- ``W002`` no DELIVERER is configured (``outbox_worker`` will refuse to start)
- ``W003`` (deploy) Valkey persists nothing: neither AOF nor RDB snapshots
- ``W004`` (deploy) ``appendfsync no``: the OS decides when the AOF reaches the disk
- ``E005`` ``WAIT_AOF`` is on but the server has no AOF or ``appendfsync no`` (every
  accept would be stored but answered 503)
- ``W005`` Valkey is unreachable (a warning, so ``migrate`` works while it is down;
  accepts answer 503 and ``outbox_worker`` refuses to start until it is back)
- ``W006`` ``CLUSTER`` with redis-py older than 7.2 (its async cluster client does not
  reconnect after a failover)
- ``W007`` the access policy does not say it checks that the session belongs to the
  workspace (``django_outbox.policy.session_scoped`` marks one that does)
- ``W008`` the outbox WebSocket consumer is routed without an origin validator on the
  way (cross-site WebSocket hijacking with the session cookie)
- ``W009`` the check cannot see whether the consumer is routed behind an origin
  validator (``ASGI_APPLICATION`` does not import, or a layer hides what it wraps)
- ``W010`` the environment's ``OUTBOX_VALKEY_URL`` names another server than
  ``OUTBOX['VALKEY_URL']`` or ``CONNECTION_ALIAS``, which win
- ``E006`` the key space (``KEY_PREFIX`` in that Valkey database) is claimed by another
  project (another ``SECRET_KEY``): its worker would deliver this one's prompts; the
  check only reads the claim, it never writes one
- ``E007`` the server cannot do what the outbox or its settings need: older than Redis
  7.0, or ``WAIT_AOF`` on a server without WAITAOF (Redis before 7.2); the worker will
  not start there either
- ``E008`` an ``AGENTS`` entry or the ``ROUTER`` is unusable: a callable that does not
  import or call, an ``async def`` router, settings the agent's deliverer refuses
  (docs/howto/agents.md)
- ``W011`` the origin validator in front of the outbox WebSocket consumer admits every
  ``Origin`` (``"*"`` among its origins, e.g. ``ALLOWED_HOSTS = ["*"]`` under
  ``AllowedHostsOriginValidator``): cross-site WebSocket hijacking with the session cookie
- ``W014`` ``USER_ACCEPTS_PER_MINUTE_ALL`` is on but the default cache counts nothing
- ``W015`` ``LOCK_TTL`` is below 7.5 s: a worker stalled for two thirds of it loses the
  lease of the delivery it is making, and the prompt may be sent twice
- ``W016`` ``MAX_HOLDS`` is set but no longer read (holds end by ``HOLD_MAX_TOTAL``)
- ``W017`` (deploy) ``USER_ACCEPTS_PER_MINUTE_ALL`` counts in a per-process ``LocMemCache``
- ``W018`` a channels-redis layer on the outbox's own Valkey database whose ``prefix``
  and ``KEY_PREFIX`` overlap: the layer's ``flush()`` deletes ``<prefix>*``, the queue
  with it (registered by :mod:`django_outbox.ws.checks`)

On a cluster the Valkey checks run on every primary. The server's settings come
from the core (``core.reads.read_server_settings``), which the worker's preflight
reads too (``Outbox.server_settings``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import CALLABLE_KEYS, DEFAULT_ACCESS_POLICY, outbox_settings
from .core.errors import OutboxUnavailable
from .core.owner import read_claim
from .core.reads import (
    ServerSettings,
    read_capabilities,
    read_server_settings,
    redis_py_version,
)
from .core.redaction import redact
from .core.server import unmet
from .core.transport import is_async_callable
from .outbox import key_space_owner
from .policy import CHECKS_SESSION

CONNECT_TIMEOUT = 1.0


def _settings_or_error(errors: list[checks.CheckMessage]):
    try:
        return outbox_settings()
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                f"Invalid OUTBOX settings: {redact(str(exc))}",
                hint="Fix the named key; see django-outbox's docs/reference/settings.md.",
                id="django_outbox.E001",
            )
        )
        return None


@checks.register("outbox")
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    conf = _settings_or_error(errors)
    if conf is None:
        return errors
    for key in CALLABLE_KEYS:
        try:
            conf.resolve(key)
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(
                    redact(str(exc)),
                    hint=f"Point OUTBOX[{key!r}] at a callable (or a dotted path to one) and "
                    "give it the settings it names (a built-in backend's block: "
                    "docs/howto/agents.md).",
                    id="django_outbox.E002",
                )
            )
    errors += _check_async_policy(conf)
    errors += _check_agents(conf)
    if conf.access_policy == DEFAULT_ACCESS_POLICY:
        errors.append(
            checks.Warning(
                "The default outbox access policy is in use: only staff can use the queue API "
                "and WebSocket.",
                hint="Set OUTBOX['ACCESS_POLICY'] to a callable (user, workspace_id, session_id, "
                "action) -> bool that knows who may use which workspace.",
                id="django_outbox.W001",
            )
        )
    elif not _policy_checks_sessions(conf):
        errors.append(
            checks.Warning(
                "OUTBOX['ACCESS_POLICY'] does not say that it checks that the session belongs "
                "to the workspace: the agent is addressed by session ID alone, so a user "
                "allowed in one workspace could send prompts into another workspace's "
                "session by naming it under their own.",
                hint="Wrap the policy with django_outbox.policy.session_scoped(...) "
                "(docs/howto/access-policy.md), or set checks_session_in_workspace = True on "
                "it once it checks that itself.",
                id="django_outbox.W007",
            )
        )
    if conf.deliverer is None and not conf.agents:
        errors.append(
            checks.Warning(
                "No OUTBOX['DELIVERER'] is configured: messages are accepted but "
                "'manage.py outbox_worker' will refuse to start.",
                hint="Set it to 'django_outbox.delivery.opencode.deliver' or your own callable.",
                id="django_outbox.W002",
            )
        )
    errors += _check_valkey_url_sources()
    errors += _check_channel_layer()
    errors += _check_origin_validation()
    return errors


def _check_agents(conf: Any) -> list[checks.CheckMessage]:
    """E008: every ``AGENTS`` entry resolves (its callables import and call, its deliverer
    accepts its settings) and the ``ROUTER`` is a plain callable (docs/howto/agents.md)."""
    errors: list[checks.CheckMessage] = []
    for agent in conf.agents.values():
        try:
            agent.resolve()
        except ImproperlyConfigured as exc:
            errors.append(
                checks.Error(
                    redact(str(exc)),
                    hint=f"Fix OUTBOX['AGENTS'][{agent.name!r}] (docs/howto/agents.md).",
                    id="django_outbox.E008",
                )
            )
    try:
        conf.resolve("ROUTER")
    except ImproperlyConfigured:
        return errors  # E002 says so
    try:
        conf.resolve_router()
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                redact(str(exc)),
                hint="Point OUTBOX['ROUTER'] at a plain function (workspace_id, session_id) -> "
                "agent name (docs/howto/agents.md#routing).",
                id="django_outbox.E008",
            )
        )
    return errors


def _check_async_policy(conf: Any) -> list[checks.CheckMessage]:
    """E002 for an ``async def`` access policy: it would be called without being awaited
    (is_allowed refuses everything it is asked, fail closed)."""
    try:
        policy = conf.resolve("ACCESS_POLICY")
    except ImproperlyConfigured:
        return []  # E002 says so already
    if policy is None or not is_async_callable(policy):
        return []
    return [
        checks.Error(
            "OUTBOX['ACCESS_POLICY'] is an async function; the outbox calls it from a thread "
            "and never awaits it, so every request would be refused.",
            hint="Make it a plain def (it may use the ORM: REST views and the WebSocket "
            "consumer call it in a thread).",
            id="django_outbox.E002",
        )
    ]


def _policy_checks_sessions(conf: Any) -> bool:
    try:
        policy = conf.resolve("ACCESS_POLICY")
    except ImproperlyConfigured:
        return True  # E002 says so
    return policy is None or bool(getattr(policy, CHECKS_SESSION, False))


def _valkey_settings(conf: Any, errors: list[checks.CheckMessage]) -> list[ServerSettings]:
    """The settings of the server, or of every primary of a cluster. Appends W005 and
    returns ``[]`` when Valkey is unreachable."""
    url = conf.valkey_url
    try:
        return read_server_settings(url, cluster=conf.cluster, timeout=CONNECT_TIMEOUT)
    except OutboxUnavailable as exc:
        errors.append(
            checks.Warning(
                f"Valkey at {redact(url)} is unreachable: {redact(str(exc))}",
                hint="Start Valkey or fix OUTBOX['VALKEY_URL'] (or OUTBOX_VALKEY_URL).",
                id="django_outbox.W005",
            )
        )
        return []


@checks.register("outbox")
def check_valkey(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    conf = _settings_or_error([])
    if conf is None:
        return errors
    version = redis_py_version()
    if conf.cluster and _version(version) < (7, 2):
        errors.append(
            checks.Warning(
                f"redis-py {version} with OUTBOX['CLUSTER'] = True: its async cluster "
                "client never reconnects once a failover made every node unreachable for a "
                "moment (redis-py issue 3917), so workers stop finding work.",
                hint="Install redis>=7.2.",
                id="django_outbox.W006",
            )
        )
    for server in _valkey_settings(conf, errors):
        node, policy = server.node, server.maxmemory_policy
        if policy is not None and policy != "noeviction":
            errors.append(
                checks.Error(
                    f"Valkey's maxmemory-policy is {policy!r} on {node}: when memory runs out "
                    "it evicts keys, silently deleting queued messages, leases and dedupe "
                    "markers.",
                    hint="Run Valkey with 'maxmemory-policy noeviction' (accepts then get 503 "
                    "when memory is full, and nothing accepted is lost). Until then, other "
                    "commands run with --skip-checks (e.g. 'manage.py migrate --skip-checks') "
                    "or with SILENCED_SYSTEM_CHECKS = ['django_outbox.E003']; outbox_worker "
                    "still refuses to start on an evicting Valkey unless --allow-eviction.",
                    id="django_outbox.E003",
                )
            )
        aof = server.aof_enabled
        if conf.config.wait_aof and (not aof or server.appendfsync == "no"):
            errors.append(
                checks.Error(
                    f"OUTBOX['WAIT_AOF'] = True but {node} runs with "
                    f"{'appendfsync no' if aof else 'appendonly no'}: WAITAOF can never be "
                    "acknowledged, so every accept would be stored but answered 503.",
                    hint="Run Valkey with 'appendonly yes' and 'appendfsync everysec' (or "
                    "'always'), or set WAIT_AOF to False.",
                    id="django_outbox.E005",
                )
            )
    return errors


@checks.register("outbox")
def check_server_version(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E007 (docs/howto/valkey.md#supported-servers): the server's version and commands
    against what the outbox and its settings need; nothing when Valkey is unreachable
    (``W005`` says so)."""
    conf = _settings_or_error([])
    if conf is None:
        return []
    try:
        servers = read_capabilities(conf.valkey_url, cluster=conf.cluster, timeout=CONNECT_TIMEOUT)
    except OutboxUnavailable:
        return []
    return [
        checks.Error(redact(u.message), hint=u.hint, id="django_outbox.E007")
        for u in unmet(servers, wait_aof=conf.config.wait_aof)
    ]


@checks.register("outbox")
def check_key_space(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E006 (docs/howto/valkey.md#one-project-per-key-space). Reads the claim and writes
    none, so ``migrate``'s checks never claim a key space; nothing when Valkey is
    unreachable (``W005`` says so)."""
    conf = _settings_or_error([])
    if conf is None:
        return []
    prefix = conf.config.key_prefix
    try:
        claim = read_claim(conf.valkey_url, prefix, cluster=conf.cluster, timeout=CONNECT_TIMEOUT)
    except OutboxUnavailable:
        return []
    if claim is None:
        return []
    try:
        if key_space_owner(conf).owns(claim):
            return []
    except ImproperlyConfigured:  # no SECRET_KEY: Django says so wherever it needs one
        return []
    return [
        checks.Error(
            f"The outbox key space {prefix!r} at {redact(conf.valkey_url)} is claimed by "
            f"another project ({claim.describe()}): another SECRET_KEY, so another project "
            "or deployment. Sharing it, each project's worker would deliver the other's "
            "prompts and its cleanup delete them; this project's outbox_worker will not "
            "start there, and its cleanups and accepts are refused.",
            hint="Give this project its own key space: another OUTBOX['KEY_PREFIX'] (e.g. "
            "'staging') or another database number in the URL (redis://host:6379/1), see "
            "django-outbox's docs/howto/valkey.md. If this project is the rightful owner "
            "(its SECRET_KEY changed: list the old one in SECRET_KEY_FALLBACKS while "
            "rotating), stop the other project's workers and take the key space over with "
            "'python manage.py outbox claim --force'.",
            id="django_outbox.E006",
        )
    ]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


@checks.register("outbox", deploy=True)
def check_persistence(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    errors: list[checks.CheckMessage] = []
    conf = _settings_or_error([])
    if conf is None:
        return errors
    for server in _valkey_settings(conf, []):
        node, aof, rdb = server.node, server.aof_enabled, bool(server.save)
        if not aof and not rdb:
            errors.append(
                checks.Warning(
                    f"Valkey persists nothing on {node} (appendonly no, no save points): a "
                    "restart loses every queued message.",
                    hint="Turn on the append-only file: 'appendonly yes' with 'appendfsync "
                    "everysec' (or 'always').",
                    id="django_outbox.W003",
                )
            )
        if aof and server.appendfsync == "no":
            errors.append(
                checks.Warning(
                    f"Valkey runs with 'appendfsync no' on {node}: accepted messages reach the "
                    "disk when the OS decides (often 30 s later).",
                    hint="Use 'appendfsync everysec' or 'always' (WAIT_AOF needs one of them).",
                    id="django_outbox.W004",
                )
            )
    return errors


@dataclass
class _Routing:
    """What :func:`_walk` saw of an ASGI application: the routes to the outbox
    consumer (True: behind an origin validator) and the layers it could not see into
    outside any validator (their type names)."""

    consumer_routes: list[bool] = field(default_factory=list)
    opaque: list[str] = field(default_factory=list)
    #: Routes to the consumer whose origin validators all admit every ``Origin``.
    any_origin: list[str] = field(default_factory=list)


#: Attributes through which ASGI routers and middleware hold what they wrap (channels'
#: routers, BaseMiddleware and OriginValidator, Django's static files handler, most
#: third-party middleware, functools.wraps).
_CHILD_ATTRS = ("application_mapping", "routes", "inner", "application", "app", "callback",
                "__wrapped__")  # fmt: skip


def _walk(
    application: Any,
    guarded: bool,
    seen: frozenset[int],
    out: _Routing,
    depth: int = 0,
    strict: bool = False,
) -> None:
    """Record in ``out`` every route to the outbox consumer under ``application`` (behind
    an origin validator or not; behind validators that all admit every ``Origin``) and
    every unguarded layer it cannot see into; ``seen`` holds the ids of the layers above
    (a cycle stops there); ``strict``: a validator above admits only some origins."""
    from channels.routing import ProtocolTypeRouter
    from channels.security.websocket import OriginValidator
    from django.core.handlers.asgi import ASGIHandler

    from .ws.consumer import OutboxConsumer

    if application is None or id(application) in seen or depth > 30:
        return  # a cycle, or deeper than any real routing
    consumer = getattr(application, "consumer_class", None)
    if isinstance(consumer, type):
        if issubclass(consumer, OutboxConsumer):
            out.consumer_routes.append(guarded)
            if guarded and not strict:
                out.any_origin.append(getattr(application, "__qualname__", "the consumer"))
        return  # a consumer: nothing below it
    if isinstance(application, ASGIHandler):
        return  # Django's HTTP handler routes no WebSocket
    guarded = guarded or isinstance(application, OriginValidator)
    if isinstance(application, OriginValidator) and "*" not in application.allowed_origins:
        strict = True
    children: list[Any] = []
    for attr in _CHILD_ATTRS:
        child = getattr(application, attr, None)
        if isinstance(child, dict):
            if isinstance(application, ProtocolTypeRouter):
                child = {k: v for k, v in child.items() if k == "websocket"}
            children += child.values()
        elif isinstance(child, list | tuple):
            children += child
        elif child is not None and child is not application:
            children.append(child)
    if not guarded and not any(hasattr(application, attr) for attr in _CHILD_ATTRS):
        out.opaque.append(getattr(application, "__qualname__", type(application).__qualname__))
    for child in children:  # the same object may be routed twice, guarded once
        _walk(child, guarded, seen | {id(application)}, out, depth + 1, strict)


def _asgi_routing() -> _Routing | str | None:
    """What ``ASGI_APPLICATION`` routes: None when it is not set, the error text when it
    does not import."""
    path = getattr(settings, "ASGI_APPLICATION", None)
    if not path:
        return None
    from django.utils.module_loading import import_string

    try:
        application = import_string(path)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    out = _Routing()
    _walk(application, False, frozenset(), out)
    return out


def _check_valkey_url_sources() -> list[checks.CheckMessage]:
    """W010: the environment's ``OUTBOX_VALKEY_URL`` names another server than the settings,
    which win (docs/reference/settings.md: settings first, then the environment, then the
    default)."""
    from_env = os.environ.get("OUTBOX_VALKEY_URL")
    raw = getattr(settings, "OUTBOX", None) or {}
    if not from_env or not isinstance(raw, dict):
        return []
    if raw.get("CONNECTION_ALIAS") is not None:
        source = f"OUTBOX['CONNECTION_ALIAS'] ({raw['CONNECTION_ALIAS']!r})"
    elif raw.get("VALKEY_URL"):
        source = "OUTBOX['VALKEY_URL']"
    else:
        return []
    used = outbox_settings().valkey_url
    if used.rstrip("/") == from_env.rstrip("/"):
        return []
    return [
        checks.Warning(
            f"The environment sets OUTBOX_VALKEY_URL={redact(from_env)!r}, but {source} names "
            f"{redact(used)!r}, which wins: the environment variable is ignored.",
            hint="Remove one of them, or read the environment in your settings: "
            "OUTBOX = {'VALKEY_URL': os.environ['OUTBOX_VALKEY_URL'], ...}.",
            id="django_outbox.W010",
        )
    ]


def _guessed_asgi_modules() -> list[str]:
    """Where ``startproject`` puts the ASGI application when ``ASGI_APPLICATION`` is not
    set (uvicorn and daphne are pointed at it directly): the ``asgi`` module next to
    the settings module (``mysite.settings`` -> ``mysite.asgi``) and next to
    ``WSGI_APPLICATION``'s module (``mysite.wsgi.application`` -> ``mysite.asgi``)."""
    settings_module = os.environ.get("DJANGO_SETTINGS_MODULE") or getattr(
        settings, "SETTINGS_MODULE", None
    )
    wsgi = getattr(settings, "WSGI_APPLICATION", None)
    modules = []
    for dotted in (settings_module, wsgi.rpartition(".")[0] if wsgi else None):
        if dotted and "." in dotted:
            candidate = dotted.rpartition(".")[0] + ".asgi"
            if candidate not in modules:
                modules.append(candidate)
    return modules


def _guessed_routing() -> _Routing | None:
    """What the project's ``asgi`` module (:func:`_guessed_asgi_modules`) routes; None
    when there is none that imports."""
    from importlib import import_module
    from importlib.util import find_spec

    for name in _guessed_asgi_modules():
        try:
            if find_spec(name) is None:
                continue
            application = getattr(import_module(name), "application", None)
        except Exception:  # a guess: a module that does not import is not ours to report
            continue
        if application is not None:
            out = _Routing()
            _walk(application, False, frozenset(), out)
            return out
    return None


def _check_channel_layer() -> list[checks.CheckMessage]:
    """E004, whether ``ASGI_APPLICATION`` names the application or the server is pointed
    at the project's ``asgi`` module directly (see :func:`_guessed_asgi_modules`)."""
    if getattr(settings, "CHANNEL_LAYERS", None):
        return []
    routing = _asgi_routing()
    if routing is None:
        routing = _guessed_routing()
    if not isinstance(routing, _Routing) or not routing.consumer_routes:
        return []  # Channels reports an unloadable ASGI_APPLICATION itself
    return [
        checks.Error(
            "The outbox WebSocket consumer is routed but CHANNEL_LAYERS is not configured: "
            "every outbox WebSocket would be closed with 4500 and clients would get no live "
            "queue updates.",
            hint="Configure a channel layer, e.g. channels_redis.core.RedisChannelLayer on your "
            "Valkey.",
            id="django_outbox.E004",
        )
    ]


def _check_origin_validation() -> list[checks.CheckMessage]:
    """W008 / W009: docs/reference/websocket.md#origins and docs/explanation/security.md."""
    routing = _asgi_routing()
    if routing is None:
        return []  # no ASGI application named: nothing to look at
    path: str = getattr(settings, "ASGI_APPLICATION", "")
    hint = (
        "Wrap the WebSocket routes in django_outbox.ws.AllowedHostsOriginValidator (or "
        "OriginValidator; channels' own classes work too, but refuse without a log line or "
        "a close code the client can see), outside the authentication middleware, as "
        "django-outbox's docs/quickstart.md (asgi.py) shows."
    )
    if isinstance(routing, str):
        return [
            checks.Warning(
                f"Cannot import ASGI_APPLICATION {path!r} ({routing}), so whether the outbox "
                "WebSocket is behind an origin validator is unknown.",
                hint=hint,
                id="django_outbox.W009",
            )
        ]
    if not all(routing.consumer_routes):
        return [
            checks.Warning(
                f"{path} routes the outbox WebSocket consumer without an origin validator: "
                "another site's page could open it with the user's session cookie "
                "(cross-site WebSocket hijacking).",
                hint=hint,
                id="django_outbox.W008",
            )
        ]
    if routing.consumer_routes and routing.any_origin:
        return [
            checks.Warning(
                f"{path} routes the outbox WebSocket consumer behind an origin validator "
                "that admits every Origin ('*' among its origins; ALLOWED_HOSTS = ['*'] "
                "does that to AllowedHostsOriginValidator): another site's page could "
                "open it with the user's session cookie (cross-site WebSocket hijacking).",
                hint="List your hosts in ALLOWED_HOSTS (or the origins in "
                "OriginValidator(...)) instead of '*'; a front end on another origin goes "
                "in CSRF_TRUSTED_ORIGINS, which AllowedHostsOriginValidator admits too "
                "(django-outbox's docs/reference/websocket.md#origins).",
                id="django_outbox.W011",
            )
        ]
    if not routing.consumer_routes and routing.opaque:
        return [
            checks.Warning(
                f"Cannot see through {', '.join(sorted(set(routing.opaque)))} in {path}, so "
                "whether the outbox WebSocket consumer is routed behind an origin validator is "
                "unknown.",
                hint=hint + " A middleware that keeps what it wraps as `inner` or "
                "`application` (channels' BaseMiddleware does) can be seen through; if the "
                "consumer is not routed, or origins are checked elsewhere, silence "
                "django_outbox.W009.",
                id="django_outbox.W009",
            )
        ]
    return []


#: Cache backends in which DRF's throttles count nothing at all.
_UNCOUNTING_CACHES = ("django.core.cache.backends.dummy.DummyCache",)


@checks.register("outbox")
def check_accept_throttle(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W014: ``USER_ACCEPTS_PER_MINUTE_ALL`` is on, but Django's default cache, where the
    REST accept's throttle counts, keeps nothing (``DummyCache``): no bound applies to a
    user over workspaces (docs/explanation/idempotency.md#per-user-bounds)."""
    try:
        conf = outbox_settings()
    except ImproperlyConfigured:
        return []  # E001 says so
    if not conf.user_accepts_per_minute_all:
        return []
    backend = getattr(settings, "CACHES", {}).get("default", {}).get("BACKEND", "")
    if backend not in _UNCOUNTING_CACHES:
        return []
    return [
        checks.Warning(
            f"OUTBOX['USER_ACCEPTS_PER_MINUTE_ALL'] is "
            f"{conf.user_accepts_per_minute_all}, but the default cache ({backend}) counts "
            "nothing: no bound applies to one user's accepts over every workspace, so a "
            "user the access policy lets into many workspaces may accept the per-workspace "
            "bounds that many times over.",
            hint="Point CACHES['default'] at a shared cache (Redis/Valkey, Memcached), or "
            "set OUTBOX['USER_ACCEPTS_PER_MINUTE_ALL'] = 0 to say you bound users otherwise "
            "(docs/explanation/idempotency.md#per-user-bounds).",
            id="django_outbox.W014",
        )
    ]


#: Seconds of stall a delivery's lease must outlive between two renewals: one Valkey call
#: at the client's default socket timeout (5 s), or a worker process starved of CPU on a
#: loaded host for as long (docs/explanation/ordering.md#leases).
LEASE_STALL_ALLOWANCE = 5.0


@checks.register("outbox")
def check_lease(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W015: ``LOCK_TTL`` is too short for the stalls a worker may see.

    The lease keeper renews a delivery's lease every ``LOCK_TTL / 3`` seconds, so a worker
    that stalls (its event loop blocked, its process descheduled, one renewal call waiting
    on a slow Valkey) keeps its lease for at most ``2 * LOCK_TTL / 3`` seconds past its last
    renewal. Warns when that is under :data:`LEASE_STALL_ALLOWANCE`, i.e. ``LOCK_TTL``
    below 7.5 s: another worker may then take the session over while the first is still
    sending, and a verifier that sees the prompt "absent" sends it again
    (docs/explanation/ordering.md#leases). Returns ``[]`` on invalid settings (E001).
    """
    try:
        conf = outbox_settings()
    except ImproperlyConfigured:
        return []  # E001 says so
    lock_ttl = conf.config.lock_ttl
    survives = lock_ttl * 2 / 3
    if survives >= LEASE_STALL_ALLOWANCE:
        return []
    floor = LEASE_STALL_ALLOWANCE * 3 / 2
    return [
        checks.Warning(
            f"OUTBOX['LOCK_TTL'] is {lock_ttl:g} s: renewed every "
            f"{lock_ttl / 3:.3g} s, a delivery's lease is lost when a stall of its worker "
            f"(a busy host, a slow Valkey call) delays a renewal by {survives:.3g} s. "
            "Another worker then takes the session over while the first may still be "
            "sending, and a prompt can reach the agent twice.",
            hint=f"Set OUTBOX['LOCK_TTL'] to {floor:g} s or more (default 30 s), above one "
            "and a half times the longest stall a worker may see; a longer lease only "
            "delays taking over a crashed worker's session "
            "(docs/explanation/ordering.md#leases).",
            id="django_outbox.W015",
        )
    ]


@checks.register("outbox")
def check_deprecated(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W016: ``OUTBOX`` sets ``MAX_HOLDS``, which is no longer read: holds in a row end by
    the time they last (``HOLD_MAX_TOTAL``), since a count was burnt in seconds by an agent
    answering ``Retry-After: 0`` (docs/howto/agents.md#held-retry-after)."""
    block = getattr(settings, "OUTBOX", None)
    if not isinstance(block, dict) or "MAX_HOLDS" not in block:
        return []
    return [
        checks.Warning(
            "OUTBOX['MAX_HOLDS'] is no longer read: holds in a row now end in error / "
            "hold_exhausted once they have lasted HOLD_MAX_TOTAL (default 1 hour), and each "
            "hold waits at least HOLD_FLOOR, doubling while the agent keeps refusing.",
            hint="Remove MAX_HOLDS; set OUTBOX['HOLD_MAX_TOTAL'] (seconds) instead "
            "(docs/howto/agents.md#held-retry-after).",
            id="django_outbox.W016",
        )
    ]


#: Django's caches that keep their counts in each process: a bound counted there is per
#: process, so N web processes let a user through N times.
_PER_PROCESS_CACHES = {"django.core.cache.backends.locmem.LocMemCache"}


@checks.register("outbox", deploy=True)
def check_accept_throttle_shared(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W017 (``check --deploy``): ``USER_ACCEPTS_PER_MINUTE_ALL`` counts in Django's default
    cache, and that cache is the per-process ``LocMemCache`` (Django's own default): with
    several web processes each keeps its own count, so the bound is per process (two
    processes let 120 of 200 accepts through a bound of 60:
    docs/explanation/idempotency.md#per-user-bounds)."""
    try:
        conf = outbox_settings()
    except ImproperlyConfigured:
        return []  # E001 says so
    backend = getattr(settings, "CACHES", {}).get("default", {}).get("BACKEND", "")
    if not conf.user_accepts_per_minute_all or backend not in _PER_PROCESS_CACHES:
        return []
    return [
        checks.Warning(
            f"OUTBOX['USER_ACCEPTS_PER_MINUTE_ALL'] ({conf.user_accepts_per_minute_all}) "
            "counts in the default cache, which is LocMemCache: each web process counts on "
            "its own, so with N processes one user gets N times the bound over every "
            "workspace.",
            hint="Point CACHES['default'] at a shared cache (Redis/Valkey, Memcached, the "
            "database cache); the per-workspace bounds count in Valkey and are not affected "
            "(docs/explanation/idempotency.md#per-user-bounds).",
            id="django_outbox.W017",
        )
    ]
