"""*Outbox → Pending accepts*: the prompts accepted on commit that have not moved into the
outbox yet (docs/reference/admin.md#pending-accepts, docs/howto/transactions.md).

A plain ORM changelist over :class:`~django_outbox.models.PendingAccept`: a row is here
between its transaction's commit and its move (a moment), while its move is refused
(``waiting``, with the refusal and the next try), or after it was given up (``failed``).
Nothing is edited here. The permissions are the outbox's own (the access table,
docs/howto/access-policy.md): ``view`` to see the rows, ``retry`` for the action that
moves the selected rows now (``failed`` ones too: staff decide), ``dismiss`` to delete
them (the prompt is then never sent).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.translation import ngettext

from .. import transactional
from ..models import PendingAccept
from ..outbox import get_outbox
from ..policy import has_outbox_permission

#: Characters of a prompt's text shown in the list (the row's own page shows it whole).
TEXT_PREVIEW = 200


def _prompt(obj: PendingAccept) -> dict[str, Any]:
    try:
        prompt = json.loads(obj.payload)
    except ValueError:
        return {}
    return prompt if isinstance(prompt, dict) else {}


@admin.register(PendingAccept)
class PendingAcceptAdmin(admin.ModelAdmin):
    """Rows of accepts on commit: read-only, moved now by an action, or deleted."""

    list_display = (
        "created",
        "workspace_id",
        "session_id",
        "client_message_id",
        "prompt_user",
        "text_preview",
        "state",
        "attempts",
        "next_attempt",
        "last_error",
    )
    list_filter = ("state",)
    search_fields = ("=workspace_id", "=session_id", "=client_message_id")
    ordering = ("pk",)
    fields = (
        "workspace_id",
        "session_id",
        "client_message_id",
        "prompt_user",
        "prompt_text",
        "prompt_model",
        "prompt_options",
        "created",
        "state",
        "attempts",
        "next_attempt",
        "last_error",
    )
    readonly_fields = fields
    actions = ["move_now"]

    # -- permissions: the outbox's access table ----------------------------------------------

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_outbox_permission(request.user, "view")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # rows come from accept_on_commit only

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_outbox_permission(request.user, "dismiss")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "retry")

    # -- the prompt, from the row's payload -----------------------------------------------------

    @admin.display(description="user ID")
    def prompt_user(self, obj: PendingAccept) -> str:
        return str(_prompt(obj).get("user_id", ""))

    @admin.display(description="text")
    def prompt_text(self, obj: PendingAccept) -> str:
        return str(_prompt(obj).get("text", ""))

    @admin.display(description="text")
    def text_preview(self, obj: PendingAccept) -> str:
        text = self.prompt_text(obj)
        return text if len(text) <= TEXT_PREVIEW else text[: TEXT_PREVIEW - 1] + "\u2026"

    @admin.display(description="model")
    def prompt_model(self, obj: PendingAccept) -> str:
        model = _prompt(obj).get("model")
        return "" if model is None else json.dumps(model, ensure_ascii=False)

    @admin.display(description="options")
    def prompt_options(self, obj: PendingAccept) -> str:
        return json.dumps(_prompt(obj).get("options") or {}, ensure_ascii=False)

    # -- the action ----------------------------------------------------------------------------

    @admin.action(permissions=["retry"], description="Move selected accepts into the outbox now")
    def move_now(self, request: HttpRequest, queryset: QuerySet[PendingAccept]) -> None:
        """Move each selected row now, oldest first, whatever its state or next try (a
        ``failed`` row too: staff decide); say what became of each kind."""
        outbox = get_outbox()
        outcomes: Counter[transactional.Moved] = Counter()
        refusals: list[str] = []
        for pending in queryset.order_by("pk"):
            moved = transactional.move(outbox, pending, using=queryset.db)
            outcomes[moved.outcome] += 1
            if moved.outcome in (transactional.Moved.MOVED, transactional.Moved.ALREADY):
                self.log_change(request, pending, f"Moved into the outbox as entry {moved.detail}")
            else:
                refusals.append(f"{pending.client_message_id!r}: {moved.detail}")
        done = outcomes[transactional.Moved.MOVED] + outcomes[transactional.Moved.ALREADY]
        if done:
            self.message_user(
                request,
                ngettext(
                    "%(n)d accept moved into the outbox.",
                    "%(n)d accepts moved into the outbox.",
                    done,
                )
                % {"n": done},
                messages.SUCCESS,
            )
        if refusals:
            self.message_user(
                request,
                f"{len(refusals)} refused, and kept with the refusal: " + "; ".join(refusals),
                messages.WARNING,
            )
