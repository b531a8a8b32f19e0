"""The admin never loads whole entry texts where a preview or a count serves (README
"Admin", "Security"): a changelist page and an entry-ID search move previews, the park
and cleanup confirmations counts; only the entry page reads a whole entry."""

from __future__ import annotations

import pytest
from django.contrib.admin.utils import quote
from django.test import Client
from django.urls import reverse

from django_outbox.outbox import get_outbox

pytestmark = [pytest.mark.django_db, pytest.mark.standalone]

CHANGELIST = "/admin/django_outbox/outboxentry/"
BIG = 90_000


@pytest.fixture
def admin_client(django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_superuser("root", password=None))
    return client


@pytest.fixture
def big_entries():
    outbox = get_outbox()
    return [
        outbox.accept("ws", f"s{i}", user_id="u", client_message_id="k", text=f"{i}" * BIG)
        for i in range(3)
    ]


def sent_by_valkey(r, read) -> tuple[object, int]:
    before = r.info("stats")["total_net_output_bytes"]
    result = read()
    return result, r.info("stats")["total_net_output_bytes"] - before


def test_a_changelist_page_moves_previews_not_texts(r, admin_client, big_entries):
    response, sent = sent_by_valkey(r, lambda: admin_client.get(CHANGELIST + "?status=all"))
    assert response.status_code == 200
    html = response.content.decode()
    for i in range(3):
        assert f"{i}" * 120 + "…" in html and f"{i}" * 121 not in html
    assert sent < 20_000, f"{sent} bytes read for a page of 3 entries"


def test_an_entry_id_search_moves_no_texts(r, admin_client, big_entries):
    wanted = big_entries[1]
    response, sent = sent_by_valkey(
        r, lambda: admin_client.get(CHANGELIST, {"q": f"ws/{wanted.id}", "status": "all"})
    )
    assert response.status_code == 200
    assert wanted.id in response.content.decode()
    assert sent < 20_000, f"{sent} bytes read to find one entry"


def test_the_confirmations_count(r, admin_client, big_entries):
    for action in ("park_workspaces", "cleanup_workspaces"):
        response, sent = sent_by_valkey(
            r, lambda a=action: admin_client.post(CHANGELIST, {"action": a, "workspace": ["ws"]})
        )
        assert response.status_code == 200 and b"ws" in response.content
        assert sent < 5_000, f"{action}: {sent} bytes"


def test_the_entry_page_shows_the_whole_text(admin_client, big_entries):
    ref = f"ws/s0/{big_entries[0].id}"
    url = reverse("admin:django_outbox_outboxentry_change", args=[quote(ref)])
    assert "0" * BIG in admin_client.get(url).content.decode()
