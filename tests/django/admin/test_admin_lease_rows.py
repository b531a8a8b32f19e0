"""The changelist's rows around a lease: a blocked row names the entry the lease is on,
the entry in flight says it is the lease's own, and an entry staged under a lease that is
gone (orphaned) is shown under "Delivering" (docs/reference/admin.md)."""

from __future__ import annotations

import pytest

from tests.support.admin import CHANGELIST, accept, hold_lease
from tests.support.helpers import QUICK_PASSWORD_HASHERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


def rows_of(response) -> dict:
    return {row.entry.id: row for row in response.context["rows"]}


def test_a_blocked_row_names_the_entry_its_lease_is_on(admin_client, outbox):
    first = accept(outbox, "ws", "ses", "first")
    second = accept(outbox, "ws", "ses", "second")
    hold_lease(outbox, "ws", "ses", token="holder42abcdef")

    rows = rows_of(admin_client.get(CHANGELIST))

    assert rows[first.id].lease == "holder42\u2026 (this entry)"
    assert rows[second.id].lease == f"holder42\u2026 (on {first.id[:12]}\u2026)"


def test_an_orphaned_entry_is_shown_under_delivering(admin_client, outbox, r):
    first = accept(outbox, "ws", "ses", "first")
    hold_lease(outbox, "ws", "ses")
    r.delete(outbox.keys.session("ws", "ses").lock)  # the worker died; its lease expired

    rows = rows_of(admin_client.get(CHANGELIST, {"status": "delivering"}))

    assert list(rows) == [first.id] and rows[first.id].state == "orphaned"
    assert rows_of(admin_client.get(CHANGELIST, {"status": "pending"})) == {}
