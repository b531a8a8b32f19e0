"""Built-in deliverer, verifier and abort for a LangGraph Agent Server, over httpx.

Use it from settings (docs/howto/langgraph.md)::

    OUTBOX = {
        "DELIVERER": "django_outbox.delivery.langgraph.deliver",
        "VERIFIER": "django_outbox.delivery.langgraph.verify",
        "LANGGRAPH": {"URL": "http://127.0.0.1:2024", "ASSISTANT_ID": "agent"},
    }

or build a :class:`LangGraphClient` and pass its bound ``deliver`` / ``verify`` /
``abort`` to the outbox. How an outbox session maps onto the server:

* **One thread per session**, with a thread ID nothing needs to store:
  :func:`thread_id_for` is ``uuid5(THREAD_NAMESPACE, workspace_id + NUL + session_id)``.
  The deliverer creates it with ``if_exists: "do_nothing"`` (thread metadata
  ``outbox_workspace_id`` / ``outbox_session_id``), so any worker, after any crash,
  finds the same thread.
* **One run per entry**, created on that thread with the entry's text as the user
  message (``input: {"messages": [{"role": "user", "content": text}]}``; a merged
  delivery puts one user message per merged prompt, in queue order, in that one run), the
  entry's model as ``context: {"model": ...}``) and ``metadata.outbox_entry_id`` =
  the entry ID (``outbox_request_key``: its request key, which an edit changes),
  ``multitask_strategy: "enqueue"`` (a run still going on the thread
  is never cut by the next prompt: it waits its turn on the server).
* The deliverer **waits for the run to finish** (``GET .../runs/{run_id}/join``)
  for at most ``TIMEOUT`` (and the outbox's ``DELIVERY_TIMEOUT``); longer is
  ambiguous, and the verifier decides.
* The verifier **finds the run by its metadata** among the thread's runs (newest
  first, paged). Any run carrying the entry ID means the server has the prompt:
  DELIVERED, whatever its status — ``success``, and also ``error``/``timeout``
  (the agent's own turn failed after it received the prompt; sending it again
  would put it on the thread twice), ``interrupted`` (cut after it was received),
  ``pending``/``running`` (the server holds it and will run it). One exception: an
  ``interrupted`` run that never started (cut while it waited its turn: LangGraph
  marks a cancelled pending run ``interrupted`` too) left the prompt off the thread;
  the verifier tells them apart by the thread's history, where each checkpoint a run
  writes carries the run's metadata — none with the entry ID → ABSENT. No such run →
  ABSENT. Anything unreadable → INCONCLUSIVE.
* :func:`abort` **cancels that run** (``POST .../runs/{run_id}/cancel``,
  ``action=interrupt``: the thread keeps what the turn did so far).

Errors (docs/explanation/lifecycle.md#what-happens-to-a-message): nothing of the
prompt is sent before the run is created, so every failure to create the thread,
and a refused connection for the run, is transient; a timeout, a cut connection
or a 5xx answer to the run's creation is ambiguous (the server may have stored it);
a 429 with a readable ``Retry-After`` to either holds the session that long without
using an attempt (:class:`~django_outbox.errors.HoldDeliveryError`: a rate limit, nothing
was taken); another 3xx/4xx is a definitive failure (:class:`LangGraphHTTPError`). Every
answer is read up to ``MAX_RESPONSE_BYTES`` (the join's final state is drained,
never kept); the API key goes to the server's origin only, and error texts hold at
most a 500-character excerpt of an answer, redacted.
"""

from __future__ import annotations

import inspect
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured

# The OUTBOX settings' own rule and import for a callable or its dotted path.
from ..conf import _callable_or_path, _import_callable, outbox_settings
from ..core.agents import Agent, current_agent
from ..core.config import DURATION, Config, ConfigError, declared, setting
from ..core.entry import Entry, Verdict
from ..core.redaction import redact, remember_secret
from ..errors import AmbiguousError, HoldDeliveryError, TransientDeliveryError
from . import base
from .base import (
    DEFAULT_MAX_RESPONSE_BYTES,
    HttpBackend,
    Made,
    Unreadable,
    module_face,
    parse_block,
    response_bytes,
)

__all__ = [
    "ENTRY_KEY",
    "REQUEST_KEY",
    "LangGraphClient",
    "LangGraphError",
    "LangGraphHTTPError",
    "LangGraphSettings",
    "abort",
    "aclose",
    "client_for",
    "deliver",
    "parse_settings",
    "thread_id_for",
    "verify",
]

#: Default of ``OUTBOX["LANGGRAPH"]["THREAD_NAMESPACE"]``: the UUID namespace of the
#: thread IDs (uuid5 of workspace and session; docs/howto/langgraph.md).
DEFAULT_LANGGRAPH_NAMESPACE = "6f7c2d0e-4b1a-5c8e-9a3d-0d1b2c3e4f50"
#: The run metadata key that carries the entry ID (what the verifier looks for).
ENTRY_KEY = "outbox_entry_id"
#: The run metadata key that carries the request's idempotency key (``Entry.request_key``):
#: a run made for an earlier revision of the entry (before an edit) is not this request's.
REQUEST_KEY = "outbox_request_key"
PAGE_SIZE = 100  # runs per page of the verifier's search
MAX_PAGES = 50  # pages the verifier reads before it calls the search inconclusive


class LangGraphError(Exception):
    """A definitive delivery failure reported by this module (not ambiguous, not transient)."""


class LangGraphHTTPError(LangGraphError):
    """The server answered a status that refuses the request. ``status`` (int), ``body``
    (redacted excerpt, str), ``url``."""

    def __init__(self, status: int, body: str, url: str) -> None:
        self.status = status
        self.body = body
        self.url = url
        excerpt = f": {body}" if body else ""
        super().__init__(f"LangGraph answered HTTP {status} for {url}{excerpt}")


def thread_id_for(
    workspace_id: str, session_id: str, namespace: str = DEFAULT_LANGGRAPH_NAMESPACE
) -> str:
    """The LangGraph thread ID of an outbox session: ``str(uuid5(namespace,
    f"{workspace_id}\\0{session_id}"))``. The same for every worker and every attempt;
    two projects on one server keep apart with their own ``THREAD_NAMESPACE``."""
    return str(uuid.uuid5(uuid.UUID(namespace), f"{workspace_id}\0{session_id}"))


class LangGraphClient(HttpBackend):
    """Deliver outbox entries to one LangGraph Agent Server as runs on per-session threads.

    ``url``: the server, e.g. ``"http://127.0.0.1:2024"`` (a path prefix is kept).
    ``assistant_id``: the graph name (from ``langgraph.json``) or an assistant's UUID.
    ``api_key``: sent as ``X-Api-Key`` on every request (to ``url``'s origin only);
    none when None. ``connect_timeout`` (seconds): to establish a connection.
    ``request_timeout`` (seconds): each read of a thread, run, search or cancel
    request. ``timeout`` (seconds): waiting for a run to finish (the join).
    ``max_response_bytes``: the most read of one answer. ``thread_namespace``: the
    UUID namespace of :func:`thread_id_for`. ``transport``: an httpx async
    transport (tests).

    One ``httpx.AsyncClient`` per running event loop; :meth:`aclose` closes the
    running loop's one.
    """

    def __init__(
        self,
        url: str,
        assistant_id: str,
        *,
        api_key: str | None = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 30.0,
        timeout: float = 600.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        thread_namespace: str = DEFAULT_LANGGRAPH_NAMESPACE,
        thread_id: Callable[[str, str], str] | str | None = None,
        run_options: Callable[..., Any] | str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        remember_secret(api_key)  # never shown, wherever it appears
        self.url = url.rstrip("/")
        self.assistant_id = assistant_id
        self.api_key = api_key
        self.read_timeout = self.request_timeout = float(request_timeout)
        self.thread_namespace = str(uuid.UUID(thread_namespace))
        self.thread_id_of = _import_callable("OUTBOX['LANGGRAPH']['THREAD_ID']", thread_id)
        self.run_options = _import_callable("OUTBOX['LANGGRAPH']['RUN_OPTIONS']", run_options)
        limits: dict[str, Any] = {"connect_timeout": connect_timeout, "timeout": timeout}
        super().__init__(max_response_bytes=max_response_bytes, transport=transport, **limits)

    def __repr__(self) -> str:
        return f"<LangGraphClient {self.url} {self.assistant_id}>"

    # -- the httpx client of the running loop ------------------------------------

    def _credentials(self) -> tuple[dict[str, str], tuple[str, str] | None]:
        return ({} if self.api_key is None else {"X-Api-Key": self.api_key}), None

    def thread_id(self, workspace_id: str, session_id: str) -> str:
        """The session's thread: ``thread_id(workspace_id, session_id)`` when one is given
        (a thread your app made, e.g. one per conversation in your database: it must give
        the same ID every time), else :func:`thread_id_for` under this client's namespace.
        Raises ``ValueError`` when the callable gives no non-empty string."""
        if self.thread_id_of is None:
            return thread_id_for(workspace_id, session_id, self.thread_namespace)
        found = self.thread_id_of(workspace_id, session_id)
        if not isinstance(found, str) or not found:
            raise ValueError(f"THREAD_ID gave {found!r} for {workspace_id}/{session_id}")
        return found

    # -- reading answers -------------------------------------------------------------

    async def _read(self, response: httpx.Response, limit: int) -> bytes:
        """The body of ``response``, at most ``limit`` bytes (raw: no decompression).
        Raises :class:`Unreadable` for a larger or compressed one, httpx errors as is."""
        return bytes(await base.read_bounded(response, limit))

    async def _error_body(self, response: httpx.Response) -> str:
        """A redacted excerpt of an error answer (at most 2,000 bytes are read)."""
        return base.excerpt(await base.read_excerpt(response))

    async def _json(
        self, method: str, path: str, *, hold: bool = False, **kwargs: Any
    ) -> tuple[int, Any, str]:
        """``(status, parsed JSON or None, error excerpt)`` of one request to the server.
        A 2xx body is parsed (up to ``max_response_bytes``); another status gives its
        excerpt. Raises httpx errors and :class:`Unreadable` (a 2xx that is not JSON);
        with ``hold`` (the delivery's requests) also
        :class:`~django_outbox.errors.HoldDeliveryError` for a 429 or 503 with a
        ``Retry-After``: the request was not taken, and the session waits without using an
        attempt, as with every agent (:func:`~django_outbox.delivery.base.refusal`)."""
        client = self._client()
        async with client.stream(method, self.url + path, **kwargs) as response:
            if not 200 <= response.status_code < 300:
                said = await self._error_body(response)
                if hold:
                    error = LangGraphHTTPError(response.status_code, said, self.url + path)
                    raised = base.refusal(response.status_code, response.headers, error)
                    if isinstance(raised, HoldDeliveryError):
                        raise raised from error
                return response.status_code, None, said
            raw = await self._read(response, self.max_response_bytes)
        if not raw.strip():
            return response.status_code, None, ""
        try:
            return response.status_code, json.loads(raw), ""
        except ValueError as exc:
            raise Unreadable(f"an answer that is not JSON: {exc}") from exc

    # -- deliver -------------------------------------------------------------------

    async def deliver(
        self, entry: Entry, *, workspace_id: str, session_id: str, attempt: int
    ) -> None:
        """Send ``entry`` as a run on the session's thread and wait for it to finish.

        1. ``POST {url}/threads`` ``{"thread_id": thread_id_for(...), "if_exists":
           "do_nothing", "metadata": {...}}``. Nothing of the prompt is sent yet, so a
           failure here is :class:`TransientDeliveryError` (refused, timed out, cut,
           5xx), except a 3xx/4xx: :class:`LangGraphHTTPError` (definitive: a wrong
           key, a wrong URL).
        2. ``POST {url}/threads/{thread_id}/runs`` with the assistant, the input
           ``{"messages": [{"role": "user", "content": entry.text}]}`` (a merged
           delivery: one such message per prompt, in queue order), ``context:
           {"model": entry.model}`` when the entry has one, ``metadata``
           (``outbox_entry_id``, ``outbox_request_key``, ``outbox_workspace_id``,
           ``outbox_session_id``, ``outbox_attempt``), ``multitask_strategy: "enqueue"`` and
           ``if_not_exists: "create"``. Refused before sending →
           :class:`TransientDeliveryError`; timeout, cut connection, 5xx, or a 2xx
           without a run ID → :class:`AmbiguousError` (the verifier looks for the run);
           3xx/4xx → :class:`LangGraphHTTPError`. In both steps a 429 with a readable
           ``Retry-After`` → :class:`~django_outbox.errors.HoldDeliveryError`.
        3. ``GET {url}/threads/{thread_id}/runs/{run_id}/join``, read to its end
           (at most ``timeout`` between two reads): returns when the run has finished,
           in any status (an ``error`` run received the prompt: see the module
           docstring). Any failure here → :class:`AmbiguousError`.

        Cancellation (the outbox's ``DELIVERY_TIMEOUT``) propagates; the run goes on.
        """
        try:
            thread_id = self.thread_id(workspace_id, session_id)
            extra = await self._run_options(entry, workspace_id, session_id)
        except Exception as exc:  # the app's hook: nothing was sent
            raise LangGraphError(
                f"the LangGraph THREAD_ID or RUN_OPTIONS hook failed: {type(exc).__name__}: "
                f"{redact(str(exc))}"
            ) from exc
        ids = {"outbox_workspace_id": workspace_id, "outbox_session_id": session_id}
        await self._ensure_thread(thread_id, ids)
        keys = {ENTRY_KEY: entry.id, REQUEST_KEY: entry.request_key}
        mine = {**keys, **ids, "outbox_user_id": entry.user_id}
        run_id = await self._create_run(entry, thread_id, mine, attempt, extra)
        await self._join(thread_id, run_id)

    async def _ensure_thread(self, thread_id: str, metadata: dict[str, str]) -> None:
        body = {"thread_id": thread_id, "if_exists": "do_nothing", "metadata": metadata}
        try:
            status, _, excerpt = await self._json("POST", "/threads", hold=True, json=body)
        except base.INVALID_REQUEST as exc:
            raise LangGraphError(f"invalid request to {self.url}/threads: {exc}") from exc
        except (httpx.HTTPError, Unreadable) as exc:
            raise TransientDeliveryError(
                f"could not create the LangGraph thread at {self.url}: "
                f"{type(exc).__name__}: {redact(str(exc))}",
                exc,
            ) from exc
        if status >= 500:
            error = LangGraphHTTPError(status, excerpt, f"{self.url}/threads")
            raise TransientDeliveryError(str(error), error) from error
        if not 200 <= status < 300:
            raise LangGraphHTTPError(status, excerpt, f"{self.url}/threads")

    async def _run_options(
        self, entry: Entry, workspace_id: str, session_id: str
    ) -> dict[str, Any]:
        """The ``RUN_OPTIONS`` hook's ``{"config", "context", "metadata"}`` for this entry's
        run ({} without a hook; sync or async). Raises ``ValueError`` for another shape."""
        if self.run_options is None:
            return {}
        found = self.run_options(entry, workspace_id=workspace_id, session_id=session_id)
        if inspect.isawaitable(found):
            found = await found
        found = {} if found is None else found
        if not isinstance(found, Mapping) or set(found) - {"config", "context", "metadata"}:
            raise ValueError("RUN_OPTIONS must give a dict of config, context and metadata")
        if not all(isinstance(value, Mapping) for value in found.values()):
            raise ValueError("RUN_OPTIONS' config, context and metadata must be dicts")
        return dict(found)

    async def _create_run(
        self,
        entry: Entry,
        thread_id: str,
        metadata: dict[str, Any],
        attempt: int,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        path = f"/threads/{quote(thread_id, safe='')}/runs"
        extra = extra or {}
        body: dict[str, Any] = {
            "assistant_id": self.assistant_id,
            # A merged delivery: one user message per prompt, in queue order, in one run.
            "input": {
                "messages": [
                    {"role": "user", "content": text} for text in (entry.parts or (entry.text,))
                ]
            },
            # the app's metadata first: the outbox's own keys are never overridden
            "metadata": {**extra.get("metadata", {}), **metadata, "outbox_attempt": attempt},
            "multitask_strategy": "enqueue",
            "if_not_exists": "create",
        }
        context = {**extra.get("context", {})}
        if entry.model is not None:
            context["model"] = entry.model
        if context:
            body["context"] = context
        if "config" in extra:
            body["config"] = dict(extra["config"])
        try:
            status, run, excerpt = await self._json("POST", path, hold=True, json=body)
        except base.NOT_SENT as exc:
            raise TransientDeliveryError(
                f"could not connect to LangGraph at {self.url}: {type(exc).__name__}: "
                f"{redact(str(exc))}",
                exc,
            ) from exc
        except base.INVALID_REQUEST as exc:
            raise LangGraphError(f"invalid request to {self.url}{path}: {exc}") from exc
        except (httpx.HTTPError, Unreadable) as exc:
            raise AmbiguousError(
                f"sent a run to LangGraph at {self.url} but got no usable answer: "
                f"{type(exc).__name__}: {redact(str(exc))}".rstrip(": "),
                exc,
            ) from exc
        if not 200 <= status < 300:
            error = LangGraphHTTPError(status, excerpt, self.url + path)
            if status >= 500:
                raise AmbiguousError(str(error), error) from error
            raise error
        run_id = run.get("run_id") if isinstance(run, dict) else None
        if not isinstance(run_id, str) or not run_id:
            raise AmbiguousError(f"LangGraph at {self.url} created a run but named no run_id")
        return run_id

    async def _join(self, thread_id: str, run_id: str) -> None:
        path = f"/threads/{quote(thread_id, safe='')}/runs/{quote(run_id, safe='')}/join"
        limits = httpx.Timeout(self.timeout, connect=self.connect_timeout)
        try:
            async with self._client().stream("GET", self.url + path, timeout=limits) as response:
                if not 200 <= response.status_code < 300:
                    error = LangGraphHTTPError(
                        response.status_code, await self._error_body(response), self.url + path
                    )
                    raise AmbiguousError(
                        f"run {run_id} was created; waiting for it failed: {error}", error
                    )
                async for _ in response.aiter_raw():
                    pass  # the final state is drained, never kept: only its end matters
        except httpx.HTTPError as exc:
            waited = f"run {run_id} was created on LangGraph at {self.url}; waiting for it failed"
            raise base.described(AmbiguousError, waited, exc) from exc

    # -- verify ----------------------------------------------------------------------

    async def find_run(self, entry: Entry, *, workspace_id: str, session_id: str) -> Any:
        """The run of ``entry`` on the session's thread (a dict with ``run_id``,
        ``status``, ``metadata``), or None when the thread has no run carrying its ID
        (or no thread at all: 404).

        Pages through ``GET {url}/threads/{thread_id}/runs`` (newest first, 100 a page,
        at most 50 pages). Raises httpx errors, :class:`Unreadable` (an answer too
        large or not JSON), ``ValueError`` (an unexpected shape, another status, or
        more pages than that)."""
        path = f"/threads/{quote(self.thread_id(workspace_id, session_id), safe='')}/runs"
        for page in range(MAX_PAGES):
            params = [
                ("limit", str(PAGE_SIZE)),
                ("offset", str(page * PAGE_SIZE)),
                *(("select", column) for column in ("run_id", "status", "metadata")),
            ]
            status, runs, _ = await self._json("GET", path, params=params)
            if status == 404 and page == 0:
                return None  # no thread: no run was ever created on it
            if status != 200 or not isinstance(runs, list):
                raise ValueError(f"the run search answered {status} with {type(runs).__name__}")
            for run in runs:
                if not isinstance(run, dict) or not isinstance(run.get("metadata"), dict | None):
                    raise ValueError("a run that is not an object with a metadata object")
                said = run.get("metadata") or {}
                key = said.get(REQUEST_KEY, entry.request_key)  # (older runs carry none)
                if said.get(ENTRY_KEY) == entry.id and key == entry.request_key:
                    return run
            if len(runs) < PAGE_SIZE:
                return None
        raise ValueError(f"more than {MAX_PAGES * PAGE_SIZE} runs on the thread")

    async def took_input(self, entry: Entry, *, workspace_id: str, session_id: str) -> bool:
        """Whether a run of ``entry`` started, i.e. the graph took its prompt: the
        session's thread has a checkpoint whose metadata carries the entry ID (LangGraph
        copies a run's metadata into every checkpoint the run writes, the first as it
        takes its input). ``POST {url}/threads/{thread_id}/history`` with ``{"limit": 1,
        "metadata": {"outbox_entry_id": ...}}``. Raises httpx errors,
        :class:`Unreadable`, ``ValueError`` (another status, an unexpected shape)."""
        path = f"/threads/{quote(self.thread_id(workspace_id, session_id), safe='')}/history"
        body = {"limit": 1, "metadata": {ENTRY_KEY: entry.id}}
        status, states, _ = await self._json("POST", path, json=body)
        if status != 200 or not isinstance(states, list):
            raise ValueError(f"the thread history answered {status} with {type(states).__name__}")
        return bool(states)

    async def verify(self, entry: Entry, *, workspace_id: str, session_id: str) -> Verdict:
        """Whether an attempt of ``entry`` whose outcome was unknown reached the server.

        A run carrying the entry ID on the session's thread → DELIVERED, in any status
        (see the module docstring), except an ``interrupted`` run that never started
        (:meth:`took_input` is False: cut while it waited its turn) → ABSENT; no run
        (or no thread) → ABSENT; anything else (network error, timeout, another status,
        an answer too large or not JSON, an unexpected shape, more than 5,000 runs) →
        INCONCLUSIVE. Never raises for network or protocol problems. A run creation
        still on its way while we look is missed: the outbox's ``VERIFY_DELAY`` must
        cover that.
        """
        where = {"workspace_id": workspace_id, "session_id": session_id}
        try:
            run = await self.find_run(entry, **where)
            if run is None:
                return Verdict.ABSENT
            if run.get("status") == "interrupted" and not await self.took_input(entry, **where):
                return Verdict.ABSENT  # cut before it started: the graph never had the prompt
        except (httpx.HTTPError, Unreadable, ValueError, RecursionError):
            return Verdict.INCONCLUSIVE
        return Verdict.DELIVERED

    # -- abort -----------------------------------------------------------------------

    async def abort(self, entry: Entry, *, workspace_id: str, session_id: str) -> bool:
        """Cut the run of ``entry``: ``POST .../runs/{run_id}/cancel?action=interrupt``.

        Returns True when a pending or running run was cancelled, False when there was
        nothing to cut (no such run, or it had finished). The run ends ``interrupted``
        and stays on the thread with what it did so far, so the verifier finds it
        (DELIVERED); a run cut while still ``pending`` never took its prompt, and the
        verifier calls it ABSENT (the cut prompt ends cancelled, never sent). Raises
        :class:`LangGraphError` when the server cannot be asked (network, an unreadable
        search) or refuses (:class:`LangGraphHTTPError`).
        """
        try:
            run = await self.find_run(entry, workspace_id=workspace_id, session_id=session_id)
        except (httpx.HTTPError, Unreadable, ValueError, RecursionError) as exc:
            raise LangGraphError(
                f"could not find the run to cut on LangGraph at {self.url}: "
                f"{type(exc).__name__}: {redact(str(exc))}"
            ) from exc
        if run is None or run.get("status") not in ("pending", "running"):
            return False
        thread = quote(self.thread_id(workspace_id, session_id), safe="")
        path = f"/threads/{thread}/runs/{quote(str(run.get('run_id')), safe='')}/cancel"
        try:
            status, _, excerpt = await self._json("POST", path, params={"action": "interrupt"})
        except (httpx.HTTPError, Unreadable) as exc:
            raise LangGraphError(
                f"could not cancel run {run.get('run_id')} on LangGraph at {self.url}: "
                f"{type(exc).__name__}: {redact(str(exc))}"
            ) from exc
        if status == 404:
            return False  # it finished between the search and the cancel
        if not 200 <= status < 300:
            raise LangGraphHTTPError(status, excerpt, self.url + path)
        return True


# --- its settings: OUTBOX["LANGGRAPH"] ------------------------------------------------------------


def _langgraph_url(key: str, value: Any) -> str:
    """An http(s) URL without a trailing slash and without credentials (the key goes in
    API_KEY); a URL's credentials are remembered for redaction all the same."""
    url, why = base.http_url(value, "http://127.0.0.1:2024")
    if url is None:
        raise ConfigError(key, why)
    if "@" in urlsplit(url).netloc:
        raise ConfigError(key, "must not carry credentials; set API_KEY instead")
    return url


def _assistant_id(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(key, "must be a non-empty string (a graph name or assistant UUID)")
    return value


def _api_key(key: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or any(c in value for c in "\r\n"):
        raise ConfigError(key, "must be a non-empty string on one line, or None")
    return value


def _namespace(key: str, value: Any) -> str:
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ConfigError(key, f"must be a UUID, got {value!r}") from None


@dataclass(frozen=True)
class LangGraphSettings:
    """Validated ``OUTBOX["LANGGRAPH"]`` (docs/howto/langgraph.md): each key is a field
    below, in lower case. ``url`` is stored without a trailing slash, timeouts in float
    seconds, ``thread_namespace`` as a canonical UUID string."""

    url: str = setting("", kind=_langgraph_url, doc="the LangGraph Agent Server; required")
    assistant_id: str = setting(
        "", kind=_assistant_id, doc="the graph name or assistant ID each run uses; required"
    )
    api_key: str | None = setting(None, kind=_api_key, doc="sent as X-Api-Key; no key when None")
    connect_timeout: float = setting(5.0, kind=DURATION, doc="connecting to the server")
    request_timeout: float = setting(
        30.0, kind=DURATION, doc="each read of a thread, run, search or cancel request"
    )
    timeout: float = setting(
        declared(Config)["delivery_timeout"].default,
        kind=DURATION,
        doc="waiting for a run to finish; the default is DELIVERY_TIMEOUT",
    )
    max_response_bytes: int = setting(
        DEFAULT_MAX_RESPONSE_BYTES, kind=response_bytes, doc="the most read of one answer"
    )
    thread_namespace: str = setting(
        DEFAULT_LANGGRAPH_NAMESPACE,
        kind=_namespace,
        doc="the UUID namespace of the thread IDs",
    )
    # setting() returns a dataclasses.field, which RUF009 cannot see through this annotation.
    thread_id: Callable[[str, str], str] | str | None = setting(  # noqa: RUF009
        None,
        kind=_callable_or_path,
        doc="(workspace_id, session_id) -> an existing thread's ID, or its path; None: uuid5",
    )
    run_options: Callable[..., Any] | str | None = setting(  # noqa: RUF009
        None,
        kind=_callable_or_path,
        doc="(entry, workspace_id, session_id) -> {config, context, metadata} of its run",
    )


def parse_settings(
    raw: Any, delivery_timeout: float, where: str = "OUTBOX['LANGGRAPH']"
) -> LangGraphSettings:
    """Validate one LangGraph block: ``OUTBOX["LANGGRAPH"]`` (``django_outbox.conf`` calls it
    when the block is set), or the options of an ``AGENTS`` entry (``where`` names it in the
    errors). Raises ``ImproperlyConfigured`` naming the key and its rule
    (docs/howto/langgraph.md#settings)."""
    if isinstance(raw, Mapping):  # remembered first: a wrong later key never shows the key
        remember_secret(raw.get("API_KEY"))
    return parse_block(
        LangGraphSettings,
        raw,
        where,
        delivery_timeout=delivery_timeout,
        required=("URL", "ASSISTANT_ID"),
    )


#: The name this module's block parser had before (docs/howto/langgraph.md).
langgraph_block = parse_settings

# --- settings-driven module functions ---------------------------------------------
#
# The settings are OUTBOX["LANGGRAPH"] (parse_settings above, for django_outbox.conf), or,
# for an OUTBOX["AGENTS"] entry that carries its own keys (URL, ASSISTANT_ID, ...), that
# entry's options, parsed by the same rules (docs/howto/agents.md). One client per settings
# object: when they are rebuilt, the next client_for() makes a new one and keeps the old
# for aclose().

_made = Made()
#: The key of the client made from ``OUTBOX["LANGGRAPH"]`` (a rebuilt block replaces it).
_BLOCK = "OUTBOX['LANGGRAPH']"


def _entry(name: str) -> str:
    return f"OUTBOX['AGENTS'][{name!r}]"


def _settings_of(agent: Agent | None) -> tuple[object, LangGraphSettings]:
    """``(the object the settings come from, the settings)`` for ``agent``: its options
    when it has any, else ``OUTBOX["LANGGRAPH"]``. Raises ``ImproperlyConfigured``."""
    conf = outbox_settings()
    if agent is not None and agent.options:
        where = _entry(agent.name)
        return agent.options, parse_settings(agent.options, conf.config.delivery_timeout, where)
    block: LangGraphSettings | None = conf.blocks.get("LANGGRAPH")
    if block is None:
        raise ImproperlyConfigured(
            "OUTBOX['LANGGRAPH'] (or the AGENTS entry's own URL and ASSISTANT_ID) is required "
            "by django_outbox.delivery.langgraph: docs/howto/langgraph.md#settings"
        )
    return block, block


def client_for(agent: Agent | None = None) -> LangGraphClient:
    """The cached :class:`LangGraphClient` of ``agent`` (default: the agent the worker
    serves now, :data:`~django_outbox.core.agents.current_agent`): built from its
    options when it has any, else from ``OUTBOX["LANGGRAPH"]``. Raises
    ``ImproperlyConfigured`` when neither gives valid settings."""
    served = agent or current_agent.get()
    source, block = _settings_of(served)
    from_block = isinstance(source, LangGraphSettings)
    key = _BLOCK if from_block or served is None else (served.name, id(source))

    def make() -> LangGraphClient:
        names = "api_key connect_timeout request_timeout timeout max_response_bytes"
        more = " thread_namespace thread_id run_options"
        options = base.settings_kwargs(block, names + more)
        return LangGraphClient(block.url, block.assistant_id, **options)

    client: LangGraphClient = _made.get(key, source, make)
    return client


def _validate(name: str, options: Any) -> None:
    """``validate_agent_options`` of the callables below: an ``AGENTS`` entry naming them
    is checked at start-up and by ``manage.py check`` (E008)."""
    _settings_of(Agent(name, None, options=options))


async def _resolve(workspace_id: str) -> LangGraphClient:
    return client_for()


# A merged delivery is one run whose input holds a user message per prompt. aclose closes
# the running loop's httpx clients of the current (and replaced) clients: call it from each
# event loop that used this module before that loop ends.
deliver, verify, abort = module_face(_resolve, LangGraphClient, __name__, (_validate,) * 3)
aclose = _made.aclose
