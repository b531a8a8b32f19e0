"""The queue page and the small JSON endpoints it uses beside the outbox API.

Every endpoint answers from the access policy (``policy.py``): a member sees and
changes only what belongs to their workspaces; staff get what their permissions
allow (README "The demo", "Security").
"""

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
from django_outbox.policy import has_outbox_permission

from . import agent
from .models import AgentSession, Membership
from .policy import workspace_members

#: Where ``example_project/urls.py`` mounts ``django_outbox.urls``; outbox.js appends
#: ``api/workspaces/<ws>/sessions/<ses>/messages/`` to it.
OUTBOX_MOUNT = "/outbox/"
#: The permission to read every prompt count and change the fake agent's shared knobs.
CONTROL_AGENT = "demo.control_agent"
#: The fake agent's values that act on every session (anyone may read them).
SHARED_VALUES = ("latency", "cutRate", "errorRate", "busyRate")
#: The fake agent's knobs that act on every session (only ``CONTROL_AGENT`` may change
#: them); a member may only add rules for their own sessions.
GLOBAL_KNOBS = (*SHARED_VALUES, "clearRules")


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
    if has_outbox_permission(user, "view"):
        names |= set(AgentSession.objects.values_list("workspace_id", flat=True).distinct())
    return sorted(names)


def controls_agent(user: Any) -> bool:
    """Active staff holding ``demo.control_agent``: every knob, every prompt count."""
    return bool(user.is_active and user.is_staff and user.has_perm(CONTROL_AGENT))


def _own_sessions(user: Any) -> set[str]:
    """The agent sessions of the workspaces ``user`` may send prompts into."""
    workspaces = Membership.objects.filter(user=user).values_list("workspace_id", flat=True)
    return {
        s.session_id
        for s in AgentSession.objects.filter(workspace_id__in=list(workspaces))
        if workspace_members(user, s.workspace_id, s.session_id, "accept")
    }


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
        "controlsAgent": controls_agent(request.user),
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
        return JsonResponse({"messages": agent.transcript(session_id, workspace_id)})
    except agent.AgentError as exc:
        return _error(502, "agent_unavailable", str(exc))


@json_login_required
@require_http_methods(["GET", "POST"])
def agent_api(request: HttpRequest) -> HttpResponse:
    """The fake agent's knobs (fake agent only).

    Staff with ``demo.control_agent``: everything (``GET`` the knobs, the rules and how
    many POSTs each prompt text received; ``POST`` any change). A workspace member:
    ``GET`` the shared knobs and the rules of their own sessions (no prompt counts: they
    are keyed by other people's prompt texts); ``POST {"rules": [...]}`` where every rule
    names one of their sessions (``"session"``), so it fails only their own deliveries.
    Anyone else: 403.
    """
    if not agent.has_knobs():
        return _error(404, "not_found", f"The {agent.kind()} agent has no knobs.")
    user = request.user
    operator = controls_agent(user)
    own = set() if operator else _own_sessions(user)
    if not operator and not own:
        return _error(403, "permission_denied", "The agent's knobs are for its users.")
    try:
        if request.method == "POST":
            body = json.loads(request.body or b"{}")
            if not isinstance(body, dict):
                return _error(400, "parse_error", "Send a JSON object.")
            if not operator:
                refused = _refused_change(body, own)
                if refused:
                    return _error(403, "permission_denied", refused)
            knobs = agent.control(body)
        else:
            knobs = agent.control()
    except ValueError:
        return _error(400, "parse_error", "Send a JSON object.")
    except agent.AgentError as exc:
        return _error(502, "agent_unavailable", str(exc))
    if operator:
        return JsonResponse(knobs)
    return JsonResponse(
        {
            **{k: knobs.get(k) for k in SHARED_VALUES},
            "rules": [r for r in knobs.get("rules", []) if r.get("session") in own],
        }
    )


def _refused_change(body: dict[str, Any], own: set[str]) -> str | None:
    """Why a member may not make this change (None: they may)."""
    shared = [k for k in GLOBAL_KNOBS if k in body]
    if shared:
        return f"Only staff with {CONTROL_AGENT} may change {', '.join(shared)}."
    rules = body.get("rules", [])
    for rule in rules if isinstance(rules, list) else [None]:
        if not isinstance(rule, dict) or rule.get("session") not in own:
            return 'Each rule must name one of your sessions ("session").'
    return None
