"""*Outbox → Pending accepts* shows the prompt as it was written: the list's preview cut
at exactly ``TEXT_PREVIEW`` characters (characters, not bytes), and the model as text
a person reads, not JSON escapes (docs/reference/admin.md#pending-accepts)."""

from __future__ import annotations

import html

import pytest
from django.db import transaction

from django_outbox.admin.pending import TEXT_PREVIEW
from django_outbox.models import PendingAccept
from tests.support.admin import login, staff
from tests.support.helpers import QUICK_PASSWORD_HASHERS, SES, WS
from tests.support.valkey import free_port

pytestmark = pytest.mark.django_db(transaction=True)

PENDING = "/admin/django_outbox/pendingaccept/"


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


def left_pending(make_outbox, key: str, text: str, **options) -> PendingAccept:
    """A row accepted on commit whose move is refused (its Valkey is not there): it stays."""
    down = make_outbox(url=f"redis://127.0.0.1:{free_port()}/0")
    with transaction.atomic():
        down.accept_on_commit(WS, SES, user_id="u", client_message_id=key, text=text, **options)
    return PendingAccept.objects.get(client_message_id=key)


def test_the_list_shows_a_prompt_of_exactly_the_preview_length_whole(
    django_user_model, make_outbox
):
    exact = "é" * (TEXT_PREVIEW - 1) + "Z"  # 200 characters, 400 bytes in UTF-8
    longer = "ü" * TEXT_PREVIEW + "Q"
    left_pending(make_outbox, "exact", exact)
    left_pending(make_outbox, "longer", longer)

    page = login(staff(django_user_model, "view_outboxentry")).get(PENDING)

    shown = html.unescape(page.content.decode())
    assert exact in shown and exact[:-1] + "\u2026" not in shown
    assert "ü" * (TEXT_PREVIEW - 1) + "\u2026" in shown and longer not in shown


def test_a_rows_page_shows_the_model_as_written(django_user_model, make_outbox):
    model = {"providerID": "anbieter", "modelID": "größer-modell"}
    row = left_pending(make_outbox, "k1", "hello", model=model)

    page = login(staff(django_user_model, "view_outboxentry")).get(f"{PENDING}{row.pk}/change/")

    assert page.status_code == 200
    shown = html.unescape(page.content.decode())
    assert '"modelID": "größer-modell"' in shown
    assert "\\u00f6" not in shown
