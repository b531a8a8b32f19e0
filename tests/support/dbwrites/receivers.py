"""``entry_delivered`` receivers that each write one :class:`~tests.support.dbwrites.models.Write`
row per call, through the ORM, under their own name (connected by
:class:`~tests.support.dbwrites.apps.DbWritesConfig`):

- :func:`write`: plain and sync (the case of a long-lived worker's stale connection);
- :func:`awrite`: plain and async (its ORM call runs in the event loop's ORM thread);
- :func:`write_once`: ``once=True`` (its row commits with its delivery receipt).
"""

from .models import Write


def write(sender, entry, **kwargs):
    Write.objects.create(receiver="write", entry_id=entry.id)


async def awrite(sender, entry, **kwargs):
    await Write.objects.acreate(receiver="awrite", entry_id=entry.id)


def write_once(sender, entry, **kwargs):
    Write.objects.create(receiver="write_once", entry_id=entry.id)
