"""The outbox in the Django admin: find and fix stuck queues (docs/reference/admin.md).

The data lives in Valkey, so the admin follows the django-rq pattern: the
unmanaged :class:`~django_outbox.models.OutboxEntry` gives a content type and
permissions, and :class:`OutboxEntryAdmin` replaces the ORM changelist with
views over the outbox's read methods (``Outbox.session_page``, ``Outbox.search``,
``Outbox.snapshot``; see ``django_outbox.core.reads``), which read the global
indices: one key on a standalone server, kept exact by the Lua scripts; one copy
per shard on Valkey Cluster, kept by the client's index hints, so eventually
consistent there while each workspace's own keys stay exact. The admin itself
sends no command to Valkey.

* a page is a page of *sessions* of one index: the attention ZSET (sessions
  holding error, parked or verifying entries, pending ones blocked behind a
  lease, or staging without a lease; oldest first) for the default view and the
  attention-like filters, the all-sessions ZSET (newest first) otherwise, read
  with the global counts and the workers' heartbeats in two round trips on a
  standalone server, however many sessions are stored (``changelist``); pages
  follow each other by position, not by number: "Next" continues after the last
  session shown, so sessions resolved meanwhile cannot hide one from it;
* a search names a workspace, a session or an entry and is answered from the
  workspace SETs and the per-workspace session SETs, never by SCAN;
* every action is a CSRF-protected POST back to the changelist (admin
  actions), checked against the user's permissions, answered through the
  messages framework and logged as a ``LogEntry`` of the ``OutboxEntry``
  content type (``actions``).

This module holds the registration, the permissions, the URLs and the two views.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import LogEntry
from django.contrib.admin.utils import quote, unquote
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode

from ..core.actors import actor_user_pk, changes_of
from ..core.errors import InvalidIdentifier, KeySpaceClaimed, OutboxUnavailable
from ..core.rules import check_identifier
from ..models import OutboxDashboard, OutboxEntry
from ..outbox import get_outbox
from ..policy import has_outbox_permission
from . import (
    dashboard,
    pending,  # noqa: F401  (registers Outbox → Pending accepts)
)
from .actions import (
    cancel_entries,
    cleanup_workspaces,
    cut_entries,
    dismiss_entries,
    park_workspaces,
    retry_entries,
    unpark_workspaces,
)
from .changelist import (
    AFTER_VAR,
    ATTENTION,
    ATTENTION_FILTERS,
    BAD_POSITION,
    BEFORE_VAR,
    SEARCH_VAR,
    SESSIONS_PER_PAGE,
    STATUS_FILTERS,
    STATUS_VAR,
    Page,
    SessionView,
    derived_state,
    make_row,
    page_positions,
    page_rows,
    read_page,
    visible,
    worker_panel,
)

ENTRY_TEMPLATE = "django_outbox/admin/entry_detail.html"


@admin.register(OutboxEntry)
class OutboxEntryAdmin(admin.ModelAdmin):
    """A changelist-like admin over the outbox in Valkey (no ORM queries)."""

    sessions_per_page = SESSIONS_PER_PAGE
    # The outbox's actions take the selected references, not a queryset (there are no ORM
    # rows); run_action calls them, so Django's action signature does not apply.
    actions: list[Any] = [
        retry_entries,
        dismiss_entries,
        cancel_entries,
        cut_entries,
        park_workspaces,
        unpark_workspaces,
        cleanup_workspaces,
    ]
    change_list_template = "django_outbox/admin/change_list.html"

    # -- permissions -------------------------------------------------------------------

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # prompts are accepted over REST (add_outboxentry); no add form here

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    # The outbox's own permissions come from the access table (docs/howto/access-policy.md),
    # the same as the default policy's, so REST, WebSocket and admin agree.

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_outbox_permission(request.user, "view")

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "retry")

    def has_dismiss_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "dismiss")

    def has_park_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "park")

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "cancel")

    def has_interrupt_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "interrupt")

    def has_cleanup_permission(self, request: HttpRequest) -> bool:
        return has_outbox_permission(request.user, "cleanup")

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Only this admin's actions: the site-wide delete_selected needs the ORM.
        actions = self._filter_actions_by_permissions(  # type: ignore[attr-defined]
            request, [self.get_action(action) for action in self.actions]
        )
        return {name: (func, name, desc) for func, name, desc in actions}

    # -- URLs ----------------------------------------------------------------------------

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        site = self.admin_site
        return [
            path("", site.admin_view(self.changelist_view), name="{}_{}_changelist".format(*info)),
            path(
                "dashboard/",
                site.admin_view(self.dashboard_view),
                name="{}_{}_dashboard".format(*info),
            ),
            # Django's own name and shape, so LogEntry.get_admin_url() links here.
            path(
                "<path:object_id>/change/",
                site.admin_view(self.entry_view),
                name="{}_{}_change".format(*info),
            ),
        ]

    def _changelist_url(self, **params: Any) -> str:
        url = reverse(f"{self.admin_site.name}:django_outbox_outboxentry_changelist")
        params = {k: v for k, v in params.items() if v not in (None, "")}
        return f"{url}?{urlencode(params)}" if params else url

    def _entry_url(self, ref: str) -> str:
        return reverse(
            f"{self.admin_site.name}:django_outbox_outboxentry_change", args=[quote(ref)]
        )

    def page_context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        """The context every outbox admin page starts from (the site's, this admin's
        options and media, the changelist URL), with ``title`` and ``extra``."""
        return {
            **self.admin_site.each_context(request),
            "opts": self.opts,
            "title": title,
            "media": self.media,
            "changelist_url": self._changelist_url(),
            "dashboard_url": reverse(f"{self.admin_site.name}:django_outbox_outboxentry_dashboard"),
            **extra,
        }

    # -- the changelist ------------------------------------------------------------------

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self.run_action(request)
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "POST"])
        status_filter = request.GET.get(STATUS_VAR, ATTENTION)
        if status_filter not in dict(STATUS_FILTERS):
            status_filter = ATTENTION
        query = request.GET.get(SEARCH_VAR, "").strip()
        after, before, valid_position = page_positions(request.GET)
        try:
            page = read_page(
                get_outbox(),
                status_filter,
                query,
                self.sessions_per_page,
                after=after,
                before=before,
            )
        except OutboxUnavailable as exc:
            context = self.page_context(
                request, "Outbox entries", unavailable=str(exc), status_filter=status_filter
            )
            return TemplateResponse(request, self.change_list_template, context, status=503)
        if not valid_position:
            page.notes.insert(0, (messages.WARNING, BAD_POSITION))
        now = datetime.now(UTC)
        rows, counts, unmatched_sessions = page_rows(page, status_filter, now, self._entry_url)
        if query and not rows and not page.notes:
            page.notes.append((messages.WARNING, f"Nothing matches {visible(query, 200)!r}."))
        filters = [
            (value, label, value == status_filter, self._changelist_url(status=value, q=query))
            for value, label in STATUS_FILTERS
        ]
        action_choices = self.get_action_choices(request)
        context = self.page_context(
            request,
            "Outbox entries",
            rows=rows,
            status_filter=status_filter,
            status_label=dict(STATUS_FILTERS)[status_filter],
            filters=filters,
            query=query,
            search_var=SEARCH_VAR,
            page=page,
            **self._paginator(page, status_filter, query),
            unmatched_sessions=unmatched_sessions,
            page_counts=sorted(counts.items()),
            workers=worker_panel(page.workers, now),
            action_choices=action_choices if len(action_choices) > 1 else [],
            workspace_tools=self._workspace_tools(request, page.workspace_id),
            next_url=request.get_full_path(),
        )
        return TemplateResponse(request, self.change_list_template, context)

    def _paginator(self, page: Page, status_filter: str, query: str) -> dict[str, Any]:
        """The paginator's links and wording: "First page", "Previous" (ending before the
        first session shown), "Next" (continuing after the last one shown)."""
        kept = {STATUS_VAR: status_filter, SEARCH_VAR: query}
        next_position, previous_position = page.next_position, page.previous_position
        if query:
            source = "matching the search"
        elif status_filter in ATTENTION_FILTERS:
            source = "needing attention"
        else:
            source = "in the outbox"
        return {
            "first_page_url": None if page.is_first else self._changelist_url(**kept),
            "previous_page_url": previous_position
            and self._changelist_url(**kept, **{BEFORE_VAR: previous_position.to_text()}),
            "next_page_url": next_position
            and self._changelist_url(**kept, **{AFTER_VAR: next_position.to_text()}),
            "first_session": page.offset + 1,
            "last_session": page.offset + len(page.sessions),
            "source_label": source,
        }

    def _workspace_tools(self, request: HttpRequest, workspace_id: str | None) -> dict | None:
        if workspace_id is None:
            return None
        return {
            "workspace_id": workspace_id,
            "park": self.has_park_permission(request),
            "cleanup": self.has_cleanup_permission(request),
        }

    # -- the dashboard -------------------------------------------------------------------

    dashboard_template = "django_outbox/admin/dashboard.html"

    def dashboard_view(self, request: HttpRequest) -> HttpResponse:
        """Charts of the per-minute history, the workers and the sessions needing
        attention (``django_outbox.admin.dashboard``); ``?window=hour|day``;
        ``?fragment=1`` answers the body alone, for the page's refresh."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET"])
        window = request.GET.get("window", "hour")
        if window not in dashboard.WINDOWS:
            window = "hour"
        fragment = request.GET.get("fragment") == "1"
        template = (
            "django_outbox/admin/dashboard_body.html" if fragment else self.dashboard_template
        )
        workspace_id = request.GET.get("workspace", "").strip() or None
        agent = request.GET.get("agent", "").strip() or None
        notes = []
        if workspace_id is not None:
            try:
                check_identifier("workspace ID", workspace_id)
            except InvalidIdentifier as exc:
                notes.append(f"{exc} Showing every workspace.")
                workspace_id = None
        title = "Outbox dashboard" if workspace_id is None else f"Workspace {workspace_id}"
        query = {"window": window, **({"workspace": workspace_id} if workspace_id else {})}
        if agent is not None:
            query["agent"] = agent
        links = {
            "window": window,
            "workspace_id": workspace_id,
            "notes": notes,
            "refresh_query": urlencode({**query, "fragment": "1"}),
            "window_links": [
                (name, urlencode({**query, "window": name}), name == window)
                for name in dashboard.WINDOWS
            ],
        }
        try:
            data = dashboard.context(get_outbox(), window, workspace_id, agent)
        except OutboxUnavailable as exc:
            context = self.page_context(request, title, unavailable=str(exc), **links)
            response = TemplateResponse(request, template, context, status=503)
        else:
            links["notes"] = [*notes, *data.pop("agent_notes")]
            context = self.page_context(request, title, **{**links, **data})
            response = TemplateResponse(request, template, context)
        if fragment:
            # dashboard.js swaps in only what carries this: never a login page the
            # request was redirected to once the admin session expired.
            response[dashboard.FRAGMENT_HEADER] = "1"
        return response

    # -- the entry page ------------------------------------------------------------------

    def entry_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        ref = unquote(object_id)
        parts = ref.split("/")
        try:
            if len(parts) == 1:  # a workspace (LogEntry links for workspace actions)
                check_identifier("workspace ID", ref)
                return HttpResponseRedirect(self._changelist_url(status="all", q=ref))
            if len(parts) != 3:
                raise InvalidIdentifier("entry reference", ref)
            ws, ses, entry_id = parts
            check_identifier("workspace ID", ws)
            check_identifier("session ID", ses)
            check_identifier("entry ID", entry_id)
        except InvalidIdentifier as exc:
            context = self.page_context(request, "Outbox entry", invalid=str(exc), ref=ref)
            return TemplateResponse(request, ENTRY_TEMPLATE, context, status=404)
        try:
            view = SessionView.of(ws, ses, get_outbox().snapshot(ws, ses))
        except OutboxUnavailable as exc:
            context = self.page_context(request, "Outbox entry", unavailable=str(exc), ref=ref)
            return TemplateResponse(request, ENTRY_TEMPLATE, context, status=503)
        entry = next((e for e in view.entries if e.id == entry_id), None)
        row = None
        pretty = ""
        if entry is not None:
            state = derived_state(entry, view.lease)
            row = make_row(view, entry, state, datetime.now(UTC), self._entry_url)
            stored = json.loads(entry.to_json())  # as stored, without the read-time fields
            pretty = visible(json.dumps(stored, indent=2, ensure_ascii=False))
        ct = ContentType.objects.get_for_model(OutboxEntry, for_concrete_model=False)
        history = (
            LogEntry.objects.filter(content_type=ct, object_id__in=[ref, ws])
            .select_related("user")
            .order_by("-action_time")
        )
        context = self.page_context(
            request,
            f"Outbox entry {entry_id}",
            ref=ref,
            workspace_id=ws,
            session_id=ses,
            entry_id=entry_id,
            entry=entry,
            row=row,
            view=view,
            pretty_json=pretty,
            blocked_by_in_flight=entry.blocked_by_in_flight if entry else False,
            changed_by=changed_by(entry) if entry is not None else [],
            history=history,
            can_retry=self.has_retry_permission(request),
            can_dismiss=self.has_dismiss_permission(request),
            detail_url=self._entry_url(ref),
            session_url=self._changelist_url(status="all", q=f"{ws}/{ses}"),
        )
        return TemplateResponse(
            request, ENTRY_TEMPLATE, context, status=200 if entry is not None else 404
        )

    # -- actions ---------------------------------------------------------------------------

    def run_action(self, request: HttpRequest) -> HttpResponse:
        """Dispatch a POSTed action (CSRF is checked by ``admin_view``); see ``actions``."""
        name = request.POST.get("action", "")
        allowed = self.get_actions(request)
        if name not in allowed:
            if name in {getattr(action, "__name__", action) for action in self.actions}:
                raise PermissionDenied  # a known action this user may not run
            self.message_user(request, "No action selected.", messages.WARNING)
            return self._back(request)
        refs = request.POST.getlist(ACTION_CHECKBOX_NAME)
        workspaces = request.POST.getlist("workspace")
        if not refs and not workspaces:
            self.message_user(
                request,
                "Items must be selected in order to perform actions on them. "
                "No items have been changed.",
                messages.WARNING,
            )
            return self._back(request)
        func = allowed[name][0]
        try:
            response = func(self, request, refs, workspaces)
        except (OutboxUnavailable, KeySpaceClaimed) as exc:
            self.message_user(request, f"Nothing was done: {exc}", messages.ERROR)
            return self._back(request)
        return response or self._back(request)

    def _back(self, request: HttpRequest) -> HttpResponse:
        target = request.POST.get("next") or request.get_full_path()
        if not url_has_allowed_host_and_scheme(
            target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
        ):
            target = self._changelist_url()
        return HttpResponseRedirect(target)


@admin.register(OutboxDashboard)
class OutboxDashboardAdmin(admin.ModelAdmin):
    """The admin index's "Outbox dashboard" row: its changelist is the dashboard."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_outbox_permission(request.user, "view")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "",
                self.admin_site.admin_view(self.changelist_view),
                name="{}_{}_changelist".format(*info),
            )
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(
            reverse(f"{self.admin_site.name}:django_outbox_outboxentry_dashboard")
        )


def changed_by(entry: Any) -> list[tuple[str, str]]:
    """The entry page's "Changed by" rows: each change the entry records (edited, moved,
    cancelled, stopped) and its actor, a ``user:<pk>`` or ``staff:<pk>`` one followed by
    the username when that user exists (docs/reference/admin.md)."""
    changes = changes_of(entry)
    pks = {pk for _, actor in changes if (pk := actor_user_pk(actor)) is not None}
    names: dict[str, str] = {}
    if pks:
        try:
            users = get_user_model().objects.filter(pk__in=sorted(pks))
            names = {str(user.pk): user.get_username() for user in users}
        except (ValueError, TypeError):  # a pk of another type than the user model's
            names = {}
    rows = []
    for what, actor in changes:
        name = names.get(actor_user_pk(actor) or "")
        rows.append((what, f"{actor} ({name})" if name else actor))
    return rows
