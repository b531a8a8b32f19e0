"""The Django-aware outbox: signals on events, and the process-wide instance.

:class:`Outbox` adds Django signals, and the event listeners others subscribe (the
WebSocket wing's publisher, from ``OutboxConfig.ready``), to the core service;
:func:`get_outbox` builds the process-wide one from ``settings.OUTBOX`` (through
:mod:`django_outbox.conf`) and forgets it when ``OUTBOX`` or ``CACHES`` changes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from django.utils.crypto import salted_hmac

from . import receipts, transactional
from .conf import OutboxSettings, outbox_settings
from .core.entry import OutboxEvent
from .core.errors import SignalOwed
from .core.owner import KeySpaceOwner
from .core.service import Outbox as CoreOutbox
from .core.worker import WorkerStats, running_stats
from .signals import entry_delivered, entry_staged, entry_updated

if TYPE_CHECKING:
    from .models import PendingAccept

logger = logging.getLogger("django_outbox")

_SIGNALS = {"staged": entry_staged, "delivered": entry_delivered, "updated": entry_updated}
_SIGNAL_NAMES = {kind: f"entry_{kind}" for kind in _SIGNALS}


class EventListener(NamedTuple):
    """Told about every event of every :class:`Outbox`, after the event's signal:
    ``emit(event)`` from sync code, ``await aemit(event)`` from async code (their
    results are ignored). A listener should not raise: one that does is logged by the
    core and the event's later listeners are skipped."""

    emit: Callable[[OutboxEvent], object]
    aemit: Callable[[OutboxEvent], Awaitable[object]]


class Outbox(CoreOutbox):
    """:class:`django_outbox.core.service.Outbox` that sends the signals of
    :mod:`django_outbox.signals` for every event (``send_robust``: a failing receiver
    is logged with its dotted name, counted and does not stop the others), then tells its
    :attr:`event_listeners` (the WebSocket publisher, :mod:`django_outbox.ws.publish`,
    which sends ``queue.update`` to the session's Channels group). In a worker run its
    receivers find the database connections as a request would: those the server dropped,
    or older than ``CONN_MAX_AGE``, are closed first (docs/reference/commands.md#outbox_worker).
    :meth:`accept_on_commit` accepts inside the caller's database transaction. Its workers
    also prune the delivery receipts of opted-in ``entry_delivered`` receivers (the duty
    :func:`django_outbox.receipts.pruner`) and move the prompts accepted on commit that the
    committing process left behind (the duty :func:`django_outbox.transactional.mover`),
    both registered in ``duties``. Construct it
    directly in tests: ``Outbox(url=..., deliverer=..., verifier=..., ledger_probe=...,
    **tunables)``.
    """

    #: Listeners of every instance's events, in order (:class:`EventListener`).
    #: ``OutboxConfig.ready`` subscribes the WebSocket publisher
    #: (:func:`django_outbox.ws.publish.subscribe`).
    event_listeners: ClassVar[list[EventListener]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.duties.append(receipts.pruner(entry_delivered.once_receivers))
        self.duties.append(transactional.mover(self))

    def accept_on_commit(
        self,
        workspace_id: str,
        session_id: str,
        *,
        user_id: str,
        client_message_id: str,
        text: str,
        model: dict[str, Any] | None = None,
        using: str | None = None,
        **options: Any,
    ) -> PendingAccept:
        """Accept a prompt as part of the caller's database transaction: it enters the
        outbox if and only if that transaction commits (docs/howto/transactions.md).

        Checks the input at once, raising inside the transaction what :meth:`accept`
        raises for it (:class:`InvalidIdentifier`, :class:`InvalidContent`,
        :class:`ContentTooLarge`; :class:`InvalidContent` for an ``if_busy`` or
        ``expires_after`` it refuses), or ``TypeError`` for an option :meth:`accept` does
        not take (``options`` are passed to it). The options mean what they mean to
        :meth:`accept`, from this call: ``expires_after`` counts from it (on the
        database's clock until the move), and a ``SessionBusy`` answer to
        ``if_busy="reject"`` at the move is final, kept on the row for staff
        (docs/howto/transactions.md#accepts-options). Then writes a
        :class:`~django_outbox.models.PendingAccept` row on database ``using`` (None: the
        router's choice for that model; the transaction must be on the same database)
        and returns it. Savepoints count: a rolled-back ``atomic()`` block takes its rows
        with it. Right after the commit the prompt is accepted (``transaction.on_commit``,
        ``robust=True``) and the row deleted; if the process dies first, any worker moves
        it within about a second. One entry whatever happens: the ``client_message_id``
        makes the move idempotent, within ``DEDUPE_TTL``.

        The outbox's bounds (``CAP``, the per-user bounds) and Valkey's availability are
        met at the move, after the commit, not here: such a refused move is retried with a
        backoff and shown to staff (admin: *Pending accepts*), never dropped silently.
        Outside a transaction (autocommit) the move runs at once. No async twin: Django
        runs transactions in sync code (an async view wraps the transaction and this call
        in ``sync_to_async``). Use :meth:`accept` to answer the client with the entry, a
        ``Duplicate`` or a 429 now, independently of any database transaction.
        """
        return transactional.accept_on_commit(
            self,
            workspace_id,
            session_id,
            user_id=user_id,
            client_message_id=client_message_id,
            text=text,
            model=model,
            using=using,
            **options,
        )

    def listening(self, kind: str, watched: bool) -> bool:
        """Events are built when a WebSocket client watches the session or the kind's
        signal has receivers (Django checks its receiver list, no call is made). An empty
        list answers at once: the worker asks about five times per message, and Django's
        walk (a lock, dead-reference cleanup, sender matching) showed in its profile."""
        signal = _SIGNALS[kind]
        return watched or (bool(signal.receivers) and signal.has_listeners(sender=Outbox))

    def emit(self, event: OutboxEvent) -> None:
        """Send the event's signal to every receiver (one failing receiver does not stop
        the others; each failure is logged with the receiver's dotted name and counted in
        :data:`receipts.FAILURES <django_outbox.receipts.FAILURES>`), then tell the
        :attr:`event_listeners`. Raises :class:`SignalOwed` when an opted-in
        ``entry_delivered`` receiver failed (the core then leaves the signal owed)."""
        responses = _SIGNALS[event.kind].send_robust(sender=Outbox, **_signal_kwargs(event))
        for listener in self.event_listeners:
            listener.emit(event)
        _count_failures(event, responses, running_stats.get())

    async def aemit(self, event: OutboxEvent) -> None:
        """Async :meth:`emit`. In a worker run (the path a worker delivers by) the database
        connections are treated first as Django treats them at the start of a request
        (:func:`_close_old_connections`), in the thread the receivers' ORM calls run in for
        this event loop (``sync_to_async``, thread-sensitive): not at all while the signal
        has no receiver or this process has opened no connection, so a worker whose
        receivers never touch the database pays nothing for it."""
        signal = _SIGNALS[event.kind]
        run = running_stats.get()
        if run is not None and _opened_connections and signal.receivers:
            await sync_to_async(_close_old_connections, thread_sensitive=True)()
        responses = await signal.asend_robust(sender=Outbox, **_signal_kwargs(event))
        for listener in self.event_listeners:
            await listener.aemit(event)
        _count_failures(event, responses, run)


#: Whether this process has opened a database connection yet (Django's
#: ``connection_created``): until then a worker has none to close before receivers run.
_opened_connections = False


@receiver(connection_created)
def _connection_opened(**kwargs: Any) -> None:
    global _opened_connections
    _opened_connections = True


def _close_old_connections() -> None:
    """Django's ``close_old_connections`` (what ``request_started`` and ``request_finished``
    run) for the calling thread: a connection with an error since its last use that fails a
    ping, or one older than ``CONN_MAX_AGE``, is closed, and the next query opens a new one;
    with ``CONN_HEALTH_CHECKS`` the next query pings first. A connection inside an atomic
    block (a caller's transaction, a test's) is left alone: closing it would end the
    transaction."""
    for connection in connections.all(initialized_only=True):
        if not connection.in_atomic_block:
            connection.close_if_unusable_or_obsolete()


def _count_failures(
    event: OutboxEvent, responses: list[tuple[Any, Any]], run: WorkerStats | None
) -> None:
    """Log and count each receiver that raised (an opted-in one was by
    :mod:`~django_outbox.receipts`), tell the worker run, if any; raise
    :class:`SignalOwed` when an opted-in ``entry_delivered`` receiver failed."""
    owed = []
    for fn, response in responses:
        if not isinstance(response, Exception):
            continue
        if run is not None:
            run.receiver_failures += 1
        if receipts.is_once(fn):
            owed.append(fn.outbox_once)
            continue
        signal, name = _SIGNAL_NAMES[event.kind], receipts.receiver_name(fn)
        receipts.FAILURES[signal, name] += 1
        logger.error(
            "outbox: %s receiver %s failed for entry %s of %s/%s: %r (the event stands; "
            "this receiver is not called again for it)",
            signal,
            name,
            event.entry.id,
            event.workspace_id,
            event.session_id,
            response,
            exc_info=response,
        )
    if owed and event.kind == "delivered":
        raise SignalOwed(f"entry_delivered receivers failed: {', '.join(owed)}")


def _signal_kwargs(event: OutboxEvent) -> dict[str, Any]:
    kwargs = {
        "entry": event.entry,
        "workspace_id": event.workspace_id,
        "session_id": event.session_id,
        "version": event.version,
        "state": event.state,
    }
    if event.kind == "delivered":  # the agent's reference to it: docs/reference/signals.md
        kwargs["agent_ref"] = event.entry.agent_ref
    return kwargs


# --- the project as the owner of its key space ------------------------------------------

#: The HMAC salt of the key space identity (:func:`key_space_owner`): a digest made for
#: this one purpose, which no other HMAC Django makes with ``SECRET_KEY`` can stand for.
#: Changing it changes every project's identity: never.
KEY_SPACE_OWNER_SALT = "django_outbox.key_space_owner"


def key_space_owner(conf: OutboxSettings | None = None) -> KeySpaceOwner:
    """This project as the owner of its key space (docs/howto/valkey.md#one-project-per-key-space).

    ``id`` is the HMAC-SHA256 of ``KEY_PREFIX`` keyed with ``SECRET_KEY`` (Django's
    ``salted_hmac`` with :data:`KEY_SPACE_OWNER_SALT`): the one thing every process of a
    deployment shares (its web servers, workers and one-off commands may use different
    settings modules, hosts and paths); the stored digest reveals nothing of the key.
    ``former`` are the same digests made with each of ``SECRET_KEY_FALLBACKS``: while a
    key is rotated the old claim is still this project's and is renewed with the new
    key. ``label`` is the settings module, shown to other projects' operators, never
    compared. ``conf`` defaults to :func:`outbox_settings`. Raises
    ``ImproperlyConfigured`` when ``SECRET_KEY`` is not set (Django's own error).
    """
    prefix = (conf or outbox_settings()).config.key_prefix

    def digest(secret: str | bytes) -> str:
        return salted_hmac(
            KEY_SPACE_OWNER_SALT, prefix, secret=secret, algorithm="sha256"
        ).hexdigest()

    fallbacks = getattr(settings, "SECRET_KEY_FALLBACKS", None) or ()
    return KeySpaceOwner(
        id=digest(settings.SECRET_KEY),
        former=tuple(digest(key) for key in fallbacks if key),
        # (override_settings hides SETTINGS_MODULE; the environment still names it)
        label=getattr(settings, "SETTINGS_MODULE", None)
        or os.environ.get("DJANGO_SETTINGS_MODULE", ""),
    )


#: Hex digits of :func:`key_space_tag`: 48 bits, so projects sharing one channel layer
#: are told apart by chance of one in 2**48 per pair, in a group name of 60 characters.
KEY_SPACE_TAG_LENGTH = 12
#: What the tag's hash is made for (so it stands for nothing else made of the identity).
_TAG_SALT = "django_outbox.key_space_tag"
#: This process's :func:`key_space_tag`, made on first use and forgotten when a setting it
#: is made of changes (:func:`_settings_changed`).
_tag: str | None = None


def key_space_tag() -> str:
    """This project's name on the infrastructure it may share with other projects (a
    channel layer): :data:`KEY_SPACE_TAG_LENGTH` (12) hex digits of SHA-256 over the
    key space owner's identity, ``key_space_owner().id``, which is itself an HMAC of
    ``KEY_PREFIX`` keyed with ``SECRET_KEY``; so it reveals nothing of the key
    (docs/howto/valkey.md#sharing-a-channel-layer). Every process of a deployment computes
    the same tag from the same ``SECRET_KEY`` and ``KEY_PREFIX``; two projects, or two
    key spaces of one, get different ones. Cached per process, rebuilt when ``OUTBOX`` or
    ``SECRET_KEY`` changes. Raises ``ImproperlyConfigured`` when ``SECRET_KEY`` is not
    set or ``OUTBOX`` is invalid.
    """
    global _tag
    tag = _tag
    if tag is None:
        owner = key_space_owner().id
        tag = hashlib.sha256(f"{_TAG_SALT}\x00{owner}".encode()).hexdigest()
        tag = _tag = tag[:KEY_SPACE_TAG_LENGTH]
    return tag


_lock = threading.Lock()
_instance: Outbox | None = None


def get_outbox() -> Outbox:
    """The process-wide :class:`Outbox`, built from ``settings.OUTBOX`` on first use.

    Rebuilt after ``settings.OUTBOX`` (or ``SECRET_KEY``) changes. It carries this
    project's :func:`key_space_owner`: its accepts, cleanups and workers claim the key
    space and refuse another project's (docs/howto/valkey.md#one-project-per-key-space).
    Raises ``ImproperlyConfigured`` for invalid settings.
    """
    global _instance
    with _lock:
        if _instance is None:
            s = outbox_settings()
            _instance = Outbox(
                url=s.valkey_url,
                cluster=s.cluster,
                deliverer=s.resolve("DELIVERER"),
                verifier=s.resolve("VERIFIER"),
                ledger_probe=s.resolve("LEDGER_PROBE"),
                aborter=s.resolve("ABORTER"),
                agents=s.resolve_agents(),
                router=s.resolve_router(),
                config=s.config,
                key_space_owner=key_space_owner(s),
            )
        return _instance


def reset_outbox() -> None:
    """Forget the process-wide instance (closing its sync client)."""
    global _instance
    with _lock:
        if _instance is not None:
            _instance.close()
        _instance = None


@receiver(setting_changed)
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    # The instance is built from what conf.py reads, which depends on these settings
    # (CACHES through CONNECTION_ALIAS, the SECRET_KEYs through key_space_owner); conf.py
    # forgets its own copy on the same signal.
    global _tag
    if setting in ("OUTBOX", "CACHES", "SECRET_KEY", "SECRET_KEY_FALLBACKS"):
        reset_outbox()
        _tag = None
