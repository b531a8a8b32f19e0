"""URL patterns of the REST API, included under ``api/`` by :mod:`django_outbox.urls`.

IDs are matched loosely here (any path segment) and validated by the views, so a
malformed ID answers a JSON 400 ``invalid_identifier`` instead of the router's 404.
"""

from __future__ import annotations

from django.urls import path

from .cutting import MessageSendNowView, SessionInterruptView
from .views import (
    MessageCancelView,
    MessageMoveView,
    MessageRetryView,
    MessagesView,
    MessageView,
    WorkerView,
    WorkspaceParkView,
    WorkspaceUnparkView,
    WorkspaceView,
)

_SESSION = "workspaces/<str:workspace_id>/sessions/<str:session_id>/"

urlpatterns = [
    path(f"{_SESSION}messages/", MessagesView.as_view(), name="api-messages"),
    path(f"{_SESSION}messages/<str:entry_id>/", MessageView.as_view(), name="api-message"),
    path(
        f"{_SESSION}messages/<str:entry_id>/retry/",
        MessageRetryView.as_view(),
        name="api-message-retry",
    ),
    path(
        f"{_SESSION}messages/<str:entry_id>/move/",
        MessageMoveView.as_view(),
        name="api-message-move",
    ),
    path(
        f"{_SESSION}messages/<str:entry_id>/cancel/",
        MessageCancelView.as_view(),
        name="api-message-cancel",
    ),
    path("workspaces/<str:workspace_id>/", WorkspaceView.as_view(), name="api-workspace"),
    path(
        "workspaces/<str:workspace_id>/park/",
        WorkspaceParkView.as_view(),
        name="api-workspace-park",
    ),
    path(
        "workspaces/<str:workspace_id>/unpark/",
        WorkspaceUnparkView.as_view(),
        name="api-workspace-unpark",
    ),
    path(f"{_SESSION}interrupt/", SessionInterruptView.as_view(), name="api-session-interrupt"),
    path(
        f"{_SESSION}messages/<str:entry_id>/send-now/",
        MessageSendNowView.as_view(),
        name="api-message-send-now",
    ),
    path(f"{_SESSION}worker/", WorkerView.as_view(), name="api-worker"),
]
