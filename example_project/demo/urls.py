from django.urls import path

from . import views

urlpatterns = [
    path("", views.queue_page, name="demo-queue"),
    path(
        "demo/api/workspaces/<str:workspace_id>/sessions/",
        views.sessions_api,
        name="demo-sessions",
    ),
    path(
        "demo/api/workspaces/<str:workspace_id>/sessions/<str:session_id>/transcript/",
        views.transcript_api,
        name="demo-transcript",
    ),
    path("demo/api/agent/", views.agent_api, name="demo-agent"),
]
