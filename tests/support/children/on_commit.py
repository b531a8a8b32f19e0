"""A Django process that accepts prompts inside its database transactions, as a view would
(tests/django/test_on_commit_processes.py), with the settings tests/support/settings/on_commit.py.

Usage: python -m tests.support.children.on_commit SCENARIO [KEY ...]

Every prompt goes to workspace ``w1``, session ``s1``, user ``u``, its text ``"work on
<KEY>"``; each transaction also writes the caller's own row (an ``auth.Group`` named KEY,
"the order"). Scenarios:

* ``commit KEY``: the transaction commits.
* ``rollback KEY``: the transaction raises after the accept and rolls back.
* ``savepoint OUTER INNER``: OUTER accepted in the transaction, INNER in a savepoint that
  rolls back; the transaction commits.
* ``hang KEY``: the transaction commits; an on-commit callback registered before the
  accept's prints ``committed`` and hangs, so the process dies (SIGKILL from the test)
  between the commit and the move into Valkey.
* ``race``: read every waiting row, meet the other racer at a Valkey barrier
  (``test:barrier``, two arrivals), then move each row; prints each move's outcome.
* ``move``: move every waiting row now; prints each move's outcome.
* ``admin``: prints the admin's *Pending accepts* page as a superuser sees it.

``OUTBOX_TEST_TEXT_JSON`` (a JSON string) replaces the text, ``OUTBOX_TEST_OPTIONS_JSON`` (a
JSON object) gives accept's options (``{"expires_after": 5}``).
"""

from __future__ import annotations

import json
import os
import sys
import time

import django
import redis

django.setup()

from django.contrib.auth.models import Group, User  # noqa: E402
from django.db import transaction  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

from django_outbox import transactional  # noqa: E402
from django_outbox.models import PendingAccept  # noqa: E402
from django_outbox.outbox import get_outbox  # noqa: E402

WS, SES = "w1", "s1"


class Rollback(Exception):
    """Raised to roll a transaction back."""


def accept(key: str) -> None:
    Group.objects.create(name=key)
    text = os.environ.get("OUTBOX_TEST_TEXT_JSON")
    options = json.loads(os.environ.get("OUTBOX_TEST_OPTIONS_JSON", "{}"))
    get_outbox().accept_on_commit(
        WS,
        SES,
        user_id="u",
        client_message_id=key,
        text=json.loads(text) if text else f"work on {key}",
        **options,
    )


def hang() -> None:
    print("committed", flush=True)
    while True:
        time.sleep(60)


def race() -> None:
    rows = list(PendingAccept.objects.filter(state=PendingAccept.State.WAITING).order_by("pk"))
    barrier = redis.Redis.from_url(os.environ["OUTBOX_VALKEY_URL"])
    barrier.incr("test:barrier")
    deadline = time.monotonic() + 30
    while int(barrier.get("test:barrier") or 0) < 2:
        if time.monotonic() > deadline:
            sys.exit("the other racer never came")
        time.sleep(0.001)
    for row in rows:
        print(transactional.move(get_outbox(), row, using="default").outcome.value, flush=True)


def move() -> None:
    rows = PendingAccept.objects.filter(state=PendingAccept.State.WAITING).order_by("pk")
    for row in rows:
        print(transactional.move(get_outbox(), row, using="default").outcome.value, flush=True)


def admin() -> None:
    setup_test_environment()
    user, _ = User.objects.get_or_create(
        username="staff", defaults={"is_staff": True, "is_superuser": True}
    )
    client = Client()
    client.force_login(user)
    page = client.get("/admin/django_outbox/pendingaccept/")
    print(page.status_code)
    print(page.content.decode())


def main(scenario: str, *keys: str) -> None:
    if scenario == "commit":
        with transaction.atomic():
            accept(keys[0])
    elif scenario == "rollback":
        try:
            with transaction.atomic():
                accept(keys[0])
                raise Rollback
        except Rollback:
            pass
    elif scenario == "savepoint":
        with transaction.atomic():
            accept(keys[0])
            try:
                with transaction.atomic():
                    accept(keys[1])
                    raise Rollback
            except Rollback:
                pass
    elif scenario == "hang":
        with transaction.atomic():
            transaction.on_commit(hang)
            accept(keys[0])
    elif scenario == "race":
        race()
    elif scenario == "move":
        move()
    elif scenario == "admin":
        admin()
    else:
        sys.exit(f"unknown scenario {scenario!r}")


if __name__ == "__main__":
    main(*sys.argv[1:])
