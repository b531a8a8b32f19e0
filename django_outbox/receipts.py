"""Exactly-once effects for opted-in ``entry_delivered`` receivers (docs/reference/signals.md).

``entry_delivered`` fires at least once per delivery: a worker SIGKILLed after
the receivers ran and before its acknowledgement reached Valkey leaves the
signal owed, and the next claim fires it again with the same idempotency key
``(entry.id, entry.delivered_at)``. A receiver connected with ``once=True``
(:class:`~django_outbox.signals.DeliveredSignal`) runs here instead: inside
``transaction.atomic()`` together with the insert of a
:class:`~django_outbox.models.DeliveryReceipt` row keyed on that pair and the
receiver's dotted name. A replay finds the row (the unique constraint answers
``IntegrityError`` inside a savepoint) and skips the receiver; a receiver that
raises rolls back its writes and the receipt, and the signal stays owed.

Failures are counted per receiver (:data:`FAILURES`, which counts the plain receivers
of every signal too, :class:`django_outbox.outbox.Outbox`; the worker's metrics export
it as ``outbox_receiver_failures_total``) and logged at ERROR each time.
:func:`prune` deletes receipts older than ``DEDUPE_TTL`` in bounded batches;
every worker of the Django outbox runs it every :data:`PRUNE_INTERVAL` seconds (the
duty :func:`pruner`), ``manage.py outbox_prune_receipts`` on demand.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from asgiref.sync import async_to_sync, iscoroutinefunction, sync_to_async
from django.db import IntegrityError, connections, router, transaction
from django.utils import timezone

from .core.duties import Duty

logger = logging.getLogger("django_outbox")

#: Seconds between two prune passes of a worker.
PRUNE_INTERVAL = 600.0
#: Most receipts one prune pass (or one batch of the command) deletes.
PRUNE_BATCH = 1000
#: Oldest age :func:`prune` takes, in seconds (100 years): beyond it the cutoff date
#: would fall outside what a ``datetime`` holds.
MAX_PRUNE_AGE = 100 * 365 * 86_400
#: Largest batch :func:`prune` takes (one ``DELETE ... WHERE id IN (...)``).
MAX_PRUNE_BATCH = 100_000
#: Longest ``receiver`` value stored; longer dotted names are cut and suffixed with a hash.
MAX_NAME = 255

#: Calls of the outbox's signal receivers that raised in this process, plain and opted-in
#: alike, by (signal name, receiver's dotted name): ``FAILURES["entry_delivered", name]``.
FAILURES: Counter[tuple[str, str]] = Counter()
#: Failed firings per (entry ID, deliveredAt, receiver) in this process, for the log.
_per_delivery: dict[tuple[str, str, str], int] = {}
_PER_DELIVERY_MAX = 10_000


def receiver_name(receiver: Callable[..., Any]) -> str:
    """The dotted name a receipt records for ``receiver``: ``"<module>.<qualname>"``
    (at most :data:`MAX_NAME` characters; a longer name is cut and ends in a hash of
    the whole). Renaming or moving a receiver changes its name, and a replay of an
    older delivery then runs it again."""
    module = getattr(receiver, "__module__", None) or type(receiver).__module__
    qualname = getattr(receiver, "__qualname__", None) or type(receiver).__qualname__
    name = f"{module}.{qualname}"
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]
        name = f"{name[: MAX_NAME - 17]}~{digest}"
    return name


def once(receiver: Callable[..., Any], name: str) -> Callable[..., Any]:
    """Wrap ``receiver`` so that it runs at most once per delivery, atomically with its
    receipt (see the module docstring). The wrapper is async when ``receiver`` is; it
    carries ``outbox_once = name``. Raises what the receiver raised (after the rollback)."""
    if iscoroutinefunction(receiver):

        async def run_async(signal: Any, sender: Any, **kwargs: Any) -> Any:
            # The transaction belongs to the thread that runs the ORM for this event
            # loop (thread_sensitive); the receiver's own sync_to_async calls land in
            # that same thread, inside the transaction, while it waits for them.
            def call() -> Any:
                return async_to_sync(receiver)(signal=signal, sender=sender, **kwargs)

            return await sync_to_async(_fire, thread_sensitive=True)(call, name, kwargs)

        run_async.outbox_once = name  # type: ignore[attr-defined]
        return run_async

    def run(signal: Any, sender: Any, **kwargs: Any) -> Any:
        return _fire(lambda: receiver(signal=signal, sender=sender, **kwargs), name, kwargs)

    run.outbox_once = name  # type: ignore[attr-defined]
    return run


def _fire(call: Callable[[], Any], name: str, kwargs: dict[str, Any]) -> Any:
    from .models import DeliveryReceipt

    entry = kwargs["entry"]
    key = (entry.id, entry.delivered_at or "", name)
    using = router.db_for_write(DeliveryReceipt)
    connection = connections[using]
    if not connection.in_atomic_block:
        # A worker has no request cycle to close a connection the database dropped.
        connection.close_if_unusable_or_obsolete()
    try:
        with transaction.atomic(using=using):
            try:
                with transaction.atomic(using=using):
                    DeliveryReceipt.objects.using(using).create(
                        entry_id=key[0], delivered_at=key[1], receiver=name
                    )
            except IntegrityError:
                logger.info(
                    "outbox: %s already ran for %s delivered at %s; skipped", name, *key[:2]
                )
                return None
            result = call()
    except Exception:
        _count_failure(key)
        raise
    _per_delivery.pop(key, None)
    return result


def _count_failure(key: tuple[str, str, str]) -> None:
    entry_id, delivered_at, name = key
    FAILURES["entry_delivered", name] += 1
    if key not in _per_delivery and len(_per_delivery) >= _PER_DELIVERY_MAX:
        _per_delivery.pop(next(iter(_per_delivery)))
    n = _per_delivery[key] = _per_delivery.get(key, 0) + 1
    logger.error(
        "outbox: once receiver %s failed for entry %s delivered at %s (%d time(s) in this "
        "process); its writes and receipt were rolled back and entry_delivered stays owed: "
        "the session's next claim fires it again, after LOCK_TTL, and its later messages wait",
        name,
        entry_id,
        delivered_at,
        n,
        exc_info=True,
    )


def is_once(receiver: Any) -> bool:
    """Whether ``receiver`` (as a signal's ``send_robust`` returns it) is an opted-in wrapper."""
    return getattr(receiver, "outbox_once", None) is not None


# -- pruning ---------------------------------------------------------------------------------


def check_prune_args(older_than: object, batch: object) -> None:
    """Raise ``ValueError`` unless ``older_than`` is a finite number of seconds from 0 to
    :data:`MAX_PRUNE_AGE` and ``batch`` a whole number from 1 to :data:`MAX_PRUNE_BATCH`
    (:func:`prune` and ``manage.py outbox_prune_receipts`` share this rule)."""
    if (
        isinstance(older_than, bool)
        or not isinstance(older_than, (int, float))
        # a NaN fails every comparison, an infinity the upper bound
        or not 0 <= older_than <= MAX_PRUNE_AGE
    ):
        raise ValueError(
            f"older_than must be a finite number of seconds from 0 to {MAX_PRUNE_AGE} (100 years)"
        )
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= MAX_PRUNE_BATCH:
        raise ValueError(f"batch must be a whole number from 1 to {MAX_PRUNE_BATCH}")


def prune(older_than: float | None = None, batch: int = PRUNE_BATCH) -> int:
    """Delete up to ``batch`` receipts created more than ``older_than`` seconds ago
    (default ``DEDUPE_TTL``), oldest first; return how many were deleted. Raises
    ``ValueError`` for an age that is not a finite number from 0 to :data:`MAX_PRUNE_AGE`
    (NaN, infinity, negative, ``1e308``) or a batch not from 1 to :data:`MAX_PRUNE_BATCH`,
    and what the database raises (docs/reference/commands.md#outbox_prune_receipts)."""
    from .conf import outbox_settings
    from .models import DeliveryReceipt

    if older_than is None:
        older_than = outbox_settings().config.dedupe_ttl
    check_prune_args(older_than, batch)
    cutoff = timezone.now() - timedelta(seconds=older_than)
    using = router.db_for_write(DeliveryReceipt)
    rows = DeliveryReceipt.objects.using(using)
    # The IDs first: not every database takes a LIMIT inside DELETE ... WHERE id IN (...).
    ids = list(
        rows.filter(created__lt=cutoff).order_by("created").values_list("pk", flat=True)[:batch]
    )
    if not ids:
        return 0
    deleted, _ = rows.filter(pk__in=ids).delete()
    return deleted


def pruner(wanted: Callable[[], Any], interval: float = PRUNE_INTERVAL) -> Duty:
    """The worker duty (:class:`~django_outbox.core.duties.Duty`) that deletes one
    :func:`prune` batch every ``interval`` seconds, the first one after the start, while
    ``wanted()`` is truthy (the Django outbox passes ``entry_delivered.once_receivers``:
    no opted-in receiver here, no receipts written, no pass). It runs in a ``once`` run
    too. A failed pass is logged by the worker and tried again at the next interval."""

    async def run() -> None:
        if not wanted():
            return
        deleted = await sync_to_async(prune, thread_sensitive=True)()
        if deleted:
            logger.info("outbox: pruned %d delivery receipts older than DEDUPE_TTL", deleted)

    return Duty("pruning delivery receipts", interval, run, burst=True)


def skip_owed(entry_id: str, delivered_at: str, names: list[str]) -> list[str]:
    """Record a receipt for each opted-in receiver of ``names`` that has none for the
    delivery ``(entry_id, delivered_at)``, without running it: the next firing of the owed
    ``entry_delivered`` skips them (as a replay does) and the session goes on. Returns the
    names recorded now. What staff do for a receiver that keeps failing on one entry
    (``manage.py outbox owed --skip``; docs/reference/signals.md#a-receiver-that-keeps-failing).
    Raises what the database raises."""
    from .models import DeliveryReceipt

    using = router.db_for_write(DeliveryReceipt)
    recorded = []
    for name in names:
        try:
            with transaction.atomic(using=using):
                DeliveryReceipt.objects.using(using).create(
                    entry_id=entry_id, delivered_at=delivered_at, receiver=name
                )
        except IntegrityError:
            continue  # it ran (or was skipped) already
        recorded.append(name)
        logger.warning(
            "outbox: once receiver %s skipped by staff for entry %s delivered at %s",
            name,
            entry_id,
            delivered_at,
        )
    return recorded
