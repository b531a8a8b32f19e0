"""Helpers of the admin tests: staff users with outbox permissions and their logged-in
clients, changelist links and actions, and outbox states made the way a worker makes them
(a failed step, a held lease, a seeded entry)."""

from __future__ import annotations

import asyncio
import html
import re
import time

from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from django_outbox.core.entry import Entry, format_time
from django_outbox.models import OutboxEntry

CHANGELIST = "/admin/django_outbox/outboxentry/"


def detail_url(ref: str) -> str:
    return reverse("admin:django_outbox_outboxentry_change", args=[quote(ref)])


def accept(outbox, ws: str, ses: str, text: str = "hello", cmid: str | None = None) -> Entry:
    return outbox.accept(ws, ses, user_id="u1", client_message_id=cmid or text[:40], text=text)


def fail_once(outbox, ws: str, ses: str, error: str = "boom") -> None:
    """One delivery step whose deliverer fails (an outbox with MAX_ATTEMPTS 1 -> error)."""

    async def deliver(entry, **kwargs):
        raise RuntimeError(error)

    async def run():
        try:
            assert await outbox.adeliver_once(ws, ses, deliverer=deliver)
        finally:
            await outbox.aclose()

    asyncio.run(run())


def hold_lease(outbox, ws: str, ses: str, token: str = "tok0123456789") -> Entry:
    """Claim the session's head as a worker would: it is staged under a live lease."""

    async def run():
        try:
            return await outbox._arun(outbox._claim_plan(ws, ses, token))
        finally:
            await outbox.aclose()

    kind, entry, _ = asyncio.run(run())
    assert kind == "deliver"
    return entry


def seed(outbox, ws: str, ses: str, entry_id: str, **state) -> Entry:
    entry = Entry(
        id=entry_id,
        client_message_id=f"c-{entry_id}",
        user_id="u1",
        text=state.pop("text", "seeded"),
        accepted_at=format_time(int(time.time() * 1_000_000)),
        **state,
    )
    outbox.seed_entry_for_test(ws, ses, entry.to_json())
    return entry


def staff(django_user_model, *codenames: str, staff: bool = True):
    user = django_user_model.objects.create_user(
        username=f"op-{len(codenames)}-{staff}-{'-'.join(codenames)}"[:150],
        password="pw",
        is_staff=staff,
    )
    ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
    user.user_permissions.add(
        *Permission.objects.filter(content_type=ct, codename__in=list(codenames))
    )
    return user


def login(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def texts(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def page_link(response, rel: str) -> str | None:
    """The paginator's ``rel`` link ("next": after the last session shown; "prev":
    before the first), or None when the page has none."""
    match = re.search(rf'<a href="([^"]+)" rel="{rel}"', response.content.decode())
    return html.unescape(match.group(1)) if match else None


def post_action(client, action: str, refs=(), workspaces=(), **extra):
    data = {"action": action, "_selected_action": list(refs), "workspace": list(workspaces)}
    data.update(extra)
    return client.post(CHANGELIST, data, follow=True)


ALL_PERMS = (
    "view_outboxentry",
    "retry_outboxentry",
    "dismiss_outboxentry",
    "park_workspace",
    "cleanup_workspace",
)
