from django.contrib import admin

from .models import AgentSession, Membership


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "workspace_id"]
    list_filter = ["workspace_id"]
    search_fields = ["user__username", "workspace_id"]


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    list_display = ["session_id", "workspace_id", "title", "agent", "created_by", "created_at"]
    list_filter = ["workspace_id", "agent"]
    search_fields = ["session_id", "title"]
