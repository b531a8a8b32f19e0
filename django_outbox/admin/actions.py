"""The outbox admin's actions: retry, dismiss, cancel, Stop (cut a turn), park, unpark
and clean up.

Each is an admin action (``@admin.action``) called as ``action(modeladmin, request,
refs, workspaces)`` by ``OutboxEntryAdmin.run_action`` after a CSRF-protected POST:
``refs`` are the selected ``workspace/session/entry`` references, ``workspaces`` the
workspace IDs named directly (the workspace tools). An action changes the outbox
through its operator methods, says what happened through the messages framework
(busy apart from missing: busy is not missing), writes a ``LogEntry`` for what it
changed and returns None (back to the page) or a confirmation page.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import ngettext

from ..core.actors import staff_actor
from ..core.entry import CancelResult, DismissResult, InterruptResult, RetryResult
from ..core.errors import InvalidIdentifier
from ..core.rules import check_identifier, has_unprintable
from ..models import OutboxEntry
from ..outbox import Outbox, get_outbox
from .changelist import visible

#: The cleanup confirmation lists at most this many sessions per workspace (counts stay exact).
CLEANUP_LIST_LIMIT = 200


class ActionAdmin(Protocol):
    """What an action needs of the admin it runs in (``OutboxEntryAdmin``)."""

    def message_user(self, request: HttpRequest, message: str, level: int = ...) -> None: ...

    def page_context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]: ...


# =====================================================================================
# forms
# =====================================================================================


def _printable(value: str) -> None:
    # The character rule of check_printable_reason, which the REST API and the Python
    # API apply too (the form checks length and blankness itself).
    if has_unprintable(value):
        raise forms.ValidationError("The reason must not contain control or format characters.")


class ParkForm(forms.Form):
    """The park confirmation: the reason stored on every parked entry."""

    reason = forms.CharField(
        max_length=200,
        strip=True,
        validators=[_printable],
        help_text=(
            "Stored on every parked entry and shown here; a short code such as "
            "maintenance or mode_transition."
        ),
    )


# =====================================================================================
# selections, logs and messages
# =====================================================================================


def entry_refs(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str]
) -> list[tuple[str, str, str]]:
    """``(workspace, session, entry)`` of each valid reference; the others are reported."""
    out = []
    for ref in refs:
        parts = ref.split("/")
        try:
            if len(parts) != 3:
                raise InvalidIdentifier("entry reference", ref)
            check_identifier("workspace ID", parts[0])
            check_identifier("session ID", parts[1])
            check_identifier("entry ID", parts[2])
        except InvalidIdentifier:
            modeladmin.message_user(
                request,
                f"Ignored {visible(ref, 100)!r}: not an entry reference.",
                messages.ERROR,
            )
            continue
        out.append((parts[0], parts[1], parts[2]))
    return out


def workspace_ids(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], extra: list[str]
) -> list[str]:
    """The workspaces of ``refs`` and ``extra``, once each, in order; invalid ones reported."""
    found: list[str] = []
    for value in [r.split("/")[0] for r in refs] + extra:
        try:
            check_identifier("workspace ID", value)
        except InvalidIdentifier:
            modeladmin.message_user(
                request, f"Ignored {visible(value, 100)!r}: not a workspace ID.", messages.ERROR
            )
            continue
        if value not in found:
            found.append(value)
    return found


def _log(request: HttpRequest, objs: list[OutboxEntry], flag: int, message: str) -> None:
    if objs:
        LogEntry.objects.log_actions(request.user.pk, objs, flag, message)  # type: ignore[arg-type]


def _report(
    modeladmin: ActionAdmin, request: HttpRequest, level: int, template: str, refs: list[str]
) -> None:
    if not refs:
        return
    shown = ", ".join(refs[:10]) + (f" and {len(refs) - 10} more" if len(refs) > 10 else "")
    message = template.format(n=len(refs), entries=entries_text(len(refs)), refs=shown)
    modeladmin.message_user(request, message, level)


def entries_text(n: int) -> str:
    """``"1 entry"`` or ``"n entries"`` (translated like Django's admin messages)."""
    return ngettext("%(n)d entry", "%(n)d entries", n) % {"n": n}


def per_entry(
    modeladmin: ActionAdmin,
    request: HttpRequest,
    refs: list[str],
    call: Callable[[str, str, str], Any],
    done_result: Any,
    busy_result: Any,
    log_flag: int,
    log_message: str,
    done_message: str,
    busy_message: str,
) -> None:
    """Apply ``call(ws, ses, entry_id)`` to each selected entry, then log what changed
    and report done, busy and missing entries apart (busy is not missing)."""
    done: list[str] = []
    busy: list[str] = []
    missing: list[str] = []
    for ws, ses, entry_id in entry_refs(modeladmin, request, refs):
        result = call(ws, ses, entry_id)
        ref = f"{ws}/{ses}/{entry_id}"
        {done_result: done, busy_result: busy}.get(result, missing).append(ref)
    _log(request, [OutboxEntry(ref=r) for r in done], log_flag, log_message)
    _report(modeladmin, request, messages.SUCCESS, done_message, done)
    _report(modeladmin, request, messages.WARNING, busy_message, busy)
    _report(
        modeladmin,
        request,
        messages.ERROR,
        "Not found ({n}): {refs} — delivered, dismissed or cleaned up meanwhile.",
        missing,
    )


# =====================================================================================
# the actions
# =====================================================================================


@admin.action(description="Retry selected entries", permissions=["retry"])
def retry_entries(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> None:
    per_entry(
        modeladmin,
        request,
        refs,
        get_outbox().retry,
        RetryResult.UPDATED,
        RetryResult.BUSY,
        CHANGE,
        "Retried from the admin: re-armed (due now).",
        "Re-armed {entries}: {refs}.",
        "Busy, not retried ({n}): {refs} — being delivered or verified under a live "
        "lease, or parked (unpark the workspace instead).",
    )


@admin.action(description="Dismiss selected entries", permissions=["dismiss"])
def dismiss_entries(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> None:
    per_entry(
        modeladmin,
        request,
        refs,
        get_outbox().dismiss,
        DismissResult.REMOVED,
        DismissResult.BUSY,
        DELETION,
        "Dismissed from the admin: removed, never to be delivered.",
        "Dismissed {entries}: {refs}.",
        "Busy, not dismissed ({n}): {refs} — being delivered or verified under a live lease.",
    )


@admin.action(description="Cancel selected queued prompts", permissions=["cancel"])
def cancel_entries(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> None:
    """Cancel each selected prompt that waits in the queue (docs/howto/steering.md#cancel):
    removed, never sent, watchers see ``cancelled`` (``cancelledBy``: the staff user). One
    in flight is left alone and named (Stop cuts its turn)."""
    per_entry(
        modeladmin,
        request,
        refs,
        functools.partial(get_outbox().cancel, actor=staff_actor(request.user.pk)),
        CancelResult.REMOVED,
        CancelResult.IN_FLIGHT,
        DELETION,
        "Cancelled from the admin: removed from the queue, never sent.",
        "Cancelled {entries}, never sent: {refs}.",
        "In flight, not cancelled ({n}): {refs} — being delivered or verified; Stop cuts its turn.",
    )


#: What a Stop from the admin reports per :class:`InterruptResult` (level, message); the
#: entries cut are also logged. docs/howto/cutting.md.
CUT_MESSAGES = {
    InterruptResult.CUT: (
        messages.SUCCESS,
        "Cutting the turn of {entries}: {refs} — each ends sent (interrupted) or cancelled, "
        "as the verifier finds.",
    ),
    InterruptResult.ALREADY: (messages.INFO, "Already being cut ({n}): {refs}."),
    InterruptResult.QUEUED: (
        messages.WARNING,
        "Waiting in the queue, never sent, nothing to cut ({n}): {refs} — cancel it instead.",
    ),
    InterruptResult.IDLE: (messages.WARNING, "Not in flight, nothing to cut ({n}): {refs}."),
    InterruptResult.NOT_SUPPORTED: (
        messages.ERROR,
        "Not cut ({n}): {refs} — no aborter is configured (OUTBOX['ABORTER']), so a "
        "running turn cannot be cut.",
    ),
    InterruptResult.NOT_FOUND: (
        messages.ERROR,
        "Not found ({n}): {refs} — delivered, dismissed or cleaned up meanwhile.",
    ),
}


@admin.action(
    description="Stop: cut the turn of selected prompts in flight", permissions=["interrupt"]
)
def cut_entries(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> None:
    """Cut the running turn of each selected prompt in flight (``Outbox.cut``,
    docs/howto/cutting.md): its outcome is then verified, never guessed. Reports each
    :class:`InterruptResult` apart (``CUT_MESSAGES``) and logs the entries cut; each cut
    entry records the staff user as ``stoppedBy``."""
    found: dict[InterruptResult, list[str]] = {}
    outbox = get_outbox()
    actor = staff_actor(request.user.pk)
    for ws, ses, entry_id in entry_refs(modeladmin, request, refs):
        result = outbox.cut(ws, ses, entry_id, actor=actor)
        found.setdefault(result, []).append(f"{ws}/{ses}/{entry_id}")
    cut = found.get(InterruptResult.CUT, [])
    _log(request, [OutboxEntry(ref=r) for r in cut], CHANGE, "Stopped from the admin: turn cut.")
    for result, (level, template) in CUT_MESSAGES.items():
        _report(modeladmin, request, level, template, found.get(result, []))


def _per_workspace(
    modeladmin: ActionAdmin,
    request: HttpRequest,
    ids: list[str],
    apply: Callable[[str], int],
    verb: str,
    *,
    nothing: str,
    detail: str = "",
) -> None:
    """Run ``apply(ws) -> entries changed`` for each workspace, then write the
    ``LogEntry`` and report it (``verb``: "Parked"); ``nothing`` (with ``{ws}``) is the
    warning for a workspace where nothing changed."""
    for ws in ids:
        count = apply(ws)
        if count:
            _log(
                request,
                [OutboxEntry.for_workspace(ws)],
                CHANGE,
                f"{verb} workspace {ws} from the admin: {entries_text(count)}{detail}.",
            )
            modeladmin.message_user(
                request, f"{verb} {entries_text(count)} of workspace {ws}.", messages.SUCCESS
            )
        else:
            modeladmin.message_user(request, nothing.format(ws=ws), messages.WARNING)


def park_message(workspace_id: str, reason: str, parked: int) -> str:
    """What parking ``workspace_id`` with ``reason`` did, ``parked`` entries held: the
    workspace is paused whether or not anything was queued (docs/reference/admin.md)."""
    held = (
        f"{entries_text(parked)} parked"
        if parked
        else "no entry was pending, verifying or delivering"
    )
    return (
        f"Parked workspace {workspace_id} with reason {reason!r}: {held}; prompts accepted "
        "into it are held until it is unparked."
    )


@admin.action(description="Park the workspaces of selected entries…", permissions=["park"])
def park_workspaces(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> HttpResponse | None:
    ids = workspace_ids(modeladmin, request, refs, workspaces)
    if not ids:
        return None
    form = ParkForm(request.POST if request.POST.get("post") == "yes" else None)
    outbox = get_outbox()
    if form.is_bound and form.is_valid():
        reason = form.cleaned_data["reason"]
        for ws in ids:
            said = park_message(ws, reason, outbox.park_workspace(ws, reason))
            _log(request, [OutboxEntry.for_workspace(ws)], CHANGE, f"From the admin: {said}")
            modeladmin.message_user(request, said, messages.SUCCESS)
        return None
    context = modeladmin.page_context(
        request,
        "Park workspaces",
        form=form,
        workspaces=list(zip(ids, outbox.session_counts(ids), strict=True)),
        refs=refs,
        extra_workspaces=workspaces,
        next_url=request.POST.get("next", ""),
    )
    return TemplateResponse(request, "django_outbox/admin/park_workspace.html", context)


@admin.action(description="Unpark the workspaces of selected entries", permissions=["park"])
def unpark_workspaces(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> None:
    _per_workspace(
        modeladmin,
        request,
        workspace_ids(modeladmin, request, refs, workspaces),
        get_outbox().unpark_workspace,
        "Unparked",
        nothing="Nothing to unpark in workspace {ws}.",
    )


@admin.action(
    description="Delete all outbox data of the selected entries' workspaces…",
    permissions=["cleanup"],
)
def cleanup_workspaces(
    modeladmin: ActionAdmin, request: HttpRequest, refs: list[str], workspaces: list[str]
) -> HttpResponse | None:
    ids = workspace_ids(modeladmin, request, refs, workspaces)
    if not ids:
        return None
    outbox = get_outbox()
    if request.POST.get("post") == "yes":
        for ws in ids:
            removed = outbox.cleanup_workspace(ws)
            if removed:
                _log(
                    request,
                    [OutboxEntry.for_workspace(ws)],
                    DELETION,
                    f"Cleaned up workspace {ws} from the admin: {removed} keys removed.",
                )
                modeladmin.message_user(
                    request,
                    f"Deleted the outbox data of workspace {ws} ({removed} keys).",
                    messages.SUCCESS,
                )
            else:
                modeladmin.message_user(
                    request, f"Workspace {ws} had nothing to delete.", messages.WARNING
                )
        return None
    summary = cleanup_summary(outbox, ids)
    context = modeladmin.page_context(
        request,
        "Are you sure?",
        summary=summary,
        total_sessions=sum(w["session_count"] for w in summary),
        total_entries=sum(w["entry_count"] for w in summary),
        refs=refs,
        extra_workspaces=workspaces,
        next_url=request.POST.get("next", ""),
    )
    return TemplateResponse(request, "django_outbox/admin/cleanup_workspace.html", context)


def cleanup_summary(outbox: Outbox, ids: list[str]) -> list[dict[str, Any]]:
    """What a cleanup deletes, per workspace, for the confirmation page
    (``Outbox.workspace_summaries``: exact counts; only the first
    ``CLEANUP_LIST_LIMIT`` sessions are listed)."""
    return [
        {
            "workspace_id": found.workspace_id,
            "session_count": len(found.sessions),
            "entry_count": found.entry_count,
            "leased": found.leased,
            "sessions": [
                {"session_id": s.session_id, "entries": s.entries, "leased": int(s.leased)}
                for s in found.sessions[:CLEANUP_LIST_LIMIT]
            ],
            "more": max(0, len(found.sessions) - CLEANUP_LIST_LIMIT),
        }
        for found in outbox.workspace_summaries(ids)
    ]
