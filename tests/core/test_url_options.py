"""A Valkey URL's timeouts as the outbox reads them are the ones redis-py connects with
(docs/howto/valkey.md, "Timeouts in the URL"): a query that repeats ``socket_timeout``
means its first value to redis-py, so the outbox's read timeout (which every blocking
wait must stay under) and its connect timeout mean the first value too."""

from __future__ import annotations

import pytest

from django_outbox.core.service import Outbox


@pytest.mark.standalone  # a plain client's pool
def test_a_repeated_socket_timeout_means_its_first_value_as_to_redis_py(valkey):
    url = f"{valkey}?socket_timeout=0.3&socket_timeout=30"
    outbox = Outbox(url)
    try:
        used = outbox.client.connection_pool.connection_kwargs
        assert used["socket_timeout"] == 0.3  # redis-py's own reading
        assert outbox.read_timeout == used["socket_timeout"]
        assert used["socket_connect_timeout"] == 0.3
    finally:
        outbox.close()


@pytest.mark.standalone  # a plain client's pool
def test_a_connect_timeout_given_as_a_client_option_is_kept(valkey):
    """A URL that sets only ``socket_timeout`` connects as long as a read may take,
    unless the project gave ``socket_connect_timeout`` itself: then that one holds."""
    url = f"{valkey}?socket_timeout=30"
    given = Outbox(url, client_options={"socket_connect_timeout": 0.7})
    plain = Outbox(url)
    try:
        used = given.client.connection_pool.connection_kwargs
        assert (used["socket_timeout"], used["socket_connect_timeout"]) == (30.0, 0.7)
        assert given.read_timeout == 30.0
        used = plain.client.connection_pool.connection_kwargs
        assert (used["socket_timeout"], used["socket_connect_timeout"]) == (30.0, 30.0)
    finally:
        given.close()
        plain.close()
