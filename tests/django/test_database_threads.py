"""A test's database connections do not outlive it in asgiref's shared thread.

Async code reaches the ORM through ``sync_to_async(thread_sensitive=True)``, which outside
any ``async_to_sync`` runs in one thread for the whole test run (the worker's on-commit
mover, receipts, Channels' consumer). Django never closes an in-memory SQLite connection,
so a connection a database test opened there would meet the next test that runs Django code
in that thread without database access: Channels' consumer calls
``close_old_connections`` there before each message, which then asks the blocked database
("Database access not allowed"). ``tests/conftest.py`` closes it after each database test;
these two run in this order.
"""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group
from django.db import close_old_connections


@pytest.mark.django_db(transaction=True)
async def test_a_database_test_reads_through_the_shared_thread():
    assert await sync_to_async(Group.objects.count, thread_sensitive=True)() == 0


async def test_the_next_test_without_database_access_finds_that_thread_clean():
    await sync_to_async(close_old_connections, thread_sensitive=True)()
