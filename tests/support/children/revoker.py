"""A Django process of the same project as the servers of
tests/django/ws/test_revocation_on_servers.py (settings ``tests.support.settings.revoke``,
same database and channel layer): it changes users the way a project does — Django's own
``logout()``, ``set_password()`` and ``save()``, permission and group managers — so the
signals fire as they would in a view, the admin or a shell.

Usage: ``python -m tests.support.children.revoker``, then one JSON command a line on stdin;
each answers one JSON line on stdout, ``{"ok": true, "at": <time.time() just before the
change>, "value": ...}`` (or ``{"ok": false, "error": ...}``). Commands (``op``):

* ``reset``: alice active, password ``secret-pw``, permission
  ``django_outbox.view_outboxentry`` held directly, in no group; group ``watchers``
  exists and holds the permission;
* ``login``: a new login session of alice (``value``: its key);
* ``token``: a new DRF token of alice, her old one deleted (``value``: its key);
  ``delete_token`` (``key``);
* ``logout`` (``session``: a key): ``django.contrib.auth.logout`` on a request of that
  session;
* ``password``, ``deactivate``: ``set_password`` + ``save``, ``is_active = False`` + ``save``;
* ``revoke_direct``: alice's direct permission removed; ``via_group``: the direct
  permission removed and alice put in ``watchers``; ``leave_group``; ``clear_groups``;
  ``group_loses_permission``: ``watchers`` loses the permission;
* ``touch_login``: ``update_last_login`` (a save that changes no right).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from importlib import import_module

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth import (  # noqa: E402
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    logout,
)
from django.contrib.auth.models import Group, Permission, User, update_last_login  # noqa: E402
from django.http import HttpRequest  # noqa: E402
from rest_framework.authtoken.models import Token  # noqa: E402

PASSWORD = "secret-pw"


def _alice() -> User:
    return User.objects.get(username="alice")


def _permission() -> Permission:
    return Permission.objects.get(
        content_type__app_label="django_outbox", codename="view_outboxentry"
    )


def _group() -> Group:
    group, _ = Group.objects.get_or_create(name="watchers")
    return group


def reset(_: dict) -> None:
    alice = _alice()
    alice.is_active = True
    alice.set_password(PASSWORD)
    alice.save()
    alice.groups.clear()
    alice.user_permissions.set([_permission()])
    _group().permissions.set([_permission()])


def login(_: dict) -> str:
    alice = _alice()
    session = import_module(settings.SESSION_ENGINE).SessionStore()
    session[SESSION_KEY] = str(alice.pk)
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = alice.get_session_auth_hash()
    session.create()
    return session.session_key


def token(_: dict) -> str:
    alice = _alice()
    Token.objects.filter(user=alice).delete()  # DRF holds one token per user
    return Token.objects.create(user=alice).key


def delete_token(command: dict) -> None:
    Token.objects.filter(key=command["key"]).delete()


def do_logout(command: dict) -> None:
    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(command["session"])
    request.user = _alice()
    logout(request)


def password(_: dict) -> None:
    alice = _alice()
    alice.set_password("another-pw")
    alice.save()


def deactivate(_: dict) -> None:
    alice = _alice()
    alice.is_active = False
    alice.save()


def revoke_direct(_: dict) -> None:
    _alice().user_permissions.remove(_permission())


def via_group(_: dict) -> None:
    alice = _alice()
    alice.groups.add(_group())  # first: she holds the permission all along
    alice.user_permissions.clear()


def leave_group(_: dict) -> None:
    _alice().groups.remove(_group())


def clear_groups(_: dict) -> None:
    _alice().groups.clear()


def group_loses_permission(_: dict) -> None:
    _group().permissions.remove(_permission())


def touch_login(_: dict) -> None:
    update_last_login(None, _alice())


OPS = {
    "reset": reset,
    "login": login,
    "token": token,
    "delete_token": delete_token,
    "logout": do_logout,
    "password": password,
    "deactivate": deactivate,
    "revoke_direct": revoke_direct,
    "via_group": via_group,
    "leave_group": leave_group,
    "clear_groups": clear_groups,
    "group_loses_permission": group_loses_permission,
    "touch_login": touch_login,
}


def main() -> None:
    print(json.dumps({"ok": True, "ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        try:
            op = OPS[command["op"]]
            at = time.time()
            value = op(command)
            answer = {"ok": True, "at": at, "value": value}
        except Exception:
            answer = {"ok": False, "error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
