"""Signals fired by the outbox. Receivers get ``entry`` (an :class:`~django_outbox.Entry`),
``workspace_id``, ``session_id``, ``version`` (the session's version after the
change) and ``state`` (the queue-UI state, README "Live updates (WebSocket)").

- ``entry_staged``: an entry left the queue to be delivered (state ``delivering``).
- ``entry_delivered``: an entry was confirmed delivered — by the deliverer
  returning, the verifier, or the ledger sweep. Fires exactly once per entry
  across all workers: only the call whose script removed the entry fires it.
- ``entry_updated``: every state change, accept and dismissal included.

Receivers run in the process that made the change (an API process or a
worker); an exception in a receiver is logged and does not undo the change.
"""

from django.dispatch import Signal

entry_staged = Signal()
entry_delivered = Signal()
entry_updated = Signal()
