"""System checks: each ID fires when it should and only then (README "System checks")."""

import pytest
import redis
from django.core import checks
from django.test import override_settings

from tests.support.valkey import ValkeyProcess, free_port

GOOD = {
    "DELIVERER": "tests.support.agents.deliver",
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
}
#: A default cache shared by every process (never touched by the checks), as a deployment's
#: is: Django's own default, LocMemCache, draws W017 under --deploy.
SHARED_CACHE = {
    "default": {"BACKEND": "django.core.cache.backends.db.DatabaseCache", "LOCATION": "t"}
}


def ids(deploy=False, **kwargs):
    return sorted(
        m.id for m in checks.run_checks(tags=["outbox"], include_deployment_checks=deploy)
    )


def test_a_good_setup_passes(valkey):
    with override_settings(OUTBOX=GOOD):
        assert ids() == []


def test_default_policy_and_no_deliverer_warn():
    assert ids() == ["django_outbox.W001", "django_outbox.W002"]


def test_invalid_settings_are_an_error():
    with override_settings(OUTBOX={"CAP": 0}):
        messages = checks.run_checks(tags=["outbox"])
    assert [m.id for m in messages] == ["django_outbox.E001"]
    assert "'CAP'] must be an integer >= 1" in messages[0].msg


@pytest.mark.parametrize("value", ["tests.nope.deliver", "django_outbox.policy.ACTIONS"])
def test_callables_must_import_and_be_callable(value):
    with override_settings(OUTBOX={**GOOD, "VERIFIER": value}):
        assert "django_outbox.E002" in ids()


def test_unreachable_valkey(monkeypatch):
    monkeypatch.setenv("OUTBOX_VALKEY_URL", f"redis://127.0.0.1:{free_port()}/0")
    with override_settings(OUTBOX=GOOD):
        assert ids() == ["django_outbox.W005"]


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-lru"])
def test_evicting_valkey_is_an_error(valkey, r, policy):
    r.config_set("maxmemory-policy", policy)
    try:
        with override_settings(OUTBOX=GOOD):
            messages = checks.run_checks(tags=["outbox"])
        assert [m.id for m in messages] == ["django_outbox.E003"]
        assert "noeviction" in messages[0].hint
    finally:
        r.config_set("maxmemory-policy", "noeviction")


def test_no_persistence_warns_under_deploy(valkey):
    # the test server runs with appendonly no and no save points
    with override_settings(OUTBOX=GOOD, CACHES=SHARED_CACHE):
        assert ids() == []
        assert ids(deploy=True) == ["django_outbox.W003"]


def test_snapshots_alone_are_persistence_enough(valkey, r):
    """W003 is for a server that persists nothing: RDB save points without an AOF keep
    the queue across a restart (docs/reference/checks.md)."""
    r.config_set("save", "3600 1")
    try:
        with override_settings(OUTBOX=GOOD, CACHES=SHARED_CACHE):
            assert ids(deploy=True) == []
    finally:
        r.config_set("save", "")


@pytest.mark.parametrize(
    ("version", "warned"), [("7.1.2", True), ("7.2.0", False), ("7.4.1", False), ("6.4.0", True)]
)
def test_the_cluster_client_warning_compares_major_and_minor(monkeypatch, version, warned):
    """W006 names redis-py older than 7.2 with CLUSTER on: 7.4 is newer, 7.1 is not
    (the check runs even while Valkey is unreachable, which W005 says)."""
    monkeypatch.setattr(redis, "__version__", version)
    unreachable = f"redis://127.0.0.1:{free_port()}/0"
    with override_settings(OUTBOX={**GOOD, "CLUSTER": True, "VALKEY_URL": unreachable}):
        found = ids()
    assert ("django_outbox.W006" in found) is warned
    assert "django_outbox.W005" in found


def test_appendfsync_no_warns_under_deploy(tmp_path, monkeypatch):
    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="no").start()
    monkeypatch.setenv("OUTBOX_VALKEY_URL", server.url)
    try:
        with override_settings(OUTBOX=GOOD, CACHES=SHARED_CACHE):
            assert ids(deploy=True) == ["django_outbox.W004"]
        client = redis.Redis.from_url(server.url)
        client.config_set("appendfsync", "everysec")
        client.close()
        with override_settings(OUTBOX=GOOD, CACHES=SHARED_CACHE):
            assert ids(deploy=True) == []
    finally:
        server.stop()


def test_routed_consumer_without_channel_layer_is_an_error(valkey):
    with override_settings(
        OUTBOX=GOOD, ASGI_APPLICATION="tests.support.asgi.with_consumer.application"
    ):
        assert ids() == ["django_outbox.E004"]
    layers = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    with override_settings(
        OUTBOX=GOOD,
        ASGI_APPLICATION="tests.support.asgi.with_consumer.application",
        CHANNEL_LAYERS=layers,
    ):
        assert ids() == []


def test_wait_aof_without_an_aof_is_an_error(valkey, tmp_path, monkeypatch):
    # The test server runs with appendonly no: WAITAOF could never be acknowledged.
    with override_settings(OUTBOX={**GOOD, "WAIT_AOF": True}):
        messages = checks.run_checks(tags=["outbox"])
    assert [m.id for m in messages] == ["django_outbox.E005"]
    assert "appendonly no" in messages[0].msg
    server = ValkeyProcess(tmp_path, appendonly="yes", appendfsync="no").start()
    monkeypatch.setenv("OUTBOX_VALKEY_URL", server.url)
    try:
        with override_settings(OUTBOX={**GOOD, "WAIT_AOF": True}):
            assert ids() == ["django_outbox.E005"]
        with override_settings(OUTBOX=GOOD):
            assert ids() == []
    finally:
        server.stop()


@pytest.mark.cluster
def test_on_a_cluster_every_primary_is_checked(cluster_node_url, monkeypatch):
    monkeypatch.setenv("OUTBOX_VALKEY_URL", cluster_node_url)
    node = redis.Redis.from_url(cluster_node_url)
    node.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with override_settings(OUTBOX={**GOOD, "CLUSTER": True}):
            monkeypatch.setattr(redis, "__version__", "8.1.0")
            messages = checks.run_checks(tags=["outbox"])
            assert [m.id for m in messages] == ["django_outbox.E003"]
            assert f"127.0.0.1:{node.connection_pool.connection_kwargs['port']}" in messages[0].msg
            monkeypatch.setattr(redis, "__version__", "5.3.1")
            assert ids() == ["django_outbox.E003", "django_outbox.W006"]
    finally:
        node.config_set("maxmemory-policy", "noeviction")
        node.close()


def test_environment_url_overridden_by_settings_warns(valkey, monkeypatch):
    # Settings win over OUTBOX_VALKEY_URL (README "Settings"); a disagreement is said.
    other = f"redis://127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("OUTBOX_VALKEY_URL", other)
    with override_settings(OUTBOX={**GOOD, "VALKEY_URL": valkey}):
        messages = checks.run_checks(tags=["outbox"])
    assert [m.id for m in messages] == ["django_outbox.W010"]
    assert other in messages[0].msg and valkey in messages[0].msg


def test_environment_url_equal_to_settings_is_quiet(valkey, monkeypatch):
    monkeypatch.setenv("OUTBOX_VALKEY_URL", valkey + "/")
    with override_settings(OUTBOX={**GOOD, "VALKEY_URL": valkey}):
        assert ids() == []


def test_evicting_valkey_hint_says_how_to_migrate_meanwhile(valkey, r):
    # E003 stays an error; its hint names the overrides (migrate --skip-checks, silencing)
    # and that the worker keeps refusing.
    r.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with override_settings(OUTBOX=GOOD):
            (message,) = checks.run_checks(tags=["outbox"])
    finally:
        r.config_set("maxmemory-policy", "noeviction")
    assert "migrate --skip-checks" in message.hint
    assert "SILENCED_SYSTEM_CHECKS" in message.hint and "--allow-eviction" in message.hint


@pytest.mark.parametrize(
    "value, rule",
    [
        ("anthropic/*", "must be None or a list or tuple"),
        ([""], "non-blank printable strings"),
        (["anthropic/*", 3], "non-blank printable strings"),
        (["a\x1b[2J"], "non-blank printable strings"),
    ],
)
def test_a_bad_model_allow_list_is_an_error(value, rule):
    with override_settings(OUTBOX={"MODELS": value}):
        messages = checks.run_checks(tags=["outbox"])
    assert [m.id for m in messages] == ["django_outbox.E001"]
    assert "'MODELS']" in messages[0].msg and rule in messages[0].msg


def test_a_cache_that_counts_nothing_leaves_users_unbounded_over_workspaces():
    dummy = {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
    with override_settings(CACHES=dummy):
        assert "django_outbox.W014" in ids()
        with override_settings(OUTBOX={"USER_ACCEPTS_PER_MINUTE_ALL": 0}):
            assert "django_outbox.W014" not in ids()
    assert "django_outbox.W014" not in ids()  # the default LocMemCache counts per process


@pytest.mark.parametrize(
    "lock_ttl, warned",
    [(1, True), (3, True), (7.4, True), (7.5, False), (30, False)],
)
def test_a_lease_shorter_than_a_workers_stall_warns(valkey, lock_ttl, warned):
    """Renewed every LOCK_TTL / 3, a lease outlives a stall of two thirds of it: under 5 s
    of that (LOCK_TTL below 7.5 s) a loaded host loses leases mid-delivery
    (docs/explanation/ordering.md#leases)."""
    with override_settings(OUTBOX={**GOOD, "LOCK_TTL": lock_ttl}):
        messages = checks.run_checks(tags=["outbox"])
    assert [m.id for m in messages] == (["django_outbox.W015"] if warned else [])
    if warned:
        (message,) = messages
        assert message.level == checks.WARNING
        assert f"OUTBOX['LOCK_TTL'] is {lock_ttl:g} s" in message.msg
        assert "7.5 s or more" in message.hint and "ordering.md#leases" in message.hint


def test_a_lease_check_leaves_invalid_settings_to_e001():
    with override_settings(OUTBOX={**GOOD, "LOCK_TTL": -1}):
        assert ids() == ["django_outbox.E001"]


def test_max_holds_is_no_longer_read_and_says_so(valkey):
    """Holds end by time held (HOLD_MAX_TOTAL): a MAX_HOLDS left in the settings would be
    silently ignored, so check says it is (docs/howto/agents.md#held-retry-after)."""
    with override_settings(OUTBOX={**GOOD, "MAX_HOLDS": 5}):
        messages = checks.run_checks(tags=["outbox"])
    assert [m.id for m in messages] == ["django_outbox.W016"]
    assert "HOLD_MAX_TOTAL" in messages[0].msg and messages[0].level == checks.WARNING
    with override_settings(OUTBOX={**GOOD, "HOLD_MAX_TOTAL": 60}):
        assert checks.run_checks(tags=["outbox"]) == []


@pytest.mark.parametrize(
    ("backend", "block"),
    [("opencode", "OUTBOX['OPENCODE']"), ("langgraph", "OUTBOX['LANGGRAPH']")],
)
def test_a_built_in_backend_without_its_block_is_an_error(valkey, backend, block):
    """The single DELIVERER (and VERIFIER) of a built-in backend whose block is missing is
    refused by check (and by the worker's start, which resolves the same callables), not
    found out at the first delivery."""
    single = {
        "DELIVERER": f"django_outbox.delivery.{backend}.deliver",
        "VERIFIER": f"django_outbox.delivery.{backend}.verify",
    }
    with override_settings(OUTBOX={**GOOD, **single}):
        messages = checks.run_checks(tags=["outbox"])
    errors = [m for m in messages if m.level >= checks.ERROR]
    assert [m.id for m in errors] == ["django_outbox.E002"] * 2
    assert all(block in m.msg for m in errors)


def test_a_per_process_cache_under_the_bound_over_every_workspace_warns_on_deploy(valkey):
    """Django's default cache is LocMemCache, one per process: USER_ACCEPTS_PER_MINUTE_ALL
    counted there is a bound per process (two processes: 120 of 200 through a bound of 60);
    check --deploy says so, plain check does not."""
    locmem = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(OUTBOX=GOOD, CACHES=locmem):
        deploy = [m.id for m in checks.run_checks(tags=["outbox"], include_deployment_checks=True)]
        plain = [m.id for m in checks.run_checks(tags=["outbox"])]
        with override_settings(OUTBOX={**GOOD, "USER_ACCEPTS_PER_MINUTE_ALL": 0}):
            off = checks.run_checks(tags=["outbox"], include_deployment_checks=True)
    with override_settings(OUTBOX=GOOD, CACHES=SHARED_CACHE):
        elsewhere = checks.run_checks(tags=["outbox"], include_deployment_checks=True)
    assert "django_outbox.W017" in deploy and "django_outbox.W017" not in plain
    assert "django_outbox.W017" not in [m.id for m in off + elsewhere]
