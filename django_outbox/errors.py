"""The outbox's exceptions (see :mod:`django_outbox.core.errors`).

``ContentTooLarge`` is the ``ValueError`` that ``accept`` raises for text over
``MAX_TEXT_BYTES`` or a model over 16 KiB (HTTP 413).
"""

from .core.entry import ContentTooLarge
from .core.errors import (
    AmbiguousError,
    Duplicate,
    IdempotencyConflict,
    InvalidIdentifier,
    OutboxError,
    OutboxFull,
    OutboxUnavailable,
    PriorAttemptPendingError,
    TransientDeliveryError,
)

__all__ = [
    "AmbiguousError",
    "ContentTooLarge",
    "Duplicate",
    "IdempotencyConflict",
    "InvalidIdentifier",
    "OutboxError",
    "OutboxFull",
    "OutboxUnavailable",
    "PriorAttemptPendingError",
    "TransientDeliveryError",
]
