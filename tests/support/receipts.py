"""Delivery receipts for the pruning tests (tests/django/test_receipts.py,
test_owed_bookkeeping.py)."""

from __future__ import annotations

from datetime import timedelta


def receipts_aged(ages: list[float]) -> None:
    """Store one receipt per age (seconds before now), entry IDs ``e0``, ``e1``, ..."""
    from django.utils import timezone

    from django_outbox.models import DeliveryReceipt

    now = timezone.now()
    DeliveryReceipt.objects.bulk_create(
        DeliveryReceipt(
            entry_id=f"e{i}",
            delivered_at="2026-01-01T00:00:00.000000Z",
            receiver="r",
            created=now - timedelta(seconds=age),
        )
        for i, age in enumerate(ages)
    )
