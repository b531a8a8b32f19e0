"""Paging the outbox admin while its indices change (README "Admin").

A page of the changelist ends with a link to the next one that carries the position
of the last session shown (its index score and ``"<ws> <ses>"`` member); the next page
starts strictly after it. Sessions resolved, or added, before that position cannot
make paging forward skip a session that still needs attention, as an offset did.
"""

from __future__ import annotations

import time

import pytest

from django_outbox.core.entry import Entry, Status, format_time
from tests.support.admin import ALL_PERMS, login, page_link, post_action, staff
from tests.support.helpers import NO_USER_BOUNDS, QUICK_PASSWORD_HASHERS

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _quick_password_hashes(settings):
    """No test here is about password hashing: its users are made with a quick hasher."""
    settings.PASSWORD_HASHERS = QUICK_PASSWORD_HASHERS


CHANGELIST = "/admin/django_outbox/outboxentry/"


# --- helpers --------------------------------------------------------------------------


def needs_attention(outbox, ws: str, ses: str) -> Entry:
    """One entry in error in ``ws/ses``: the session enters the attention index now."""
    entry = Entry(
        id=f"e-{ses}",
        client_message_id=f"c-{ses}",
        user_id="u1",
        text=f"text of {ses}",
        accepted_at=format_time(int(time.time() * 1_000_000)),
        status=Status.ERROR,
        last_error="boom",
    )
    outbox.seed_entry_for_test(ws, ses, entry.to_json())
    return entry


def resolve(outbox, ws: str, ses: str) -> None:
    """The operator dismisses the session's entry: it leaves the attention index."""
    outbox.dismiss(ws, ses, f"e-{ses}")


def tick() -> None:
    time.sleep(0.002)  # index scores are in ms: keep them apart


def link(response, rel: str) -> str | None:
    return page_link(response, rel)


def sessions_of(response) -> list[str]:
    assert response.status_code == 200
    return [view.session_id for view in response.context["page"].sessions]


def names(first: int, stop: int) -> list[str]:
    return [f"s{i:03d}" for i in range(first, stop)]


def paginator(response) -> str:
    content = response.content.decode()
    start = content.index('<p class="paginator">\n')
    return " ".join(content[start : content.index("</p>", start)].split())


@pytest.fixture
def few(outbox, monkeypatch):
    """8 sessions of ``ws`` needing attention, s000 the oldest, 3 to a page."""
    from django_outbox.admin import OutboxEntryAdmin

    monkeypatch.setattr(OutboxEntryAdmin, "sessions_per_page", 3)
    for ses in names(0, 8):
        needs_attention(outbox, "ws", ses)
        tick()
    return outbox


@pytest.fixture
def many(outbox):
    """120 sessions of ``ws`` needing attention, s000 the oldest."""
    for ses in names(0, 120):
        needs_attention(outbox, "ws", ses)
        tick()
    return outbox


# --- the case -------------------------------------------------------------------------------


def test_resolving_sessions_on_page_one_does_not_hide_any_from_page_two(admin_client, many):
    """120 sessions need attention, page 1 is read, 10 of its sessions are
    resolved, page 2 is opened: it starts right after the last session page 1 showed."""
    outbox = many
    first = admin_client.get(CHANGELIST)
    assert sessions_of(first) == names(0, 50)

    for ses in names(10, 20):
        resolve(outbox, "ws", ses)
    second = admin_client.get(link(first, "next"))
    assert sessions_of(second) == names(50, 100)  # s050-s059 are not skipped
    third = admin_client.get(link(second, "next"))
    assert sessions_of(third) == names(100, 120)
    assert link(third, "next") is None
    assert "Sessions 91\u2013110 of 110 needing attention." in paginator(third)


def test_the_paginator_says_where_the_page_is_and_links_both_ways(admin_client, many):
    first = admin_client.get(CHANGELIST)
    text = paginator(first)
    assert "Sessions 1\u201350 of 120 needing attention." in text
    assert "First page" not in text and link(first, "prev") is None
    second = admin_client.get(link(first, "next"))
    assert "Sessions 51\u2013100 of 120" in paginator(second)
    assert "« First page" in paginator(second)
    assert sessions_of(admin_client.get(link(second, "prev"))) == names(0, 50)
    third = admin_client.get(link(second, "next"))
    assert sessions_of(admin_client.get(link(third, "prev"))) == names(50, 100)
    # The filters and the search start from the first page again.
    assert "after=" not in first.content.decode().split('id="changelist-filter"')[1]


def test_sessions_resolved_on_the_current_page_do_not_shift_the_next(admin_client, many):
    """Every session of page 2 is resolved, the last one shown included: the next page
    still starts after it, and page 2 reloaded shows what follows page 1 now."""
    outbox = many
    second = admin_client.get(link(admin_client.get(CHANGELIST), "next"))
    for ses in names(50, 100):
        resolve(outbox, "ws", ses)
    third = admin_client.get(link(second, "next"))
    assert sessions_of(third) == names(100, 120)
    assert "Sessions 51\u201370 of 70" in paginator(third)
    again = admin_client.get(link(admin_client.get(CHANGELIST), "next"))
    assert sessions_of(again) == names(100, 120)
    # Back from there: page 1 as it is now.
    assert sessions_of(admin_client.get(link(third, "prev"))) == names(0, 50)


def test_an_action_on_a_page_returns_to_that_page(django_user_model, many):
    """Dismissing the sessions of page 2 from the admin: the redirect reloads page 2 by
    its position, which now shows the sessions that followed them."""
    operator = login(staff(django_user_model, *ALL_PERMS))
    second = operator.get(link(operator.get(CHANGELIST), "next"))
    refs = [row.ref for row in second.context["rows"]]
    assert len(refs) == 50
    response = post_action(operator, "dismiss_entries", refs, next=second.context["next_url"])
    assert sessions_of(response) == names(100, 120)
    assert link(response, "next") is None and link(response, "prev") is not None


def test_going_back_past_what_was_resolved_lands_on_the_first_page(admin_client, many):
    outbox = many
    second = admin_client.get(link(admin_client.get(CHANGELIST), "next"))
    for ses in names(0, 10):
        resolve(outbox, "ws", ses)
    back = admin_client.get(link(second, "prev"))
    assert sessions_of(back) == names(10, 50)  # the 40 left before page 2
    assert link(back, "prev") is None and "First page" not in paginator(back)
    assert "Sessions 1\u201340 of 110" in paginator(back)
    for ses in names(10, 50):
        resolve(outbox, "ws", ses)
    back = admin_client.get(link(second, "prev"))  # nothing before page 2 any more
    assert sessions_of(back) == names(50, 100)


def test_sessions_added_before_the_position_are_neither_repeated_nor_skipped(
    admin_client, make_outbox
):
    """All sessions, newest first: 10 sessions accepted while page 1 is read go before
    it; page 2 continues after page 1's last session (an offset would repeat 10)."""
    outbox = make_outbox(**NO_USER_BOUNDS)  # one user opens all 130 sessions
    for i in range(120):
        outbox.accept("ws", f"s{i:03d}", user_id="u1", client_message_id="c", text="hi")
        tick()
    first = admin_client.get(CHANGELIST, {"status": "all"})
    assert sessions_of(first) == names(70, 120)[::-1]
    for i in range(10):
        outbox.accept("new", f"n{i}", user_id="u1", client_message_id="c", text="hi")
        tick()
    second = admin_client.get(link(first, "next"))
    assert sessions_of(second) == names(20, 70)[::-1]
    assert "Sessions 61\u2013110 of 130 in the outbox." in paginator(second)
    assert sessions_of(admin_client.get(link(second, "next"))) == names(0, 20)[::-1]
    back = admin_client.get(link(second, "prev"))
    assert sessions_of(back) == names(70, 120)[::-1]  # the new ones are on the first page
    assert link(back, "prev") is not None


def test_a_search_pages_by_position_too(admin_client, many, monkeypatch):
    from django_outbox.admin import OutboxEntryAdmin

    monkeypatch.setattr(OutboxEntryAdmin, "sessions_per_page", 30)
    outbox = many
    first = admin_client.get(CHANGELIST, {"q": "ws"})
    assert sessions_of(first) == names(0, 30)
    for ses in names(0, 10):
        resolve(outbox, "ws", ses)
    second = admin_client.get(link(first, "next"))
    assert sessions_of(second) == names(30, 60)
    assert "q=ws" in link(second, "next")
    assert "Sessions 21\u201350 of 110 matching the search" in paginator(second)


# --- positions that cannot be read --------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        {"after": "garbage"},
        {"after": ""},
        {"before": "1~ws~s001"},
        {"after": "nan~ws~s001~1"},
        {"after": "inf~ws~s001~1"},
        {"after": "-inf~ws~s001~1"},
        {"after": "1e999~ws~s001~1"},
        {"after": "1~ws~s001~-3"},
        {"after": "1~ws~s001~99999999999999999999"},
        {"after": "1~../../etc~s001~1"},
        {"after": "1~ws~<script>alert(1)</script>~1"},
        {"after": "1~ws~s\u202e001~1"},
        {"after": "1~ws~" + "s" * 200 + "~1"},
        {"after": "1~ws~s001~1", "before": "1~ws~s001~1"},
        {"after": "~ws~s001~1"},  # no score, outside an exact search
    ],
)
def test_an_unreadable_position_gives_the_first_page_and_says_so(admin_client, few, params):
    response = admin_client.get(CHANGELIST, params)
    assert response.status_code == 200
    assert sessions_of(response) == names(0, 3)
    assert "This page link is not valid any more; showing the first page." in (
        response.content.decode()
    )
    assert "<script>alert(1)" not in response.content.decode()


@pytest.mark.parametrize(
    "position, first",
    [
        ("0~ws~s000~1", 0),  # a score before every session's: from the first
        ("1~a~a~0", 0),  # a position before the index: from the start
        ("99999999999999~zz~zz~5", None),  # after everything: nothing
        ("1~nobody~nothing~2147483648", 0),  # a forged tie offset costs probes, not rows
    ],
)
def test_a_forged_but_readable_position_pages_from_where_it_points(
    admin_client, few, position, first
):
    response = admin_client.get(CHANGELIST, {"after": position})
    assert response.status_code == 200
    shown = sessions_of(response)
    if first is None:
        assert shown == [] and "No sessions needing attention after the last one shown" in (
            paginator(response)
        )
        assert "« First page" in paginator(response)
    else:
        assert shown[0] == f"s{first:03d}"
