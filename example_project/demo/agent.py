"""The demo's calls to the agent outside delivery: make sessions, read transcripts, knobs.

Deliveries go through the outbox (``django_outbox.delivery.opencode``, or
``django_outbox.delivery.http`` with ``AGENT=http``); these are the project's own,
synchronous side calls, with the same base URL and credentials. The demo's HTTP agent
(``example_project/http_agent.py``) answers the fake agent's routes too, so its sessions,
transcripts and knobs are read here the same way.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from django.conf import settings

TIMEOUT = httpx.Timeout(10.0, connect=3.0)


class AgentError(Exception):
    """The agent could not be reached or answered something unexpected."""


def kind() -> str:
    """``"fake"`` (the demo's fake agent, with fault knobs), ``"http"`` (the same behind an
    in-house agent's HTTP API, with the knobs), ``"opencode"`` or ``"langgraph"``."""
    return settings.AGENT_KIND


def has_knobs() -> bool:
    """Whether the agent is one of the demo's own, with fault knobs (``/_fake/control``)."""
    return kind() in ("fake", "http")


def _client() -> httpx.Client:
    password = settings.AGENT_PASSWORD
    return httpx.Client(
        base_url=settings.AGENT_URL,
        auth=None if password is None else ("opencode", password),
        timeout=TIMEOUT,
    )


def _call(method: str, path: str, **kwargs: Any) -> httpx.Response:
    try:
        with _client() as client:
            return client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise AgentError(f"agent at {settings.AGENT_URL} unreachable: {exc}") from exc


def create_session(title: str = "") -> str:
    """``POST /session``: a new session; returns its ID (``ses_...``). On LangGraph a new
    ID only: the backend makes the session's thread at its first delivery."""
    if kind() == "langgraph":
        return f"ses_{uuid.uuid4().hex}"
    response = _call("POST", "/session", json={"title": title} if title else {})
    if response.status_code != 200:
        raise AgentError(f"POST /session answered {response.status_code}: {response.text[:200]}")
    sid = response.json().get("id", "")
    if not isinstance(sid, str) or not sid.startswith("ses"):
        raise AgentError(f"POST /session answered an unexpected session ID {sid!r}")
    return sid


def session_exists(session_id: str) -> bool:
    """True if the agent knows ``session_id`` (its transcript is readable)."""
    if kind() == "langgraph":
        return True  # its thread appears with its first prompt
    return _call("GET", f"/session/{session_id}/message").status_code == 200


def transcript(session_id: str, workspace_id: str = "demo") -> list[dict[str, Any]]:
    """The session's messages as ``[{"id", "role", "created", "completed", "texts"}]``."""
    if kind() == "langgraph":
        return _langgraph_transcript(workspace_id, session_id)
    response = _call("GET", f"/session/{session_id}/message")
    if response.status_code != 200:
        raise AgentError(f"transcript answered {response.status_code}")
    out = []
    for message in response.json():
        info = message.get("info", {})
        times = info.get("time") or {}
        out.append(
            {
                "id": info.get("id"),
                "role": info.get("role"),
                "created": times.get("created"),
                "completed": times.get("completed"),
                "texts": [
                    p.get("text", "") for p in message.get("parts", []) if p.get("type") == "text"
                ],
            }
        )
    return out


def _langgraph_transcript(workspace_id: str, session_id: str) -> list[dict[str, Any]]:
    """The messages of the session's LangGraph thread (its state), in the shape above."""
    from django_outbox.delivery.langgraph import session_thread

    response = _call("GET", f"/threads/{session_thread(workspace_id, session_id)}/state")
    if response.status_code == 404:
        return []  # no prompt delivered yet
    if response.status_code != 200:
        raise AgentError(f"thread state answered {response.status_code}")
    messages = (response.json().get("values") or {}).get("messages") or []
    roles = {"human": "user", "ai": "assistant"}
    return [
        {
            "id": m.get("id"),
            "role": roles.get(m.get("type"), m.get("type")),
            "created": None,
            "completed": None,
            "texts": [m["content"]] if isinstance(m.get("content"), str) else [],
        }
        for m in messages
    ]


def control(payload: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fake agent's knobs (``GET``), or change them (``POST``); see ``fake_agent.py``."""
    if not has_knobs():
        raise AgentError("only the demo's own agents have knobs")
    if payload is None:
        response = _call("GET", "/_fake/control")
    else:
        response = _call("POST", "/_fake/control", json=payload)
    if response.status_code != 200:
        raise AgentError(f"control answered {response.status_code}: {response.text[:200]}")
    return response.json()
