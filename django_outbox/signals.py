"""Signals fired by the outbox (docs/reference/signals.md). Receivers get ``entry`` (an
:class:`~django_outbox.Entry`), ``workspace_id``, ``session_id``, ``version`` (the
session's version after the change) and ``state`` (the queue-UI state, docs/reference/websocket.md).

- ``entry_staged``: an entry left the queue to be delivered (state ``delivering``).
- ``entry_delivered``: an entry was confirmed delivered — by the deliverer
  returning, the verifier, or the ledger sweep. Fires *at least once* per
  delivery, never lost: a worker killed after the receivers ran and before its
  acknowledgement reached Valkey leaves the signal owed, and the next claim of
  the session fires it again with the same idempotency key
  ``(entry.id, entry.delivered_at)``. Its receivers also get ``agent_ref``: the agent's
  own reference to the delivery (``entry.agent_ref``, e.g. LangGraph's ``{"threadID",
  "runID"}``; None when the agent gave none). A receiver connected with ``once=True``
  (``entry_delivered.connect(fn, once=True)`` or
  ``@receiver(entry_delivered, once=True)``) has exactly-once *effects* in the
  Django database: it runs inside ``transaction.atomic()`` with the insert of a
  :class:`~django_outbox.models.DeliveryReceipt`, and a replay skips it.
- ``entry_updated``: every state change, accept and dismissal included.

Receivers run in the process that made the change (an API process or a worker),
each one whatever the others do (``send_robust``). In a worker, the database
connections they will use are first closed if the server dropped them or they are
older than ``CONN_MAX_AGE``, as Django does at the start of a request. Every receiver
that raises is logged at ERROR on the ``django_outbox`` logger with its dotted name and
counted (``outbox_receiver_failures_total{signal,receiver}``, and in the worker's
summary). An exception in a plain
receiver does not undo the change. An exception in a ``once=True``
receiver of ``entry_delivered`` rolls back its writes and its receipt, and the
signal stays owed: the session's next claim (after ``LOCK_TTL``) fires it again —
to every receiver; the plain ones run again (at least once), the opted-in ones that
already committed are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from . import receipts


def _once_uid(name: str) -> tuple[str, str]:
    return ("django_outbox.once", name)


class DeliveredSignal(Signal):
    """The class of ``entry_delivered``: a :class:`django.dispatch.Signal` whose
    :meth:`connect` takes ``once=True`` (see the module docstring)."""

    def connect(
        self,
        receiver: Callable[..., Any],
        sender: Any = None,
        weak: bool = True,
        dispatch_uid: Any = None,
        once: bool = False,
    ) -> None:
        """Connect ``receiver`` as :meth:`Signal.connect` does; with ``once=True`` it runs
        at most once per delivery, in a transaction with its receipt, keyed on
        ``(entry.id, entry.delivered_at)`` and its dotted name
        (:func:`~django_outbox.receipts.receiver_name`). An opted-in receiver is held
        strongly (``weak`` is ignored) and may be sync or async. Connecting the same
        function twice keeps one registration, as without ``once``. Cost: one insert
        per delivery per opted-in receiver."""
        if not once:
            super().connect(receiver, sender, weak, dispatch_uid)
            return
        name = receipts.receiver_name(receiver)
        wrapper = receipts.once(receiver, name)
        super().connect(wrapper, sender, weak=False, dispatch_uid=dispatch_uid or _once_uid(name))

    def disconnect(
        self,
        receiver: Callable[..., Any] | None = None,
        sender: Any = None,
        dispatch_uid: Any = None,
    ) -> bool:
        """Disconnect as :meth:`Signal.disconnect` does, opted-in receivers included
        (by the function passed to :meth:`connect`). Returns True if one was removed."""
        if super().disconnect(receiver, sender, dispatch_uid):
            return True
        if receiver is None or dispatch_uid is not None:
            return False
        return super().disconnect(None, sender, _once_uid(receipts.receiver_name(receiver)))

    def once_receivers(self) -> list[str]:
        """Dotted names of the opted-in receivers connected now."""
        with self.lock:  # opted-in wrappers are held strongly: no weak reference to follow
            refs = [ref for _key, ref, *_rest in self.receivers]
        return [ref.outbox_once for ref in refs if receipts.is_once(ref)]


entry_staged = Signal()
entry_delivered = DeliveredSignal()
entry_updated = Signal()
