"""The app's models: an unmanaged placeholder for the admin (docs/reference/admin.md), the
receipts of opted-in ``entry_delivered`` receivers (docs/reference/signals.md) and the
prompts accepted inside a database transaction (docs/howto/transactions.md).

The outbox's data lives in Valkey, not in the database. Two tables stand beside it:
:class:`DeliveryReceipt`, a row per (delivery, opted-in receiver) that ran, written in
the receiver's own transaction, and :class:`PendingAccept`, a row per prompt accepted
with ``accept_on_commit`` that has not moved into the outbox yet. :class:`OutboxEntry`
has no table; it exists so the admin gets a content type, real permissions
and :class:`~django.contrib.admin.models.LogEntry` rows. The permissions are
what the default access policy and the admin check (``django_outbox.policy``,
docs/howto/access-policy.md): view, add (accept a prompt), retry, dismiss, and the
workspace-wide park and cleanup. An instance is never
saved: its primary key names an outbox object, ``"<ws>/<ses>/<entry id>"`` for
an entry or ``"<ws>"`` for a workspace (identifiers never contain ``/``).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils import timezone


class OutboxEntry(models.Model):
    """A reference to an entry (or a workspace) stored in Valkey; never saved."""

    ref = models.CharField(
        "reference",
        primary_key=True,
        max_length=400,
        editable=False,
        help_text="<workspace>/<session>/<entry id>, or a workspace ID.",
    )

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("view_outboxentry", "Can view outbox entries"),
            ("add_outboxentry", "Can accept prompts into the outbox"),
            ("retry_outboxentry", "Can retry outbox entries"),
            ("dismiss_outboxentry", "Can dismiss outbox entries"),
            ("park_workspace", "Can park and unpark outbox workspaces"),
            ("cleanup_workspace", "Can delete an outbox workspace's data"),
        ]
        verbose_name = "outbox entry"
        verbose_name_plural = "outbox entries"

    def __str__(self) -> str:
        parts = self.ref.split("/")
        if len(parts) == 3:
            return f"entry {parts[2]} of {parts[0]}/{parts[1]}"
        return f"workspace {self.ref}"

    @classmethod
    def for_entry(cls, workspace_id: str, session_id: str, entry_id: str) -> OutboxEntry:
        return cls(ref=f"{workspace_id}/{session_id}/{entry_id}")

    @classmethod
    def for_workspace(cls, workspace_id: str) -> OutboxEntry:
        return cls(ref=workspace_id)


class DeliveryReceipt(models.Model):
    """An opted-in ``entry_delivered`` receiver ran for one delivery, and committed.

    Written in the same ``transaction.atomic()`` as the receiver's own writes by
    :mod:`django_outbox.receipts`; the unique constraint on ``(entry_id,
    delivered_at, receiver)`` is what makes a replayed signal skip the receiver.
    ``entry_id`` and ``delivered_at`` are the entry's ``id`` and ``delivered_at``
    (RFC 3339, as on :class:`~django_outbox.Entry`), ``receiver`` the receiver's
    dotted name, ``created`` when the row was written: rows older than
    ``DEDUPE_TTL`` are pruned (``manage.py outbox_prune_receipts``, and by the worker).
    """

    entry_id = models.CharField(max_length=128)
    delivered_at = models.CharField(max_length=40)
    receiver = models.CharField(max_length=255)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["entry_id", "delivered_at", "receiver"],
                name="django_outbox_receipt_once",
            )
        ]
        verbose_name = "delivery receipt"
        verbose_name_plural = "delivery receipts"

    def __str__(self) -> str:
        return f"{self.receiver} ran for {self.entry_id} delivered at {self.delivered_at}"


class OutboxDashboard(OutboxEntry):
    """The admin index's link to the outbox dashboard (docs/howto/observe.md#the-dashboard):
    a proxy with no table, no rows and no permissions of its own (the dashboard asks for
    view)."""

    class Meta:
        proxy = True
        default_permissions = ()
        verbose_name = "outbox dashboard"
        verbose_name_plural = "outbox dashboard"


class PendingAccept(models.Model):
    """A prompt accepted with ``Outbox.accept_on_commit``, written in the caller's
    transaction, that has not moved into the outbox yet (docs/howto/transactions.md).

    Another connection sees the row only once that transaction commits; a rollback (of
    the transaction, or of the savepoint the row was written in) takes it away. The move
    (:mod:`django_outbox.transactional`) accepts the prompt into Valkey and deletes the
    row: right after the commit, or by any worker's duty when the process died first.
    ``payload`` is the prompt as JSON (``user_id``, ``text``, ``model``, ``options``; its
    escapes let any text, NUL included, fit every database's text column).
    ``created`` and ``next_attempt`` come from the database's clock; ``created`` is the
    call's time, from which an ``expires_after`` counts (measured at the move on that
    same clock). A refused move keeps
    the row ``waiting`` with the refusal in ``last_error`` and ``attempts`` counted, tried
    again at ``next_attempt``; ``failed`` rows were given up (refused for good, or not
    moved within ``DEDUPE_TTL`` of ``created``) and wait for staff (the admin's *Pending
    accepts*). No permissions of its own: the admin asks the outbox's (view, retry,
    dismiss; docs/howto/access-policy.md).
    """

    class State(models.TextChoices):
        WAITING = "waiting", "waiting for its move"
        FAILED = "failed", "failed: staff decide"

    workspace_id = models.CharField("workspace", max_length=128)
    session_id = models.CharField("session", max_length=128)
    client_message_id = models.CharField("clientMessageID", max_length=128)
    payload = models.TextField(help_text="The prompt as JSON: user_id, text, model, options.")
    created = models.DateTimeField(db_default=Now(), db_index=True)
    state = models.CharField(max_length=8, choices=State.choices, default=State.WAITING)
    attempts = models.PositiveIntegerField(
        default=0, help_text="Moves refused so far (a move that succeeds deletes the row)."
    )
    next_attempt = models.DateTimeField(db_default=Now())
    last_error = models.TextField(
        "last refusal", blank=True, default="", help_text="Why the last move was refused."
    )

    class Meta:
        default_permissions = ()
        indexes = [models.Index(fields=["state", "next_attempt"], name="django_outbox_pending_due")]
        verbose_name = "pending accept"
        verbose_name_plural = "pending accepts"

    def __str__(self) -> str:
        return (
            f"{self.client_message_id!r} for {self.workspace_id}/{self.session_id} ({self.state})"
        )
