"""System checks (``manage.py check``, ``--deploy``): README "System checks".

IDs are stable; the letter matches the level (``E`` errors, ``W`` warnings):

- ``E001`` the ``OUTBOX`` settings are invalid
- ``E002`` a DELIVERER / VERIFIER / LEDGER_PROBE / ACCESS_POLICY does not import or call
- ``E003`` Valkey's ``maxmemory-policy`` is not ``noeviction`` (it would delete queued messages)
- ``E004`` the outbox WebSocket consumer is routed but no channel layer is configured
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

On a cluster the Valkey checks run on every primary. The server's settings come
from the core (``core.reads.read_server_settings``), which the worker's preflight
reads too (``Outbox.server_settings``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from .conf import CALLABLE_KEYS, DEFAULT_ACCESS_POLICY, outbox_settings
from .core.errors import OutboxUnavailable
from .core.reads import ServerSettings, read_server_settings, redis_py_version
from .core.redaction import redact

CONNECT_TIMEOUT = 1.0


def _settings_or_error(errors: list[checks.CheckMessage]):
    try:
        return outbox_settings()
    except ImproperlyConfigured as exc:
        errors.append(
            checks.Error(
                f"Invalid OUTBOX settings: {redact(str(exc))}",
                hint="Fix the named key; see the Settings section of django-outbox's README.",
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
                    hint=f"Point OUTBOX[{key!r}] at a callable (or a dotted path to one).",
                    id="django_outbox.E002",
                )
            )
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
    if conf.deliverer is None:
        errors.append(
            checks.Warning(
                "No OUTBOX['DELIVERER'] is configured: messages are accepted but "
                "'manage.py outbox_worker' will refuse to start.",
                hint="Set it to 'django_outbox.delivery.opencode.deliver' or your own callable.",
                id="django_outbox.W002",
            )
        )
    errors += _check_channel_layer()
    return errors


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
                    "when memory is full, and nothing accepted is lost).",
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


def _routes_consumer(application: Any, depth: int = 0) -> bool:
    from .ws.consumer import OutboxConsumer

    if application is None or depth > 12:
        return False
    if getattr(application, "consumer_class", None) is OutboxConsumer:
        return True
    for attr in ("application_mapping", "routes", "inner", "application", "callback"):
        child = getattr(application, attr, None)
        if isinstance(child, dict):
            if any(_routes_consumer(c, depth + 1) for c in child.values()):
                return True
        elif isinstance(child, list | tuple):
            if any(_routes_consumer(c, depth + 1) for c in child):
                return True
        elif child is not None and child is not application and _routes_consumer(child, depth + 1):
            return True
    return False


def _check_channel_layer() -> list[checks.CheckMessage]:
    path = getattr(settings, "ASGI_APPLICATION", None)
    if not path or getattr(settings, "CHANNEL_LAYERS", None):
        return []
    from django.utils.module_loading import import_string

    try:
        application = import_string(path)
    except Exception:
        return []  # Channels reports an unloadable ASGI_APPLICATION itself
    if not _routes_consumer(application):
        return []
    return [
        checks.Error(
            "The outbox WebSocket consumer is routed but CHANNEL_LAYERS is not configured: "
            "clients would get no live queue updates.",
            hint="Configure a channel layer, e.g. channels_redis.core.RedisChannelLayer on your "
            "Valkey.",
            id="django_outbox.E004",
        )
    ]
