"""OUTBOX settings: defaults, validation, late reading (README "Settings")."""

import ast
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox import conf, get_outbox
from django_outbox.conf import outbox_settings

ROOT = Path(__file__).resolve().parent.parent


def test_defaults_follow_the_design():
    config = outbox_settings().config
    assert (config.max_attempts, config.cap, config.ordering) == (5, 25, "strict")
    assert (config.dedupe_ttl, config.delivery_timeout, config.lock_ttl) == (86400, 600, 30)
    assert (config.retry_backoff, config.max_backoff) == (10, 120)
    assert (config.verify_delay, config.verify_backoff, config.max_verify_backoff) == (3, 3, 120)
    assert (config.max_verify_attempts, config.max_transient_failures) == (40, 20)
    assert (config.parked_sweep_interval, config.max_text_bytes) == (60, 102_400)
    assert (config.concurrency, config.tick, config.wait_replicas, config.wait_aof) == (
        64,
        1,
        0,
        False,
    )
    assert outbox_settings().access_policy == "django_outbox.policy.staff_only"


def test_durations_take_timedelta_and_settings_are_reread():
    with override_settings(OUTBOX={"LOCK_TTL": timedelta(seconds=7), "CAP": 3}):
        assert outbox_settings().config.lock_ttl == 7.0
        assert get_outbox().config.cap == 3
    assert outbox_settings().config.lock_ttl == 30.0
    assert get_outbox().config.cap == 25


@pytest.mark.parametrize(
    ("outbox", "message"),
    [
        ({"LOCK_TTL": 0}, "'LOCK_TTL'] must be positive"),
        ({"LOCK_TTL": -1}, "'LOCK_TTL'] must be a finite, non-negative"),
        ({"LOCK_TTL": "30"}, "'LOCK_TTL'] must be a number of seconds"),
        ({"CAP": 0}, "'CAP'] must be an integer >= 1"),
        ({"CAP": True}, "'CAP'] must be an integer >= 1"),
        ({"ORDERING": "fifo"}, "'ORDERING'] must be 'strict' or 'due'"),
        ({"MAX_BACKOFF": 1}, "'MAX_BACKOFF'] must be at least RETRY_BACKOFF"),
        ({"WAIT_AOF": "yes"}, "'WAIT_AOF'] must be True or False"),
        ({"WAIT_REPLICAS": -1}, "'WAIT_REPLICAS'] must be an integer >= 0"),
        ({"KEY_PREFIX": "a{b"}, "'KEY_PREFIX'] must not contain"),
        ({"LOCK_TLL": 5}, "'LOCK_TLL'] is not a known setting"),
        ({"CLUSTER": "no"}, "'CLUSTER'] must be True or False"),
        ({"DELIVERER": 42}, "'DELIVERER'] must be a callable or a dotted path"),
        ({"VALKEY_URL": "localhost"}, "'VALKEY_URL'] must be a URL"),
        ({"CONNECTION_ALIAS": "nope"}, "'CONNECTION_ALIAS'] names cache 'nope'"),
    ],
)
def test_wrong_values_name_the_key_and_the_rule(outbox, message):
    with (
        override_settings(OUTBOX=outbox),
        pytest.raises(ImproperlyConfigured, match=message.replace("[", r"\[")),
    ):
        outbox_settings()


def test_cluster_settings_reach_the_outbox():
    with override_settings(OUTBOX={"CLUSTER": True, "CLUSTER_SHARDS": 4}):
        outbox = get_outbox()
        assert outbox.cluster is True
        assert outbox.keys.shards == 4
        assert outbox.keys.index_keys("wsdue") == [f"outboxwsdue:{{s{k}}}" for k in range(4)]
    with override_settings(OUTBOX={"CLUSTER_SHARDS": 0}):
        with pytest.raises(ImproperlyConfigured, match="'CLUSTER_SHARDS'] must be an integer"):
            outbox_settings()


def test_dotted_paths_are_resolved_and_checked():
    with override_settings(OUTBOX={"DELIVERER": "django_outbox.policy.staff_only"}):
        assert callable(get_outbox().deliverer)
    with override_settings(OUTBOX={"DELIVERER": "django_outbox.nope.deliver"}):
        with pytest.raises(ImproperlyConfigured, match="cannot be imported"):
            get_outbox()
    with override_settings(OUTBOX={"VERIFIER": "django_outbox.policy.ACTIONS"}):
        with pytest.raises(ImproperlyConfigured, match="must be callable"):
            get_outbox()


def test_connection_alias_borrows_a_cache_location():
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "valkey": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "redis://127.0.0.1:1/3"},
    }
    with override_settings(CACHES=caches, OUTBOX={"CONNECTION_ALIAS": "valkey"}):
        assert get_outbox().url == "redis://127.0.0.1:1/3"


def test_get_outbox_is_shared_and_uses_the_env_url(valkey):
    assert get_outbox() is get_outbox()
    assert get_outbox().url == valkey


def test_the_opencode_block_is_accepted():
    outbox = {
        "DELIVERER": "django_outbox.delivery.opencode.deliver",
        "VERIFIER": "django_outbox.delivery.opencode.verify",
        "OPENCODE": {"BASE_URL": "http://127.0.0.1:4096"},
    }
    with override_settings(OUTBOX=outbox):
        assert callable(get_outbox().deliverer) and callable(get_outbox().verifier)


def test_reset_makes_the_next_read_see_the_environment(monkeypatch):
    before = outbox_settings()
    assert outbox_settings() is before
    monkeypatch.setenv("OUTBOX_VALKEY_URL", "redis://127.0.0.1:1/5")
    assert outbox_settings().valkey_url != "redis://127.0.0.1:1/5"  # still the cached object
    conf.reset()
    assert outbox_settings() is not before
    assert outbox_settings().valkey_url == "redis://127.0.0.1:1/5"


def test_a_caches_change_alone_rebuilds_the_outbox():
    def caches(location):
        return {
            "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
            "valkey": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": location},
        }

    with override_settings(OUTBOX={"CONNECTION_ALIAS": "valkey"}):
        with override_settings(CACHES=caches("redis://127.0.0.1:1/3")):
            assert get_outbox().url == "redis://127.0.0.1:1/3"
        with override_settings(CACHES=caches("redis://127.0.0.1:1/4")):
            assert get_outbox().url == "redis://127.0.0.1:1/4"


def test_conf_imports_nothing_it_configures():
    """conf.py sits below the outbox and the deliverers built from it (no import circle)."""
    tree = ast.parse(Path(conf.__file__).read_text())
    imported = [
        ("." * node.level) + (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    ]
    assert [m for m in imported if m.startswith(".")] == [".core.config"]


@pytest.mark.parametrize(
    "module",
    ["django_outbox.conf", "django_outbox.outbox", "django_outbox.delivery.opencode"],
)
def test_each_settings_reader_imports_first_in_a_fresh_interpreter(module):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()
