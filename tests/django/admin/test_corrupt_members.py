"""A corrupt member of a global index or of a workspace's session SET (not UTF-8, not
``"<ws> <ses>"``, an ID that breaks the allow-list), written to Valkey by hand or by
another program, is skipped, counted and logged by every read behind the dashboard, the
changelist, search and ``manage.py outbox status`` — never a 500
(docs/reference/admin.md#corrupt-index-members)."""

from __future__ import annotations

import io
import logging

import httpx
import pytest
import redis
from django.conf import settings as django_settings
from django.core.management import call_command

from django_outbox.core import paging
from tests.support.admin import ALL_PERMS, staff
from tests.support.helpers import SES, WS, accept

pytestmark = pytest.mark.django_db(transaction=True)

#: Members that are no ``"<ws> <ses>"`` of two valid IDs, as raw bytes.
PAIRS = [b"\xff\xfe \xff", b"bad ws! s1", b"w1 bad ses!", b"w1 \xc3", b" s1"]
#: Members that are no valid workspace or session ID.
IDS = [b"\xff\xfe", b"bad id!", b"", b"a\x1b[2J"]

URLS = [
    "/admin/django_outbox/outboxentry/dashboard/",
    f"/admin/django_outbox/outboxentry/dashboard/?workspace={WS}",
    "/admin/django_outbox/outboxentry/",
    "/admin/django_outbox/outboxentry/?attention=1",
    f"/admin/django_outbox/outboxentry/?q={WS}",
    f"/admin/django_outbox/outboxentry/?q={WS}/{SES}",
    f"/admin/django_outbox/outboxentry/?q={SES}",
]


def corrupt(outbox, valkey: str) -> None:
    """Write every corrupt member beside the good ones, with a plain client."""
    raw = redis.Redis.from_url(valkey)
    keys = outbox.keys
    for name in ("attention", "allsessions"):
        raw.zadd(keys.index(name, keys.shard_of(WS)), {m: 1 for m in PAIRS})
    raw.zadd(keys.index("wsdue", keys.shard_of(WS)), {m: 1 for m in IDS if m})
    raw.sadd(keys.index("workspaces", keys.shard_of(WS)), *IDS)
    raw.sadd(keys.sessions(WS), *IDS)
    raw.zadd(keys.due(WS), {m: 1 for m in IDS if m})
    raw.close()


def test_no_page_of_a_live_server_fails_on_a_corrupt_member(
    live_server, outbox, valkey, django_user_model, caplog
):
    entry = accept(outbox, "a")
    outbox.park_workspace(WS, "maintenance")  # the session needs attention
    corrupt(outbox, valkey)
    user = staff(django_user_model, *ALL_PERMS)
    from django.test import Client

    client = Client()
    client.force_login(user)
    cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    before = getattr(paging, "corrupt_members_skipped", 0)
    with (
        caplog.at_level(logging.WARNING, logger="django_outbox"),
        httpx.Client(
            base_url=live_server.url,
            cookies={django_settings.SESSION_COOKIE_NAME: cookie},
            timeout=30,
        ) as http,
    ):
        for url in URLS:
            response = http.get(url)
            assert response.status_code == 200, (url, response.text[-2000:])
        # The good session is still shown where it belongs.
        page = http.get(URLS[0]).text
        assert f"?q={WS}%2F{SES}" in page and "Nothing needs attention" not in page
        for url in URLS[2:]:
            assert f'value="{WS}/{SES}/{entry.id}"' in http.get(url).text, url
    assert paging.corrupt_members_skipped > before
    assert any("corrupt member" in r.getMessage() for r in caplog.records)


def test_status_and_inspect_skip_a_corrupt_member(outbox, valkey):
    accept(outbox, "a")
    corrupt(outbox, valkey)
    out = io.StringIO()
    call_command("outbox", "status", stdout=out)
    assert "Entries: pending 1" in out.getvalue()
    out = io.StringIO()
    call_command("outbox", "inspect", WS, stdout=out)
    assert f"  {SES}: 1 entries" in out.getvalue()
    assert outbox.workspaces() == [WS]
    assert outbox.search(WS).sessions == [(WS, SES)]
