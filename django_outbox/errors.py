"""The outbox's exceptions (see :mod:`django_outbox.core.errors`)."""

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
    "Duplicate",
    "IdempotencyConflict",
    "InvalidIdentifier",
    "OutboxError",
    "OutboxFull",
    "OutboxUnavailable",
    "PriorAttemptPendingError",
    "TransientDeliveryError",
]
