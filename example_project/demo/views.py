"""The queue page and the small JSON endpoints it uses beside the outbox API."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from django_outbox.conf import outbox_settings

from . import agent
from .models import AgentSession, Membership
from .policy import workspace_members

#: Where ``example_project/urls.py`` mounts ``django_outbox.urls``; outbox.js appends
#: ``api/workspaces/<ws>/sessions/<ses>/messages/`` to it.
OUTBOX_MOUNT = "/outbox/"


def _error(status: int, code: str, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail, "code": code}, status=status)


def json_login_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Like ``login_required``, but answers 403 JSON instead of redirecting."""

    @wraps(view)
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return _error(403, "not_authenticated", "Log in first.")
        return view(request, *args, **kwargs)

    return wrapper


def _workspaces(user: Any) -> list[str]:
    names = set(Membership.objects.filter(user=user).values_list("workspace_id", flat=True))
    if user.is_staff:
        names |= set(AgentSession.objects.values_list("workspace_id", flat=True).distinct())
    return sorted(names)


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    """The queue UI: pick a session, send prompts, watch them live (``static/demo/queue.js``)."""
    workspaces = _workspaces(request.user)
    workspace = request.GET.get("workspace") or (workspaces[0] if workspaces else "")
    if workspace not in workspaces:
        workspace = workspaces[0] if workspaces else ""
    sessions = list(AgentSession.objects.filter(workspace_id=workspace, agent=agent.kind()))
    session = request.GET.get("session") or (sessions[0].session_id if sessions else "")
    if session not in {s.session_id for s in sessions}:
        session = sessions[0].session_id if sessions else ""
    config = outbox_settings().config
    page = {
        "workspace": workspace,
        "session": session,
        "userID": str(request.user.pk),
        "agentKind": agent.kind(),
        "apiBase": OUTBOX_MOUNT,
        "sessionsURL": reverse("demo-sessions", args=[workspace]) if workspace else "",
        "transcriptURL": (reverse("demo-transcript", args=[workspace, session]) if session else ""),
        "agentURL": reverse("demo-agent"),
        "maxTextBytes": config.max_text_bytes,
    }
    return render(
        request,
        "demo/queue.html",
        {
            "page": page,
            "workspaces": workspaces,
            "workspace": workspace,
            "sessions": sessions,
            "session": session,
        },
    )


@json_login_required
@require_http_methods(["GET", "POST"])
def sessions_api(request: HttpRequest, workspace_id: str) -> HttpResponse:
    """GET: the workspace's sessions on the current agent. POST ``{"title"?}``: make one."""
    action = "accept" if request.method == "POST" else "view"
    if not workspace_members(request.user, workspace_id, None, action):
        return _error(403, "permission_denied", "You are not a member of this workspace.")
    if request.method == "GET":
        rows = AgentSession.objects.filter(workspace_id=workspace_id, agent=agent.kind())
        return JsonResponse(
            {"sessions": [{"sessionID": s.session_id, "title": s.title} for s in rows]}
        )
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return _error(400, "parse_error", "Send a JSON object.")
    title = str(body.get("title", "") if isinstance(body, dict) else "")[:200]
    try:
        session_id = agent.create_session(title)
    except agent.AgentError as exc:
        return _error(502, "agent_unavailable", str(exc))
    count = AgentSession.objects.filter(workspace_id=workspace_id).count()
    AgentSession.objects.create(
        workspace_id=workspace_id,
        session_id=session_id,
        title=title or f"Session {count + 1}",
        agent=agent.kind(),
        created_by=request.user,
    )
    return JsonResponse({"sessionID": session_id, "title": title}, status=201)


@json_login_required
@require_http_methods(["GET"])
def transcript_api(request: HttpRequest, workspace_id: str, session_id: str) -> HttpResponse:
    """What the agent has in its transcript for the session (to see each prompt once)."""
    if not workspace_members(request.user, workspace_id, session_id, "view"):
        return _error(403, "permission_denied", "You may not view this session.")
    try:
        return JsonResponse({"messages": agent.transcript(session_id)})
    except agent.AgentError as exc:
        return _error(502, "agent_unavailable", str(exc))


@json_login_required
@require_http_methods(["GET", "POST"])
def agent_api(request: HttpRequest) -> HttpResponse:
    """The fake agent's knobs: latency, cut/error rates, one-shot rules (fake agent only)."""
    if agent.kind() != "fake":
        return _error(404, "not_found", "The real opencode server has no knobs.")
    try:
        if request.method == "GET":
            return JsonResponse(agent.control())
        body = json.loads(request.body or b"{}")
        if not isinstance(body, dict):
            return _error(400, "parse_error", "Send a JSON object.")
        return JsonResponse(agent.control(body))
    except ValueError:
        return _error(400, "parse_error", "Send a JSON object.")
    except agent.AgentError as exc:
        return _error(502, "agent_unavailable", str(exc))
