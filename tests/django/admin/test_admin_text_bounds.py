"""The changelist's text at its bounds: a prompt of exactly ``TEXT_PREVIEW_CHARS``
characters (non-ASCII: characters, not bytes) is shown whole, one more is cut with an
ellipsis; ages and "seen ago" change unit exactly at a minute, an hour and a day
(docs/reference/admin.md)."""

from __future__ import annotations

import pytest

from django_outbox.admin.changelist import TEXT_PREVIEW_CHARS, duration
from tests.support.admin import CHANGELIST, accept
from tests.support.helpers import QUICK_PASSWORD_HASHERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


def test_a_text_of_exactly_the_preview_length_is_shown_whole(admin_client, outbox):
    exact = "ß" * (TEXT_PREVIEW_CHARS - 1) + "!"
    longer = "ö" * (TEXT_PREVIEW_CHARS + 1)
    accept(outbox, "ws", "s1", exact, cmid="exact")
    accept(outbox, "ws", "s2", longer, cmid="longer")

    rows = admin_client.get(CHANGELIST, {"status": "all"}).context["rows"]

    shown = {row.session_id: row.text for row in rows}
    assert shown == {"s1": exact, "s2": "ö" * TEXT_PREVIEW_CHARS + "\u2026"}


@pytest.mark.parametrize(
    "seconds, said",
    [
        (59.9, "59 s"),
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h 0 min"),
        (86399, "23 h 59 min"),
        (86400, "1 d 0 h"),
        (-5, "0 s"),
    ],
)
def test_a_duration_changes_unit_exactly_at_its_bound(seconds, said):
    assert duration(seconds) == said
