"""Helpers shared by the test modules: accepting messages with the suite's defaults,
reading a session's statuses, building entries, polling for a condition, and a
deliverer that blocks until released.

The defaults are workspace ``w1``, session ``s1`` and user ``u``; an accepted
message's text is its client message ID unless given.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django_outbox import Entry
from django_outbox.core.entry import format_time, new_entry_id

WS, SES = "w1", "s1"

#: Tunables for a test whose one user stands in for many (load, faults, paging): the
#: per-user bounds would refuse its bursts, and are tested in tests/operations/test_user_bounds.py.
NO_USER_BOUNDS = {"user_max_queued": 0, "user_accepts_per_minute": 0}

#: Password hashers for a test database whose users' passwords no test is about: Django's
#: default PBKDF2 spends about 0.3 s of CPU on each ``create_user`` (over a second on a
#: loaded machine), so a module creating users in every test spends most of its time there
#: (docs/explanation/testing.md#what-a-test-may-make-faster). Not for a server process
#: whose test relies on Basic auth's hashing time (tests/faults/test_disconnect.py).
QUICK_PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def accept(
    outbox, key: str = "k1", text: str | None = None, *, ws=WS, ses=SES, user="u", **fields
) -> Entry:
    """``outbox.accept`` with the suite's defaults; ``text`` defaults to ``key``.

    ``fields`` (e.g. ``model=``) pass through. Returns the accepted entry and raises what
    ``accept`` raises (``Duplicate``, ``OutboxFull``, ``ValueError``...)."""
    text = key if text is None else text
    return outbox.accept(ws, ses, user_id=user, client_message_id=key, text=text, **fields)


async def aaccept(
    outbox, key: str = "k1", text: str | None = None, *, ws=WS, ses=SES, user="u", **fields
) -> Entry:
    """The async twin of :func:`accept` (``outbox.aaccept``)."""
    text = key if text is None else text
    return await outbox.aaccept(ws, ses, user_id=user, client_message_id=key, text=text, **fields)


def statuses(outbox, *, ws=WS, ses=SES) -> list[tuple[str, str]]:
    """The session's queue as ``(text, status)`` pairs, in queue order."""
    return [(e.text, str(e.status)) for e in outbox.list(ws, ses)]


async def astatuses(outbox, *, ws=WS, ses=SES) -> list[tuple[str, str]]:
    """The async twin of :func:`statuses`."""
    return [(e.text, str(e.status)) for e in await outbox.alist(ws, ses)]


def make_entry(text: str = "hello", **fields) -> Entry:
    """An :class:`Entry` as a deliverer receives it, never stored: a fresh ID, key ``k1``,
    user ``u``, accepted and last attempted now. ``fields`` override any of these."""
    now = format_time(int(time.time() * 1_000_000))
    fields.setdefault("id", new_entry_id())
    fields.setdefault("client_message_id", "k1")
    fields.setdefault("user_id", "u")
    fields.setdefault("accepted_at", now)
    fields.setdefault("last_attempt_at", now)
    return Entry(text=text, **fields)


async def wait_for(
    predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01, message: str = ""
) -> Any:
    """Poll ``predicate`` (sync, or async returning an awaitable) every ``interval`` seconds
    until it returns a truthy value, and return that value; raise ``AssertionError`` after
    ``timeout`` seconds. The async twin of ``django_outbox.testing.wait_until``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"condition not met within {timeout}s: {message}"
        await asyncio.sleep(interval)


class BlockingDeliverer:
    """An async deliverer whose every call blocks until :meth:`release` (a slow agent).

    ``started`` is set when the first call begins; ``calls`` lists each call's entry text.
    Never released, a call blocks until it is cancelled (a hung agent)."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.released = asyncio.Event()
        self.calls: list[str] = []

    async def __call__(self, entry: Entry, **kwargs: Any) -> None:
        self.calls.append(entry.text)
        self.started.set()
        await self.released.wait()

    def release(self) -> None:
        """Let the current call, and every later one, return."""
        self.released.set()


def stop_process(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM ``proc`` and wait up to ``grace`` seconds for it, then SIGKILL it (a server a
    test started must not outlive the test)."""
    proc.terminate()
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@contextmanager
def delivering(workspace_id: str, session_id: str) -> Iterator[None]:
    """While inside: the session's next prompt is being delivered by a real worker pass of
    the project's outbox (``get_outbox()``, in a thread) whose agent waits: a lease held
    in Valkey, as in production. On leaving, the agent returns and the pass ends."""
    from django_outbox import get_outbox

    started, release = threading.Event(), threading.Event()
    outbox = get_outbox()

    async def deliver(entry, **kwargs):  # a slow agent, waiting off the event loop
        started.set()
        await asyncio.to_thread(release.wait, 30)

    async def deliver_once():
        try:
            await outbox.adeliver_once(workspace_id, session_id, deliverer=deliver)
        finally:
            await outbox.aclose()

    worker = threading.Thread(target=asyncio.run, args=(deliver_once(),))
    worker.start()
    try:
        assert started.wait(30), "the worker never started the delivery"
        yield
    finally:
        release.set()
        worker.join(30)


def redis_channel_layers(host: str, **config: Any) -> dict[str, Any]:
    """A ``CHANNEL_LAYERS`` setting of one channels-redis layer on ``host`` (a URL),
    ``config``: its further options (``capacity``, ``expiry``, ``group_expiry``)."""
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [host], **config},
        }
    }
