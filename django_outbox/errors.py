"""The outbox's exceptions (see :mod:`django_outbox.core.errors`).

``InvalidContent`` (a ``ValueError``) is what ``accept`` raises for text, model or
key that break a rule (HTTP 400); its subclass ``ContentTooLarge`` is for text
over ``MAX_TEXT_BYTES`` or a model over 16 KiB (HTTP 413).
"""

from .core.errors import (
    AgentMisconfigured,
    AmbiguousError,
    ContentTooLarge,
    CutNotSupported,
    Duplicate,
    HoldDeliveryError,
    IdempotencyConflict,
    InvalidContent,
    InvalidIdentifier,
    KeySpaceClaimed,
    KeySpaceTakenOver,
    MergeNotSupported,
    ModelNotAllowed,
    NotSupported,
    OutboxError,
    OutboxFull,
    OutboxUnavailable,
    PriorAttemptPendingError,
    RateLimited,
    ServerUnsupported,
    SessionBusy,
    TransientDeliveryError,
)

__all__ = [
    "AgentMisconfigured",
    "AmbiguousError",
    "ContentTooLarge",
    "CutNotSupported",
    "Duplicate",
    "HoldDeliveryError",
    "IdempotencyConflict",
    "InvalidContent",
    "InvalidIdentifier",
    "KeySpaceClaimed",
    "KeySpaceTakenOver",
    "MergeNotSupported",
    "ModelNotAllowed",
    "NotSupported",
    "OutboxError",
    "OutboxFull",
    "OutboxUnavailable",
    "PriorAttemptPendingError",
    "RateLimited",
    "ServerUnsupported",
    "SessionBusy",
    "TransientDeliveryError",
]
