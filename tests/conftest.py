"""Test fixtures: one real valkey-server per session, a clean keyspace per test."""

from __future__ import annotations

import os

import pytest
import redis

from django_outbox import conf
from django_outbox.outbox import Outbox, reset_outbox
from tests.support.valkey import ValkeyProcess, free_port, wait_until

#: ``OUTBOX_TEST_CLUSTER=1`` (``make test-cluster``) runs the suites that use these fixtures
#: on a three-master Valkey Cluster, every Outbox in cluster mode.
ON_CLUSTER = os.environ.get("OUTBOX_TEST_CLUSTER") == "1"
#: ``OUTBOX_TEST_SERVER=redis-server`` (``make test-redis7``) runs them on Debian's
#: ``redis-server`` (Redis 7.0, the oldest supported server) instead of Valkey.
ON_REDIS = os.environ.get("OUTBOX_TEST_SERVER") == "redis-server"


def pytest_collection_modifyitems(config, items):
    if not ON_CLUSTER:
        return
    skip = pytest.mark.skip(reason="looks at a standalone server's own keys or processes")
    for item in items:
        if "standalone" in item.keywords:
            item.add_marker(skip)


def _plain_client(url: str, **kwargs):
    if ON_CLUSTER:
        from redis.cluster import RedisCluster

        return RedisCluster.from_url(url, **kwargs)
    return redis.Redis.from_url(url, **kwargs)


@pytest.fixture(scope="session")
def valkey(tmp_path_factory):
    """The session's Valkey: ``OUTBOX_TEST_VALKEY_URL`` if set, else a fresh server (a
    fresh three-master cluster with ``OUTBOX_TEST_CLUSTER=1``, Debian's redis-server with
    ``OUTBOX_TEST_SERVER=redis-server``)."""
    url = os.environ.get("OUTBOX_TEST_VALKEY_URL")
    if url:
        _refuse_a_database_in_use(url)
        yield url
        return
    if ON_CLUSTER:
        from tests.support.cluster import ValkeyCluster

        with ValkeyCluster(tmp_path_factory.mktemp("cluster")) as cluster:
            yield cluster.startup_url
        return
    if ON_REDIS:
        from tests.support.redis_server import redis_server

        server = redis_server(tmp_path_factory.mktemp("redis")).start()
    else:
        server = ValkeyProcess(tmp_path_factory.mktemp("valkey")).start()
    yield server.url
    server.stop()


def _refuse_a_database_in_use(url: str) -> None:
    """The tests flush the keyspace before each test: never do that to a Valkey the
    user pointed them at while it holds data (django-rq's guard)."""
    client = _plain_client(url)
    try:
        keys = client.dbsize()
        if isinstance(keys, dict):  # a cluster client answers per node
            keys = sum(keys.values())
    finally:
        client.close()
    if keys and os.environ.get("OUTBOX_TEST_ALLOW_FLUSH") != "1":
        pytest.exit(
            f"OUTBOX_TEST_VALKEY_URL={url} holds {keys} keys, and the tests flush the keyspace "
            "before every test. Point it at an empty database, or set OUTBOX_TEST_ALLOW_FLUSH=1 "
            "to let the tests delete them.",
            returncode=2,
        )


@pytest.fixture(autouse=True)
def _clean_valkey(valkey, monkeypatch):
    monkeypatch.setenv("OUTBOX_VALKEY_URL", valkey)
    client = _plain_client(valkey)
    if ON_CLUSTER:
        client.flushall(target_nodes=client.PRIMARIES)
    else:
        client.flushall()
    client.close()
    conf.reset()
    reset_outbox()
    _clear_django_cache()  # the REST accept's throttle counts there
    yield
    conf.reset()
    reset_outbox()


def _clear_django_cache() -> None:
    from django.core.cache import cache

    cache.clear()


@pytest.fixture
def r(valkey):
    """A plain redis-py client on the test Valkey (for looking at keys directly)."""
    client = _plain_client(valkey, decode_responses=True)
    yield client
    client.close()


class Recorder:
    """Collects signals: ``calls[name]`` is a list of (entry, kwargs)."""

    def __init__(self) -> None:
        from django_outbox import signals

        self.calls: dict[str, list] = {"staged": [], "delivered": [], "updated": []}
        self._connected = []
        for name in self.calls:
            signal = getattr(signals, f"entry_{name}")

            def receiver(sender, entry, _name=name, **kwargs):
                self.calls[_name].append((entry, kwargs))

            signal.connect(receiver, weak=False)
            self._connected.append((signal, receiver))

    def ids(self, name: str) -> list[str]:
        return [entry.id for entry, _ in self.calls[name]]

    def close(self) -> None:
        for signal, receiver in self._connected:
            signal.disconnect(receiver)


@pytest.fixture
def signals_log():
    recorder = Recorder()
    yield recorder
    recorder.close()


@pytest.fixture
def make_outbox(valkey):
    """Build Outbox instances on the test Valkey; closed at teardown."""
    made: list[Outbox] = []

    def make(**kwargs) -> Outbox:
        kwargs.setdefault("url", valkey)
        kwargs.setdefault("cluster", ON_CLUSTER)
        outbox = Outbox(**kwargs)
        made.append(outbox)
        return outbox

    yield make
    for outbox in made:
        outbox.close()


@pytest.fixture
def outbox(make_outbox):
    return make_outbox(
        retry_backoff=0.05,
        max_backoff=0.2,
        verify_delay=0,
        verify_backoff=0.05,
        max_verify_backoff=0.2,
    )


# --- Valkey Cluster ------------------------------------------------------------------


@pytest.fixture(scope="session")
def cluster_node_url(tmp_path_factory):
    """A one-node Valkey Cluster owning every slot: cheap, for the client-side rules
    (hints, shards, routing). The three-master cluster is ``valkey_cluster``."""
    server = ValkeyProcess(
        tmp_path_factory.mktemp("cluster-node"),
        cluster_enabled="yes",
        cluster_config_file="nodes.conf",
        cluster_port=str(free_port()),  # the default bus port (port + 10000) may not exist
    ).start()
    client = redis.Redis(port=server.port)
    client.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    wait_until(lambda: b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO"))
    client.close()
    yield server.url
    server.stop()


@pytest.fixture
def cluster_outbox(cluster_node_url, make_outbox):
    """Build cluster-mode Outbox instances on the one-node cluster, flushed first."""
    client = redis.Redis.from_url(cluster_node_url)
    client.flushall()
    client.close()

    def make(**kwargs):
        return make_outbox(url=cluster_node_url, cluster=True, **kwargs)

    return make


# --- database connections left in asgiref's shared thread ----------------------------


@pytest.fixture(autouse=True)
def _close_shared_thread_connections(request):
    """After a test with database access, close the connections its async code opened in
    asgiref's shared thread (``sync_to_async(thread_sensitive=True)`` outside any
    ``async_to_sync``: the worker's on-commit mover, receipts, the consumer's ORM calls).

    pytest-django tidies the test's own thread only, and Django never closes an in-memory
    SQLite connection (``close()`` is a no-op there), so such a connection outlived its test;
    the next test *without* database access whose code ran in that thread (Channels'
    consumer calls ``close_old_connections`` there before each message) then met pytest-
    django's "Database access not allowed". Closing this thread's connection drops only it:
    the test database lives on in the main thread's.
    """
    yield
    if "_django_db_helper" not in request.fixturenames:  # the django_db mark, db, ...
        return
    from asgiref.sync import SyncToAsync

    executor = SyncToAsync.single_thread_executor
    if executor._threads:  # the shared thread was started
        executor.submit(_close_this_threads_connections).result(timeout=30)


def _close_this_threads_connections() -> None:
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            BaseDatabaseWrapper.close(connection)  # the in-memory SQLite one too
