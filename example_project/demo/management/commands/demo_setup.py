"""``manage.py demo_setup``: the demo's users, memberships and a live agent session.

Idempotent; run by ``python -m example_project.run`` after ``migrate``. Passwords are
reset to the given ones each time so the printed login always works.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from example_project.demo import agent
from example_project.demo.models import AgentSession, Membership


class Command(BaseCommand):
    help = "Create the demo user (a workspace member), a superuser, and an agent session."

    def add_arguments(self, parser):
        parser.add_argument("--user", default="demo")
        parser.add_argument("--password", default="demo")
        parser.add_argument("--workspace", default="demo")
        parser.add_argument("--admin", default="admin")
        parser.add_argument("--admin-password", default="admin")
        parser.add_argument(
            "--no-session",
            action="store_true",
            help="do not contact the agent (no session check or creation)",
        )

    def handle(self, *args, **options):
        User = get_user_model()
        user, _ = User.objects.get_or_create(username=options["user"])
        user.set_password(options["password"])
        user.is_active = True
        user.save()
        Membership.objects.get_or_create(user=user, workspace_id=options["workspace"])
        admin, _ = User.objects.get_or_create(username=options["admin"])
        admin.set_password(options["admin_password"])
        admin.is_staff = admin.is_superuser = admin.is_active = True
        admin.save()
        if options["no_session"]:
            return
        kind = agent.kind()
        live = 0
        try:
            for row in AgentSession.objects.filter(workspace_id=options["workspace"], agent=kind):
                if agent.session_exists(row.session_id):
                    live += 1
                else:  # made by an earlier agent whose data is gone
                    self.stdout.write(f"forgetting session {row.session_id}: unknown to the agent")
                    row.delete()
            if not live:
                sid = agent.create_session("First session")
                AgentSession.objects.create(
                    workspace_id=options["workspace"],
                    session_id=sid,
                    title="First session",
                    agent=kind,
                    created_by=user,
                )
        except agent.AgentError as exc:
            raise CommandError(str(exc)) from exc
