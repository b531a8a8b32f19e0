"""The channel layer's system check, ``W018`` (docs/reference/checks.md): a
channels-redis layer whose keys share the outbox's Valkey database under a ``prefix``
that overlaps ``KEY_PREFIX`` (docs/howto/valkey.md#sharing-a-channel-layer). Registered
when ``OutboxConfig.ready`` imports it; reads settings only, never a server."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from ..conf import outbox_settings
from ..core.redaction import redact

#: channels-redis's defaults: its ``hosts`` when none are given, and its key ``prefix``.
_LAYER_DEFAULT_HOST = "redis://localhost:6379"
_LAYER_DEFAULT_PREFIX = "asgi"


def _node(address: Any, db: Any = None) -> tuple[str, int, int] | None:
    """``(host, port, database)`` of a Redis URL (``localhost`` spelled ``127.0.0.1``);
    ``db`` overrides the URL's database. None for what is not a TCP URL."""
    try:
        parts = urlsplit(str(address))
        if parts.scheme not in ("redis", "rediss", "valkey", "valkeys") or not parts.hostname:
            return None
        host = "127.0.0.1" if parts.hostname in ("localhost", "::1") else parts.hostname
        if db is None:
            db = parse_qs(parts.query).get("db", [None])[0] or parts.path.strip("/") or 0
        return host, parts.port or 6379, int(db)
    except ValueError:
        return None


def _layer_nodes(config: dict[str, Any]) -> list[tuple[str, int, int]]:
    """The servers a channels-redis layer's ``hosts`` name (its ``decode_hosts`` forms: a
    URL, a ``(host, port)`` pair, a dict of connection options); sentinels are skipped."""
    nodes = []
    for entry in config.get("hosts") or [_LAYER_DEFAULT_HOST]:
        if isinstance(entry, dict):
            if "address" in entry:
                node = _node(entry["address"], entry.get("db"))
            elif "host" in entry:
                address = f"redis://{entry['host']}:{entry.get('port', 6379)}"
                node = _node(address, entry.get("db", 0))
            else:
                node = None
        elif isinstance(entry, list | tuple) and len(entry) >= 2:
            node = _node(f"redis://{entry[0]}:{entry[1]}", 0)
        else:
            node = _node(entry)
        if node is not None:
            nodes.append(node)
    return nodes


def _is_keyed_redis_layer(backend: Any) -> bool:
    """Whether ``backend`` is channels-redis's ``RedisChannelLayer`` (or a subclass): the
    layer that keeps its messages and groups in keys (the pub/sub layer keeps none)."""
    if not isinstance(backend, str):
        return False
    try:
        from channels_redis.core import RedisChannelLayer
        from django.utils.module_loading import import_string

        layer = import_string(backend)
    except Exception:  # not installed, or a layer Channels itself reports
        return False
    return isinstance(layer, type) and issubclass(layer, RedisChannelLayer)


@checks.register("outbox")
def check_channel_layer_key_space(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """W018 (docs/howto/valkey.md#sharing-a-channel-layer): a channels-redis layer keeps
    its keys in the outbox's own Valkey database under a ``prefix`` that overlaps
    ``KEY_PREFIX`` (one begins with the other). The layer's ``flush()`` deletes every key
    matching ``<prefix>*``, the outbox's queue among them, and whatever an operator does
    to ``<KEY_PREFIX>*`` (a memory count, a clean-up) meets the layer's keys. Group names
    carry the project's tag (:func:`~django_outbox.outbox.key_space_tag`), so a layer
    shared with other projects is not warned about. Reads settings only; returns ``[]``
    on invalid settings (E001)."""
    try:
        conf = outbox_settings()
    except ImproperlyConfigured:
        return []
    outbox_node = _node(conf.valkey_url)
    key_prefix = conf.config.key_prefix
    layers = getattr(settings, "CHANNEL_LAYERS", None) or {}
    messages: list[checks.CheckMessage] = []
    for alias, layer in layers.items() if isinstance(layers, dict) else ():
        if not isinstance(layer, dict) or not _is_keyed_redis_layer(layer.get("BACKEND")):
            continue
        config = layer.get("CONFIG") or {}
        prefix = str(config.get("prefix", _LAYER_DEFAULT_PREFIX))
        if outbox_node is None or outbox_node not in _layer_nodes(config):
            continue
        if not (key_prefix.startswith(prefix) or prefix.startswith(key_prefix)):
            continue
        messages.append(
            checks.Warning(
                f"CHANNEL_LAYERS[{alias!r}] keeps its keys in the outbox's Valkey database "
                f"({redact(conf.valkey_url)}) under the prefix {prefix!r}, which overlaps "
                f"OUTBOX['KEY_PREFIX'] ({key_prefix!r}): the layer's flush() deletes every "
                f"key matching {prefix + '*'!r}, the outbox's queue among them, and the "
                "layer's keys fall among the outbox's.",
                hint="Give the channel layer a database of its own in its hosts URL "
                "(redis://host:6379/2), or a prefix that does not overlap KEY_PREFIX (neither "
                "begins with the other: channels-redis's default 'asgi' beside the default "
                "'outbox' is fine); django-outbox's "
                "docs/howto/valkey.md#sharing-a-channel-layer.",
                id="django_outbox.W018",
            )
        )
    return messages
