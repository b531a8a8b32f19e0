"""OUTBOX settings: defaults, validation, late reading (README "Settings")."""

import ast
import dataclasses
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_outbox import conf, get_outbox
from django_outbox.conf import CALLABLE_KEYS, OWN_SETTINGS, outbox_settings
from django_outbox.core.config import MAX_HISTORY_WINDOW, Config, declared, kinds
from django_outbox.core.rules import min_snapshot_frame_bytes
from django_outbox.delivery.opencode import OpencodeSettings
from tests.support.paths import ROOT


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


def test_a_timedelta_counts_its_days_and_fractions_of_a_second():
    """A ``timedelta`` is its whole length (docs/reference/settings.md: durations are
    seconds or a timedelta), not the seconds-of-the-day part ``timedelta.seconds`` holds."""
    ttl = timedelta(days=2, seconds=1, milliseconds=500)
    with override_settings(OUTBOX={"DEDUPE_TTL": ttl, "LOCK_TTL": timedelta(milliseconds=7500)}):
        config = outbox_settings().config
    assert (config.dedupe_ttl, config.lock_ttl) == (172_801.5, 7.5)


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
        # The second rule of each kind, on the path fewer settings take.
        ({"LOCK_TTL": True}, "'LOCK_TTL'] must be a number of seconds"),
        ({"LOCK_TTL": float("nan")}, "'LOCK_TTL'] must be a finite, non-negative"),
        ({"LOCK_TTL": 10**400}, "'LOCK_TTL'] must be a finite, non-negative"),
        ({"CAP": None}, "'CAP'] must be an integer >= 1"),
        ({"WAIT_REPLICAS": None}, "'WAIT_REPLICAS'] must be an integer >= 0"),
        ({"KEY_PREFIX": "a[b]"}, "'KEY_PREFIX'] must not contain"),
        ({"KEY_PREFIX": "bo\u00eete"}, "'KEY_PREFIX'] must be a non-empty ASCII string"),
        ({"KEY_PREFIX": ""}, "'KEY_PREFIX'] must be a non-empty ASCII string"),
        ({"MODELS": ["   "]}, "'MODELS'] must hold"),
        ({"VALKEY_URL": "localhost:6379"}, "'VALKEY_URL'] must be a URL"),
    ],
)
def test_wrong_values_name_the_key_and_the_rule(outbox, message):
    with (
        override_settings(OUTBOX=outbox),
        pytest.raises(ImproperlyConfigured, match=message.replace("[", r"\[")),
    ):
        outbox_settings()


#: A floor or ceiling taken exactly (accepted) and one step past it (refused with its rule).
FRAME_FLOOR = min_snapshot_frame_bytes(1000)
BOUNDS = {
    "frame-floor": (
        {"MAX_TEXT_BYTES": 1000, "WS_MAX_FRAME_BYTES": FRAME_FLOOR},
        {"MAX_TEXT_BYTES": 1000, "WS_MAX_FRAME_BYTES": FRAME_FLOOR - 1},
        f"'WS_MAX_FRAME_BYTES'] must be at least {FRAME_FLOOR} bytes",
    ),
    "cap-floor": ({"CAP": 1}, {"CAP": 0}, "'CAP'] must be an integer >= 1"),
    "count-floor": ({"WAIT_REPLICAS": 0}, {"WAIT_REPLICAS": -1}, "must be an integer >= 0"),
    "backoff-floor": (
        {"RETRY_BACKOFF": 2.5, "MAX_BACKOFF": 2.5},
        {"RETRY_BACKOFF": 2.5, "MAX_BACKOFF": 2.499},
        "'MAX_BACKOFF'] must be at least RETRY_BACKOFF",
    ),
    "verify-backoff-floor": (
        {"VERIFY_BACKOFF": 2.5, "MAX_VERIFY_BACKOFF": 2.5},
        {"VERIFY_BACKOFF": 2.5, "MAX_VERIFY_BACKOFF": 2.499},
        "'MAX_VERIFY_BACKOFF'] must be at least VERIFY_BACKOFF",
    ),
    "history-ceiling": (
        {"HISTORY_WINDOW": MAX_HISTORY_WINDOW},
        {"HISTORY_WINDOW": MAX_HISTORY_WINDOW + 1},
        "'HISTORY_WINDOW'] must be at most 31 days",
    ),
    "models-count-ceiling": (
        {"MODELS": ("a/b",) * 1000},
        {"MODELS": ("a/b",) * 1001},
        "'MODELS'] must be None or a list or tuple of at most 1000 model names",
    ),
    # Characters, not UTF-8 bytes: 512 two-byte letters are 1,024 bytes and still fit.
    "model-pattern-ceiling-in-characters": (
        {"MODELS": ("\u00e9" * 512,)},
        {"MODELS": ("\u00e9" * 513,)},
        "of at most 512 characters",
    ),
}


@pytest.mark.parametrize(("at", "past", "message"), BOUNDS.values(), ids=BOUNDS.keys())
def test_a_bound_is_accepted_exactly_and_refused_one_step_past(at, past, message):
    with override_settings(OUTBOX=at):
        config = outbox_settings().config
    assert all(getattr(config, name.lower()) == value for name, value in at.items())
    with (
        override_settings(OUTBOX=past),
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


def test_a_borrowed_cache_with_several_locations_uses_its_first_the_primary():
    """django-redis reads a LOCATION list as the primary first, then its replicas: the
    outbox writes, so it takes the primary (docs/reference/settings.md, "Where the Valkey URL
    comes from")."""
    locations = ["redis://127.0.0.1:1/3", "redis://127.0.0.1:2/3"]
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "valkey": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": locations},
    }
    with override_settings(CACHES=caches, OUTBOX={"CONNECTION_ALIAS": "valkey"}):
        assert get_outbox().url == "redis://127.0.0.1:1/3"


def test_the_setting_wins_over_the_environment(valkey, monkeypatch):
    """OUTBOX_VALKEY_URL is the fallback: a project's own VALKEY_URL is used when set."""
    monkeypatch.setenv("OUTBOX_VALKEY_URL", valkey)
    with override_settings(OUTBOX={"VALKEY_URL": "redis://127.0.0.1:1/5"}):
        assert get_outbox().url == "redis://127.0.0.1:1/5"


def test_a_borrowed_cache_password_is_redacted():
    from django_outbox.core.redaction import redact

    pw = "cache-pw-" + os.urandom(6).hex()
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "valkey": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": f"redis://default:{pw}@127.0.0.1:1/3",
        },
    }
    with override_settings(CACHES=caches, OUTBOX={"CONNECTION_ALIAS": "valkey"}):
        outbox_settings()
    assert redact(f"echoed {pw} back") == "echoed *** back"


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


def test_connection_alias_reads_djangos_own_redis_cache_too():
    """CONNECTION_ALIAS reads only the cache's LOCATION (docs/reference/settings.md), so a
    project using Django's built-in RedisCache, without django-redis, works as well."""
    caches = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "valkey": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": ["redis://127.0.0.1:1/6", "redis://127.0.0.1:2/6"],
        },
    }
    with override_settings(OUTBOX={"CONNECTION_ALIAS": "valkey"}, CACHES=caches):
        assert get_outbox().url == "redis://127.0.0.1:1/6"


def test_conf_imports_nothing_it_configures():
    """conf.py sits below the outbox and the deliverers built from it (no import circle);
    it uses only the core's leaf modules for config values, credential redaction and the
    agents' value type."""
    tree = ast.parse(Path(conf.__file__).read_text())
    imported = [
        ("." * node.level) + (node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    ]
    assert sorted(m for m in imported if m.startswith(".")) == [
        ".core.agents",
        ".core.config",
        ".core.redaction",
    ]


@pytest.mark.parametrize(
    "module",
    ["django_outbox.conf", "django_outbox.outbox", "django_outbox.delivery.opencode"],
)
def test_each_settings_reader_imports_first_in_a_fresh_interpreter(module):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.support.settings.base",
    }
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr.decode()


# --- OUTBOX["OPENCODE"] --------------------------------------------------------------------------


def test_no_opencode_block_reads_as_none():
    assert outbox_settings().opencode is None


def test_the_opencode_block_is_parsed_with_its_defaults():
    block = {"BASE_URL": "http://127.0.0.1:4096/", "WORKSPACE_URLS": {"w1": "https://a:1/x/"}}
    with override_settings(OUTBOX={"DELIVERY_TIMEOUT": timedelta(minutes=2), "OPENCODE": block}):
        assert outbox_settings().opencode == OpencodeSettings(
            base_url="http://127.0.0.1:4096",
            workspace_urls={"w1": "https://a:1/x"},
            username="opencode",
            password=None,
            connect_timeout=5.0,
            timeout=120.0,  # DELIVERY_TIMEOUT unless TIMEOUT is set
            verify_timeout=30.0,
            clock_skew=2.0,
        )
    block = {
        "BASE_URL": "http://x",
        "USERNAME": "me",
        "PASSWORD": "pw",
        "CONNECT_TIMEOUT": timedelta(seconds=1),
        "TIMEOUT": 9,
        "VERIFY_TIMEOUT": 4.5,
        "CLOCK_SKEW": 0,
    }
    with override_settings(OUTBOX={"OPENCODE": block}):
        s = outbox_settings().opencode
        assert (s.username, s.password, s.connect_timeout, s.timeout) == ("me", "pw", 1.0, 9.0)
        assert (s.verify_timeout, s.clock_skew) == (4.5, 0.0)


def route_workspace(workspace_id: str) -> str | None:
    return {"w2": "http://two/"}.get(workspace_id)


async def test_opencode_urls_come_from_workspace_urls_then_base_url():
    block = {"BASE_URL": "http://base", "WORKSPACE_URLS": "tests.django.test_conf.route_workspace"}
    with override_settings(OUTBOX={"OPENCODE": block}):
        s = outbox_settings().opencode
        assert s.workspace_urls == "tests.django.test_conf.route_workspace"  # imported on first use
        assert await s.aurl_for("w2") == "http://two"
        assert await s.aurl_for("w1") == "http://base"


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ("http://x", "OUTBOX['OPENCODE'] must be a dict"),
        ({}, "'BASE_URL'] is required (or WORKSPACE_URLS)"),
        ({"BASE_URL": "ftp://x"}, "'BASE_URL'] must be an http(s) URL"),
        ({"BASE_URL": "http:/x"}, "'BASE_URL'] must be an http(s) URL"),
        ({"BASE_URL": "http://x", "PASWORD": "typo"}, "has unknown keys ['PASWORD']"),
        ({"BASE_URL": "http://x", "USERNAME": "a:b"}, "'USERNAME'] must be a non-empty string"),
        ({"BASE_URL": "http://x", "PASSWORD": 1}, "'PASSWORD'] must be a string or None"),
        ({"BASE_URL": "http://x", "TIMEOUT": 0}, "'TIMEOUT'] must be positive"),
        ({"BASE_URL": "http://x", "VERIFY_TIMEOUT": float("inf")}, "'VERIFY_TIMEOUT'] must be a"),
        ({"BASE_URL": "http://x", "CONNECT_TIMEOUT": "5"}, "'CONNECT_TIMEOUT'] must be a number"),
        ({"BASE_URL": "http://x", "CLOCK_SKEW": -1}, "'CLOCK_SKEW'] must be a finite"),
        ({"WORKSPACE_URLS": 5}, "'WORKSPACE_URLS'] must be a dict, a callable"),
        ({"WORKSPACE_URLS": {"w1": "nope"}}, "'WORKSPACE_URLS']['w1'] must be an http(s) URL"),
    ],
)
def test_a_bad_opencode_block_is_reported_by_the_settings(block, message):
    """Read with the rest of OUTBOX, so system check E001 and get_outbox() report it too."""
    with override_settings(OUTBOX={"OPENCODE": block}):
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            outbox_settings()
        with pytest.raises(ImproperlyConfigured, match=re.escape(message)):
            get_outbox()


# --- each setting declared once ----------------------------------------------------------

SETTINGS_PAGE = ROOT / "docs" / "reference" / "settings.md"
UNITS = {"s": 1, "min": 60, "h": 3600, "KiB": 1024, "MiB": 1024 * 1024}


def page_tables(text: str) -> list[list[list[str]]]:
    """The Markdown tables of ``text``: for each, its body rows as lists of cells."""
    tables: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|", 2)])
        elif rows:
            tables.append(rows[2:])  # the header and the |---| line
            rows = []
    return tables


def read_default(text: str, defaults: dict[str, object]) -> object:
    """A default as the page writes it: ``30 s``, ``10 min``, ``24 h``, ``16 MiB``,
    ``786432 (768 KiB)``, `` `False` ``, `` `"strict"` ``, `` `redis://…` ``, or the name
    of the setting whose default it takes; empty (or only a note in brackets) is None."""
    text = re.sub(r"\s*\(.*\)$", "", text)
    if not text:
        return None
    if quoted := re.fullmatch(r"`(.*)`", text):
        inner = quoted[1]
        if inner in defaults:
            return defaults[inner]
        return (
            ast.literal_eval(inner)
            if inner[:1] in "\"'" or inner in {"True", "False", "None"}
            else inner
        )
    if measured := re.fullmatch(r"(\d+) (s|min|h|KiB|MiB)", text):
        return int(measured[1]) * UNITS[measured[2]]
    assert text.isdigit(), f"cannot read the default {text!r}"
    return int(text)


def documented(rows: list[list[str]], defaults: dict[str, object]) -> dict[str, object]:
    """``{key: default}`` of a table whose rows name one or more keys and as many defaults
    (``RETRY_BACKOFF``, ``MAX_BACKOFF`` | ``10 s, 2 min``), or none for keys without one."""
    out: dict[str, object] = {}
    for keys_cell, default_cell, _doc in rows:
        keys = re.findall(r"`([A-Z_]+)`", keys_cell)
        values = default_cell.split(", ") if default_cell else [""] * len(keys)
        assert len(values) == len(keys), f"{keys_cell}: {len(keys)} keys, defaults {values}"
        out |= {key: read_default(value, defaults) for key, value in zip(keys, values, strict=True)}
    return out


def typed(values: dict[str, object]) -> dict[str, tuple[bool, object]]:
    """``False`` is not ``0``, but ``86400`` (the page) is ``86400.0`` (a duration)."""
    return {key: (isinstance(value, bool), value) for key, value in values.items()}


def test_the_settings_page_lists_every_key_with_its_declared_default():
    """The page's tables are the declarations: Config's fields and OWN_SETTINGS above, the
    OPENCODE block's fields below. The page is kept by hand (it groups related keys and
    links the pages that explain them) rather than generated at docs build time: it reads
    as Markdown anywhere, and this test fails on every run that lets it drift."""
    tunables = {name.upper(): s.default for name, s in declared(Config).items()}
    own = {key: s.default for key, s in OWN_SETTINGS.items()}
    opencode = {name.upper(): s.default for name, s in declared(OpencodeSettings).items()}
    tables = page_tables(SETTINGS_PAGE.read_text(encoding="utf-8"))
    assert len(tables) == 2, "the page has the OUTBOX table, then the OPENCODE table"
    top, block = tables
    hint = "docs/reference/settings.md and the declarations disagree"
    assert typed(documented(top, tunables)) == typed(tunables | own), hint
    # TIMEOUT's declared default is DELIVERY_TIMEOUT's, which the page names.
    assert typed(documented(block, tunables)) == typed(opencode), hint


def test_every_tunable_is_declared_with_its_rule_and_a_doc_line():
    assert list(kinds(Config)) == [f.name for f in dataclasses.fields(Config)]
    assert list(kinds(OpencodeSettings)) == [f.name for f in dataclasses.fields(OpencodeSettings)]
    declarations = [*declared(Config).values(), *declared(OpencodeSettings).values()]
    assert all(s.doc for s in [*declarations, *OWN_SETTINGS.values()])
    assert CALLABLE_KEYS == (
        "DELIVERER",
        "VERIFIER",
        "LEDGER_PROBE",
        "ABORTER",
        "ACCESS_POLICY",
        "ROUTER",
    )


def test_every_declared_default_passes_its_own_rule():
    defaults = {name: s.default for name, s in declared(Config).items()}
    assert Config.from_mapping(defaults) == Config()
    for key, s in OWN_SETTINGS.items():
        if s.kind is not None:
            assert s.kind(key, s.default) == s.default
    block = {name.upper(): s.default for name, s in declared(OpencodeSettings).items()}
    with override_settings(OUTBOX={"OPENCODE": {**block, "BASE_URL": "http://x"}}):
        assert outbox_settings().opencode == OpencodeSettings(base_url="http://x")
