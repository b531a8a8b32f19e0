"""What a server can do: its version and the commands the outbox needs
(docs/howto/valkey.md#supported-servers).

The outbox needs Redis 7.0 or later, or any Valkey (7.2 and later report
``redis_version`` 7.2.4): the Lua scripts declare their flags in a ``#!lua flags=``
shebang and the history's expiry uses ``PEXPIRE ... NX`` (both Redis 7.0), the worker
waits on ``BLMPOP`` (7.0), the queue uses ``ZADD ... LT``, ``ZRANGE ... BYSCORE
LIMIT``, ``ZMSCORE`` and ``LPOP`` with a count (6.2). ``WAIT_AOF`` needs ``WAITAOF``
(Redis 7.2, every Valkey).

:func:`read_node` learns one server's version and commands (``INFO server``, then each
probed command sent without arguments: a server that has it answers "wrong number of
arguments", one that lacks it "unknown command"; nothing runs). The
:class:`~django_outbox.core.service.Outbox` keeps what it read for its lifetime
(``server_capabilities``), so it is read once per process. :func:`unmet` says which
settings a server cannot honour; the system checks report them (``E007``) and the
worker refuses to start (:class:`~django_outbox.core.errors.ServerUnsupported`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

#: The oldest ``redis_version`` the outbox runs on (Valkey reports 7.2.4).
MINIMUM_VERSION = (7, 0)
#: What the minimum is, as the refusals say it.
MINIMUM_TEXT = "Redis 7.0 or later, or Valkey 7.2 or later"
#: Commands whose presence is probed on every server, and the server that brought them.
PROBED = {"BLMPOP": "Redis 7.0", "WAITAOF": "Redis 7.2 or Valkey 7.2"}


@dataclass(frozen=True, slots=True)
class ServerCapabilities:
    """One server as the outbox sees it: ``node`` (the URL, or ``host:port`` of a
    cluster primary), ``product`` (``"Valkey"`` or ``"Redis"``), ``version`` (the
    product's own version text), ``compatible`` (``redis_version`` as ``(major,
    minor)``), and ``commands``, the :data:`PROBED` commands it has."""

    node: str
    product: str
    version: str
    compatible: tuple[int, int]
    commands: frozenset[str]

    def __str__(self) -> str:
        return f"{self.product} {self.version}"


@dataclass(frozen=True, slots=True)
class Unmet:
    """A setting (or the outbox itself) that a server cannot honour: ``message`` says
    what and why, ``hint`` the fix."""

    message: str
    hint: str


def _version(text: str) -> tuple[int, int]:
    major, _, rest = text.partition(".")
    minor = rest.partition(".")[0]
    return (int(major) if major.isdigit() else 0, int(minor) if minor.isdigit() else 0)


def parse(node: str, info: dict[str, Any], missing: set[str]) -> ServerCapabilities:
    """The capabilities of ``node`` from its ``INFO server`` and the probed commands it
    answered "unknown command" to."""
    compatible = str(info.get("redis_version", "0.0"))
    valkey = str(info.get("server_name", "")).lower() == "valkey" or "valkey_version" in info
    return ServerCapabilities(
        node=node,
        product="Valkey" if valkey else "Redis",
        version=str(info.get("valkey_version") or compatible),
        compatible=_version(compatible),
        commands=frozenset(PROBED) - missing,
    )


def _unknown(exc: Exception) -> bool:
    return isinstance(exc, redis.ResponseError) and "unknown command" in str(exc).lower()


def read_node(node: str, client: Any, **route: Any) -> ServerCapabilities:
    """Read ``node`` through ``client`` (a plain client, or a cluster client with
    ``target_nodes=`` in ``route``). Raises what the client raises when the server
    cannot be reached."""
    info = client.execute_command("INFO", "server", **route)
    missing = set()
    for command in PROBED:
        try:
            client.execute_command(command, **route)
        except redis.ResponseError as exc:
            if _unknown(exc):
                missing.add(command)
    return parse(node, info, missing)


async def aread_node(node: str, client: Any, **route: Any) -> ServerCapabilities:
    """:func:`read_node` through an asyncio client."""
    info = await client.execute_command("INFO", "server", **route)
    missing = set()
    for command in PROBED:
        try:
            await client.execute_command(command, **route)
        except redis.ResponseError as exc:
            if _unknown(exc):
                missing.add(command)
    return parse(node, info, missing)


def unmet(servers: list[ServerCapabilities], *, wait_aof: bool) -> list[Unmet]:
    """What the ``servers`` (one, or every primary of a cluster) cannot honour: the
    outbox itself on a server older than :data:`MINIMUM_VERSION`, and ``WAIT_AOF``
    without ``WAITAOF``. ``[]`` when every server can do everything asked."""
    found: list[Unmet] = []
    for server in servers:
        if server.compatible < MINIMUM_VERSION or "BLMPOP" not in server.commands:
            found.append(
                Unmet(
                    f"{server.node} runs {server}, and django-outbox needs {MINIMUM_TEXT}: "
                    "its Lua scripts declare flags in a '#!lua flags=' line and its worker "
                    "waits with BLMPOP, which older servers refuse.",
                    hint=f"Upgrade the server to {MINIMUM_TEXT} "
                    "(docs/howto/valkey.md#supported-servers).",
                )
            )
        elif wait_aof and "WAITAOF" not in server.commands:
            found.append(
                Unmet(
                    f"OUTBOX['WAIT_AOF'] = True but {server.node} runs {server}, which has "
                    f"no WAITAOF ({PROBED['WAITAOF']} brought it): every accept would be "
                    "stored and answered 503, and no delivery could be acknowledged.",
                    hint="Upgrade the server to Redis 7.2 or later or Valkey, or set "
                    "OUTBOX['WAIT_AOF'] to False (docs/howto/valkey.md#supported-servers).",
                )
            )
    return found
