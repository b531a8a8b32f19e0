"""``W018``: a channels-redis layer whose keys share the outbox's Valkey database under a
prefix that overlaps ``KEY_PREFIX`` (docs/reference/checks.md,
docs/howto/valkey.md#sharing-a-channel-layer)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from channels_redis.core import RedisChannelLayer
from django.core import checks
from django.test import override_settings

from django_outbox.outbox import get_outbox
from tests.support.helpers import accept

GOOD = {
    "DELIVERER": "tests.support.agents.deliver",
    "ACCESS_POLICY": "tests.support.policies.own_workspace",
}
REDIS = "channels_redis.core.RedisChannelLayer"


def layer(hosts, **config):
    return {"default": {"BACKEND": REDIS, "CONFIG": {"hosts": hosts, **config}}}


def w018(outbox=GOOD, **settings):
    with override_settings(OUTBOX=outbox, **settings):
        found = checks.run_checks(tags=["outbox"])
    return [m for m in found if m.id == "django_outbox.W018"]


def other_database(url: str) -> str:
    parts = urlsplit(url)
    return f"redis://{parts.hostname}:{parts.port}/{int(parts.path.strip('/') or 0) + 1}"


@pytest.mark.parametrize("prefix", ["outbox", "out", "outbox-asgi"])
def test_a_layer_whose_prefix_overlaps_the_key_prefix_on_the_same_database_warns(valkey, prefix):
    [warning] = w018(CHANNEL_LAYERS=layer([valkey], prefix=prefix))
    assert "flush()" in warning.msg and f"{prefix + '*'!r}" in warning.msg
    assert "docs/howto/valkey.md#sharing-a-channel-layer" in warning.hint


def test_every_spelling_of_the_same_server_counts(valkey):
    parts = urlsplit(valkey)
    db = int(parts.path.strip("/") or 0)
    for hosts in (
        [f"redis://localhost:{parts.port}/{db}"],
        [{"address": f"redis://{parts.hostname}:{parts.port}", "db": db}],
        [{"host": parts.hostname, "port": parts.port, "db": db}],
    ):
        assert w018(CHANNEL_LAYERS=layer(hosts, prefix="outbox")), hosts
    if db == 0:
        assert w018(CHANNEL_LAYERS=layer([(parts.hostname, parts.port)], prefix="outbox"))


def test_separate_prefixes_databases_and_layers_do_not_warn(valkey):
    assert w018(CHANNEL_LAYERS=layer([valkey])) == []  # 'asgi' beside 'outbox'
    assert w018(CHANNEL_LAYERS=layer([valkey], prefix="demo-asgi")) == []
    assert w018(CHANNEL_LAYERS=layer([other_database(valkey)], prefix="outbox")) == []
    assert w018({**GOOD, "KEY_PREFIX": "staging"}, CHANNEL_LAYERS=layer([valkey])) == []
    pubsub = layer([valkey], prefix="outbox")  # keeps no keys: nothing to flush
    pubsub["default"]["BACKEND"] = "channels_redis.pubsub.RedisPubSubChannelLayer"
    assert w018(CHANNEL_LAYERS=pubsub) == []
    memory = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    assert w018(CHANNEL_LAYERS=memory) == []


async def test_what_it_warns_of_a_flush_of_such_a_layer_deletes_the_queue(valkey):
    """The hazard itself, on real parts: a channels-redis layer with the prefix ``out`` on
    the outbox's database, flushed (as test suites and some deploy scripts do), takes the
    accepted prompts with it; with its default prefix it does not."""
    outbox = get_outbox()
    accept(outbox, "kept")
    safe = RedisChannelLayer(hosts=[valkey])
    await safe.flush()
    assert [e.text for e in outbox.list("w1", "s1")] == ["kept"]
    overlapping = RedisChannelLayer(hosts=[valkey], prefix="out")
    await overlapping.flush()
    assert outbox.list("w1", "s1") == []
    await outbox.aclose()
