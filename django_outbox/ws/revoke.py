"""Re-validation of a live socket's credential, and revocations pushed to a user's open
queue sockets in every server process.

:func:`revalidate` calls the scope's ``outbox_revalidate`` (:data:`REVALIDATE_KEY`), the
hook a project's auth middleware may set; the consumer asks it at every resync and
periodic check, before the access policy.

docs/explanation/security.md#live-connections states the bound. Each socket of an
authenticated user joins that user's channel-layer group (:func:`user_group`, a keyed
hash of the primary key behind the project's tag: the layer's keys name no user, and
no other project's). A revocation Django knows about
sends ``{"type": "outbox.revoke"}`` to that group through the channel layer, so it
reaches the sockets of every server process sharing the layer; each socket then
re-authorises as its periodic check does (the scope's ``outbox_revalidate``, the login
session read afresh, the access policy) and closes with 4403 when that fails. A logout
carries a digest of the ended session's key (:func:`session_digest`): the sockets of that
session close whatever a re-check would read while ``logout()`` has not yet flushed it.

What sends one (connected by :func:`connect_signals` from ``OutboxConfig.ready``):

- ``user_logged_out`` (a logout);
- ``post_save`` of the user model (a password change changes the session auth hash,
  ``is_active = False``, any other field a policy may read), except a save of
  ``last_login`` alone (every login makes one) and a creation;
- ``post_delete`` of the user model;
- ``m2m_changed`` of the user's ``user_permissions`` and ``groups`` and of a group's
  ``permissions`` (either side, added, removed or cleared), and ``pre_delete`` of a
  group: every member of the group is sent one.

Anything else a project revokes — a DRF token deleted, an API key, a membership of its
own — it pushes with :func:`revoke_sockets` / :func:`arevoke_sockets`.

Each is sent once the transaction that made the change commits (``on_commit``; at once
outside a transaction), so the re-check reads the change. A send that fails is logged
and never fails the change: the socket's next periodic check (``WS_CHECK_INTERVAL``)
still closes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
from collections.abc import Iterable
from functools import partial
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import router, transaction

from ..core.redaction import redact
from ..core.transport import is_async_callable

logger = logging.getLogger("django_outbox.ws")
#: The consumer's logger: what it logs of a socket goes there.
consumer_logger = logging.getLogger("django_outbox.consumers")

#: The scope key of a project's re-validation hook (DESIGN 19.5): a sync or async
#: callable taking the scope and returning a bool, set by the auth middleware that
#: authenticated the socket (docs/howto/clients.md#tokens-on-the-websocket).
REVALIDATE_KEY = "outbox_revalidate"

#: The prefix of a user's group (the rest: the project's tag, a period, 40 hex digits).
USER_GROUP_PREFIX = "outbox.user."
#: The channel-layer message a socket re-authorises on.
REVOKE_TYPE = "outbox.revoke"
#: Seconds one send may take before it is given up (logged): a channel layer that is
#: down must not hold a logout or a ``save()`` for its connect timeout.
SEND_TIMEOUT = 2.0
#: ``update_fields`` of a save that changes no right: skipped.
HARMLESS_SAVES = frozenset({"last_login"})

_pending: set[asyncio.Task[Any]] = set()


async def revalidate(scope: dict[str, Any]) -> bool | None:
    """``scope["outbox_revalidate"](scope)``, the hook a project's auth middleware may set
    (sync or async callable taking the scope, returning bool; a sync one runs in a
    thread, so it may use the ORM): True when the hook is absent or says the credential
    still holds; False when it does not, and for an answer that is not a bool (an
    awaitable from a sync callable included: fail closed; logged as an error); None when
    it raised (logged as a warning, redacted). Never raises."""
    hook = scope.get(REVALIDATE_KEY)
    if hook is None:
        return True
    try:
        if is_async_callable(hook):
            answer = await hook(scope)
        else:
            answer = await sync_to_async(hook)(scope)
    except Exception as exc:
        consumer_logger.warning(
            "outbox: WebSocket to %s closed with 4503: its %s raised %s",
            scope.get("path"),
            REVALIDATE_KEY,
            redact(f"{type(exc).__name__}: {exc}"),
        )
        return None
    if answer is True:
        return True
    if answer is not False:
        if inspect.iscoroutine(answer):
            answer.close()
        consumer_logger.error(
            "outbox: %s returned %s, not a bool; the socket to %s is refused",
            REVALIDATE_KEY,
            type(answer).__name__,
            scope.get("path"),
        )
    return False


def user_group(user_id: Any) -> str:
    """The channel-layer group of user ``user_id`` (a primary key, any type; compared as
    text): ``outbox.user.<tag>.`` + 40 hex digits of an HMAC keyed by ``SECRET_KEY``, 65
    characters, where ``<tag>`` is this project's
    :func:`~django_outbox.outbox.key_space_tag`: a user ID of one project never names a
    group of another sharing the channel layer
    (docs/howto/valkey.md#sharing-a-channel-layer). Raises ``ImproperlyConfigured``
    without a ``SECRET_KEY``."""
    from django.utils.crypto import salted_hmac

    from ..outbox import key_space_tag

    digest = salted_hmac("django_outbox.ws.revoke.user_group", str(user_id), algorithm="sha256")
    return f"{USER_GROUP_PREFIX}{key_space_tag()}.{digest.hexdigest()[:40]}"


def session_digest(session_key: str | None) -> str | None:
    """What a revocation says of a login session: 40 hex digits of SHA-256 of its key
    (the key itself is a credential and never enters the channel layer); None for none."""
    if not session_key:
        return None
    return hashlib.sha256(f"django_outbox.session\x00{session_key}".encode()).hexdigest()[:40]


def revoke_message(session_key: str | None = None) -> dict[str, Any]:
    """``{"type": "outbox.revoke"}``, with ``"session"`` (:func:`session_digest`) when one
    login session ended."""
    message: dict[str, Any] = {"type": REVOKE_TYPE}
    digest = session_digest(session_key)
    if digest is not None:
        message["session"] = digest
    return message


async def arevoke_sockets(user_ids: Iterable[Any], session_key: str | None = None) -> int:
    """Tell the open queue sockets of each of ``user_ids`` (primary keys), in every
    server process, to re-authorise now (those that fail close with 4403). With
    ``session_key``, the sockets of that login session close without a re-check.
    Returns how many users were sent one; never raises (no channel layer configured:
    0; a send that fails or takes over :data:`SEND_TIMEOUT` seconds is logged)."""
    from channels.layers import get_channel_layer

    ids = list(dict.fromkeys(str(pk) for pk in user_ids if pk is not None))
    if not ids:
        return 0
    try:
        layer = get_channel_layer()
    except Exception as exc:
        logger.warning("outbox: no channel layer to push a revocation: %s", redact(str(exc)))
        return 0
    if layer is None:
        return 0
    message = revoke_message(session_key)
    sent = 0
    for pk in ids:
        try:
            await asyncio.wait_for(layer.group_send(user_group(pk), message), SEND_TIMEOUT)
            sent += 1
        except Exception as exc:
            logger.warning(
                "outbox: could not push a revocation to a user's sockets (their next "
                "periodic check closes them): %s",
                redact(f"{type(exc).__name__}: {exc}"),
            )
    return sent


def revoke_sockets(user_ids: Iterable[Any], session_key: str | None = None) -> None:
    """Sync :func:`arevoke_sockets`, sent once the current transaction of the user
    model's database commits (at once outside one; nothing on a rollback). From a
    thread running an event loop, it is scheduled on that loop instead. Never raises."""
    from django.contrib.auth import get_user_model

    ids = [pk for pk in user_ids if pk is not None]
    if not ids:
        return
    using = router.db_for_write(get_user_model())
    transaction.on_commit(partial(_send_now, ids, session_key), using=using)


def _send_now(ids: list[Any], session_key: str | None) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is None:
            async_to_sync(arevoke_sockets)(ids, session_key)
        else:  # called from async code without a thread: do not block its loop
            task = loop.create_task(arevoke_sockets(ids, session_key))
            _pending.add(task)
            task.add_done_callback(_pending.discard)
    except Exception as exc:  # never fail the change that was made
        logger.warning("outbox: could not push a revocation: %s", redact(str(exc)))


# -- a socket's membership ------------------------------------------------------------


async def join_user_group(socket: Any, user_id: str | None) -> None:
    """Put ``socket`` (an :class:`~django_outbox.ws.consumer.OutboxConsumer`) in the
    group revocations of ``user_id`` go to (None: an anonymous user, no group), and note
    its login session (``socket.user_group``, ``socket.session_digest``). Raises what
    the channel layer raises."""
    if user_id is None or socket.user_group is not None:
        return
    group = user_group(user_id)
    await socket.channel_layer.group_add(group, socket.channel_name)
    socket.user_group = group
    session = socket.scope.get("session")
    socket.session_digest = session_digest(getattr(session, "session_key", None))


async def rejoin_user_group(socket: Any) -> None:
    """Join the user's group again (channels-redis forgets members after
    ``group_expiry``); logs and returns on failure (the periodic check still runs)."""
    if socket.user_group is None:
        return
    try:
        await socket.channel_layer.group_add(socket.user_group, socket.channel_name)
    except Exception as exc:
        consumer_logger.warning("outbox: cannot re-join a user's group: %s", redact(str(exc)))


async def leave_user_group(socket: Any) -> None:
    """Leave the user's group (never raises: the layer's group expiry drops it)."""
    if socket.user_group is None:
        return
    group, socket.user_group = socket.user_group, None
    try:
        await socket.channel_layer.group_discard(group, socket.channel_name)
    except Exception as exc:
        consumer_logger.warning("outbox: cannot leave a user's group: %s", redact(str(exc)))


# -- Django's own revocations ---------------------------------------------------------


def _on_logout(sender: Any, request: Any = None, user: Any = None, **kwargs: Any) -> None:
    if user is None or getattr(user, "pk", None) is None:
        return
    session = getattr(request, "session", None)
    revoke_sockets([user.pk], getattr(session, "session_key", None))


def _on_user_saved(
    sender: Any, instance: Any, created: bool = False, update_fields: Any = None, **kwargs: Any
) -> None:
    if created or kwargs.get("raw"):
        return
    if update_fields is not None and frozenset(update_fields) <= HARMLESS_SAVES:
        return
    revoke_sockets([instance.pk])


def _on_user_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    revoke_sockets([instance.pk])


def _members(group_ids: Iterable[Any] | None = None, permission: Any = None) -> list[Any]:
    """Primary keys of the users in the groups ``group_ids`` (or in every group holding
    ``permission``)."""
    from django.contrib.auth import get_user_model

    users = get_user_model()._default_manager
    if permission is not None:
        query = users.filter(groups__permissions=permission)
    else:
        query = users.filter(groups__in=list(group_ids or ()))
    return list(query.values_list("pk", flat=True).distinct())


def _user_m2m_changed(
    field: str,
    sender: Any,
    instance: Any,
    action: str,
    reverse: bool,
    model: Any,
    pk_set: Any,
    **kwargs: Any,
) -> None:
    """A user's ``groups`` or ``user_permissions`` changed, from either side."""
    if action not in ("post_add", "post_remove", "pre_clear"):
        return
    if not reverse:
        revoke_sockets([instance.pk])
    elif pk_set is not None:
        revoke_sockets(pk_set)
    else:  # group.user_set.clear() / permission.user_set.clear()
        revoke_sockets(
            model._default_manager.filter(**{field: instance}).values_list("pk", flat=True)
        )


def _group_permissions_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: Any, **kwargs: Any
) -> None:
    """A group's ``permissions`` changed, from either side: every member re-checks."""
    if action not in ("post_add", "post_remove", "pre_clear"):
        return
    if not reverse:
        revoke_sockets(_members([instance.pk]))
    elif pk_set is not None:
        revoke_sockets(_members(pk_set))
    else:
        revoke_sockets(_members(permission=instance))


def _on_group_deleted(sender: Any, instance: Any, **kwargs: Any) -> None:
    revoke_sockets(_members([instance.pk]))


def connect_signals() -> None:
    """Connect the receivers listed in the module's docstring (``OutboxConfig.ready``
    calls it; calling it again changes nothing). Nothing without ``django.contrib.auth``;
    the m2m receivers only where the user model has the field."""
    from django.apps import apps
    from django.db.models.signals import m2m_changed, post_delete, post_save, pre_delete

    if not apps.is_installed("django.contrib.auth"):
        return
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.contrib.auth.signals import user_logged_out

    user_model = get_user_model()
    uid = "django_outbox.ws.revoke"
    user_logged_out.connect(_on_logout, dispatch_uid=f"{uid}.logout")
    post_save.connect(_on_user_saved, sender=user_model, dispatch_uid=f"{uid}.user_saved")
    post_delete.connect(_on_user_deleted, sender=user_model, dispatch_uid=f"{uid}.user_deleted")
    for field in ("groups", "user_permissions"):
        descriptor = getattr(user_model, field, None)
        through = getattr(descriptor, "through", None)
        if through is not None:
            m2m_changed.connect(
                partial(_user_m2m_changed, field),
                sender=through,
                weak=False,
                dispatch_uid=f"{uid}.{field}",
            )
    m2m_changed.connect(
        _group_permissions_changed,
        sender=Group.permissions.through,
        dispatch_uid=f"{uid}.group_permissions",
    )
    pre_delete.connect(_on_group_deleted, sender=Group, dispatch_uid=f"{uid}.group_deleted")
