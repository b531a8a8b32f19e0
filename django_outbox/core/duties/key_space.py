"""The key space watch: a running worker confirms its key space's claim every
``claim_recheck`` seconds (``CLAIM_RECHECK``, 2 s), so another project's ``outbox claim
--force`` stops it within about that long (docs/howto/valkey.md#taking-a-key-space-over).
The claim itself is :mod:`~django_outbox.core.owner`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..errors import KeySpaceClaimed
from . import Duty


class KeySpaceOutbox(Protocol):
    """What the key space watch uses of the outbox."""

    claim_recheck: float

    async def aclaim_key_space(self, *, force: bool = False) -> Any: ...


def key_space_watch(outbox: KeySpaceOutbox, lost: Callable[[KeySpaceClaimed], None]) -> Duty:
    """Confirm the claim (``aclaim_key_space``: one GET while it is this project's) one
    ``claim_recheck`` after the start, then every ``claim_recheck`` seconds, in a ``once``
    run too; on finding another project's claim, call ``lost`` with the
    :class:`~django_outbox.core.errors.KeySpaceClaimed` (the worker stops at once). A read
    that fails (Valkey briefly unavailable) is logged as a pass's failure and the next
    pass tries again: an outage is not a takeover."""

    async def confirm() -> None:
        try:
            await outbox.aclaim_key_space()
        except KeySpaceClaimed as exc:
            lost(exc)

    return Duty("key space watch", outbox.claim_recheck, confirm, burst=True)
