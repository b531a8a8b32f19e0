"""``manage.py outbox_prune_receipts``: delete delivery receipts older than ``DEDUPE_TTL``.

See docs/reference/signals.md. The worker prunes in small batches by itself; this command
is for a cron job, or for a project whose workers are seldom up.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from django_outbox import receipts


class Command(BaseCommand):
    help = (
        "Delete DeliveryReceipt rows (receipts of once=True entry_delivered receivers) older "
        "than DEDUPE_TTL, in batches."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            type=float,
            default=None,
            help="age in seconds (default DEDUPE_TTL)",
        )
        parser.add_argument(
            "--batch",
            type=int,
            default=receipts.PRUNE_BATCH,
            help=f"rows deleted per statement (default {receipts.PRUNE_BATCH})",
        )
        parser.add_argument(
            "--max-batches",
            type=int,
            default=1000,
            help="stop after this many batches (default 1000); run again for the rest",
        )

    def handle(self, *args, **options):
        older_than, batch, max_batches = (
            options["older_than"],
            options["batch"],
            options["max_batches"],
        )
        # A NaN, an infinity or 1e308 parses as a float but is no age: refused here with
        # the rule receipts.prune applies, never a traceback from timedelta.
        for flag, args in (("--older-than", (older_than or 0, 1)), ("--batch", (0, batch))):
            try:
                receipts.check_prune_args(*args)
            except ValueError as exc:
                raise CommandError(f"{flag}: {exc}") from exc
        if max_batches < 1:
            raise CommandError("--max-batches must be at least 1")
        total = 0
        for _ in range(max_batches):
            deleted = receipts.prune(older_than, batch)
            total += deleted
            if deleted < batch:
                break
        self.stdout.write(f"pruned {total} delivery receipts")
