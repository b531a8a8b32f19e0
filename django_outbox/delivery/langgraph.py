"""Built-in deliverer, verifier, aborter and start-up probe for a LangGraph Agent Server,
over httpx: ``OUTBOX["DELIVERER"] = "django_outbox.delivery.langgraph.deliver"`` & co., with
``OUTBOX["LANGGRAPH"]`` (or an ``AGENTS`` entry's own keys), or a :class:`LangGraphClient`'s
bound methods. One thread per session (:func:`thread_id_for`), one run per entry, the wait
for it, verification by finding it, abort by cancelling it, and how every ending is
classified: docs/howto/langgraph.md.
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
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured

from ..conf import _callable_or_path, _import_callable, outbox_settings
from ..core.agents import Agent, current_agent
from ..core.config import DURATION, Config, ConfigError, _flag, declared, setting
from ..core.entry import Entry, Verdict
from ..core.redaction import remember_secret
from ..errors import AgentMisconfigured, AmbiguousError, HoldDeliveryError, TransientDeliveryError
from . import base
from .base import DEFAULT_MAX_RESPONSE_BYTES, HttpBackend, Made, Unreadable

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
    "session_thread",
    "thread_id_for",
    "verify",
]

#: Default of ``OUTBOX["LANGGRAPH"]["THREAD_NAMESPACE"]`` (:func:`thread_id_for`).
DEFAULT_LANGGRAPH_NAMESPACE = "6f7c2d0e-4b1a-5c8e-9a3d-0d1b2c3e4f50"
#: The run metadata key that carries the entry ID (what the verifier looks for).
ENTRY_KEY = "outbox_entry_id"
#: The run metadata key that carries ``Entry.request_key`` (an edited entry's is new).
REQUEST_KEY = "outbox_request_key"
PAGE_SIZE = 100  # runs per page of the verifier's search
_SELECT = [("select", column) for column in ("run_id", "status", "metadata")]
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
    workspace_id: str,
    session_id: str,
    namespace: str = DEFAULT_LANGGRAPH_NAMESPACE,
    project: str = "",
) -> str:
    """The LangGraph thread ID of an outbox session: ``str(uuid5(namespace,
    f"{project}\\0{workspace_id}\\0{session_id}"))``, where ``project`` is the key-space
    owner's digest (:func:`~django_outbox.outbox.key_space_owner`), so two projects on one
    server never share a thread; without one (``""``), the former
    ``uuid5(namespace, f"{workspace_id}\\0{session_id}")``
    (docs/howto/langgraph.md#threads-and-runs)."""
    name = f"{workspace_id}\0{session_id}"
    return str(uuid.uuid5(uuid.UUID(namespace), f"{project}\0{name}" if project else name))


class LangGraphClient(HttpBackend):
    """Deliver outbox entries to one LangGraph Agent Server as runs on per-session threads.
    The arguments are the settings of docs/howto/langgraph.md#settings in lower case (times
    in seconds), ``project`` the key-space owner's digest in the thread IDs
    (:func:`thread_id_for`; ``""``: none) and ``transport`` an httpx async transport (tests).
    One ``httpx.AsyncClient`` per running event loop; :meth:`aclose` closes that loop's."""

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
        project: str = "",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        remember_secret(api_key)  # never shown, wherever it appears
        self.url = url.rstrip("/")
        self.assistant_id = assistant_id
        self.api_key = api_key
        self.read_timeout = self.request_timeout = float(request_timeout)
        self.thread_namespace = str(uuid.UUID(thread_namespace))
        self.project = project
        self.thread_id_of = _import_callable("OUTBOX['LANGGRAPH']['THREAD_ID']", thread_id)
        self.run_options = _import_callable("OUTBOX['LANGGRAPH']['RUN_OPTIONS']", run_options)
        limits: dict[str, Any] = {"connect_timeout": connect_timeout, "timeout": timeout}
        super().__init__(max_response_bytes=max_response_bytes, transport=transport, **limits)

    def __repr__(self) -> str:
        return f"<LangGraphClient {self.url} {self.assistant_id}>"

    def _credentials(self) -> tuple[dict[str, str], tuple[str, str] | None]:
        return ({} if self.api_key is None else {"X-Api-Key": self.api_key}), None

    def thread_id(self, workspace_id: str, session_id: str) -> str:
        """The session's thread: ``THREAD_ID(workspace_id, session_id)`` when one is given,
        else :func:`thread_id_for` under this client's namespace and project. Raises
        ``ValueError`` when the callable gives no non-empty string."""
        if self.thread_id_of is None:
            return thread_id_for(workspace_id, session_id, self.thread_namespace, self.project)
        found = self.thread_id_of(workspace_id, session_id)
        if not isinstance(found, str) or not found:
            raise ValueError(f"THREAD_ID gave {found!r} for {workspace_id}/{session_id}")
        return found

    async def _json(
        self, method: str, path: str, *, hold: bool = False, **kwargs: Any
    ) -> tuple[int, Any, str]:
        """``(status, parsed 2xx JSON or None, error excerpt)`` of one request. Raises httpx
        errors, :class:`Unreadable`, and with ``hold`` (the delivery's requests)
        :class:`~django_outbox.errors.HoldDeliveryError` (:func:`~.base.refusal`)."""
        client = self._client()
        async with client.stream(method, self.url + path, **kwargs) as response:
            if not 200 <= response.status_code < 300:
                said = base.excerpt(await base.read_excerpt(response))
                if hold:
                    error = LangGraphHTTPError(response.status_code, said, self.url + path)
                    raised = base.refusal(response.status_code, response.headers, error)
                    if isinstance(raised, HoldDeliveryError):
                        raise raised from error
                return response.status_code, None, said
            raw = bytes(await base.read_bounded(response, self.max_response_bytes))
        if not raw.strip():
            return response.status_code, None, ""
        try:
            return response.status_code, json.loads(raw), ""
        except ValueError as exc:
            raise Unreadable(f"an answer that is not JSON: {exc}") from exc

    async def deliver(
        self, entry: Entry, *, workspace_id: str, session_id: str, attempt: int
    ) -> dict[str, str]:
        """Send ``entry`` as a run on the session's thread (made if missing) and wait for the
        run to finish; returns ``{"threadID", "runID"}``, the entry's ``agentRef``. The
        requests and how each ending is classified: docs/howto/langgraph.md#threads-and-runs
        and #outcomes. Cancellation (``DELIVERY_TIMEOUT``) propagates; the run goes on."""
        try:
            thread_id = self.thread_id(workspace_id, session_id)
            extra = await self._run_options(entry, workspace_id, session_id)
        except Exception as exc:  # the app's hook: nothing was sent
            hook = "the LangGraph THREAD_ID or RUN_OPTIONS hook failed"
            raise base.described(LangGraphError, hook, exc) from exc
        ids = {"outbox_workspace_id": workspace_id, "outbox_session_id": session_id}
        await self._ensure_thread(thread_id, ids)
        keys = {ENTRY_KEY: entry.id, REQUEST_KEY: entry.request_key}
        mine = {**keys, **ids, "outbox_user_id": entry.user_id}
        run_id = await self._create_run(entry, thread_id, mine, attempt, extra)
        await self._join(thread_id, run_id)
        return {"threadID": thread_id, "runID": run_id}

    async def _ensure_thread(self, thread_id: str, metadata: dict[str, str]) -> None:
        body = {"thread_id": thread_id, "if_exists": "do_nothing", "metadata": metadata}
        try:
            status, _, excerpt = await self._json("POST", "/threads", hold=True, json=body)
        except base.INVALID_REQUEST as exc:
            raise LangGraphError(f"invalid request to {self.url}/threads: {exc}") from exc
        except (httpx.HTTPError, Unreadable) as exc:
            where = f"could not create the LangGraph thread at {self.url}"
            raise base.described(TransientDeliveryError, where, exc) from exc
        if status >= 500:
            error = LangGraphHTTPError(status, excerpt, f"{self.url}/threads")
            raise TransientDeliveryError(str(error), error) from error
        if not 200 <= status < 300:
            raise LangGraphHTTPError(status, excerpt, f"{self.url}/threads")

    async def _run_options(
        self, entry: Entry, workspace_id: str, session_id: str
    ) -> dict[str, Any]:
        """The ``RUN_OPTIONS`` hook's ``{"config", "context", "metadata"}`` ({} without one; a
        sync hook runs in a thread). Raises ``ValueError`` for another shape."""
        hook = self.run_options
        if hook is None:
            return {}
        call = hook if inspect.iscoroutinefunction(hook) else sync_to_async(hook)
        found = await call(entry, workspace_id=workspace_id, session_id=session_id)
        if inspect.isawaitable(found):  # a sync callable that gave a coroutine
            found = await found
        found = {} if found is None else found
        if not isinstance(found, Mapping) or set(found) - {"config", "context", "metadata"}:
            raise ValueError("RUN_OPTIONS must give a dict of config, context and metadata")
        if not all(isinstance(value, Mapping) for value in found.values()):
            raise ValueError("RUN_OPTIONS' config, context and metadata must be dicts")
        return dict(found)

    async def _create_run(
        self, entry: Entry, thread_id: str, metadata: dict[str, Any], attempt: int, extra: Any
    ) -> str:
        path = f"/threads/{quote(thread_id, safe='')}/runs"
        # A merged delivery: one user message per prompt, in queue order, in one run.
        texts = entry.parts or (entry.text,)
        body: dict[str, Any] = {
            "assistant_id": self.assistant_id,
            "input": {"messages": [{"role": "user", "content": text} for text in texts]},
            # the app's metadata first: the outbox's own keys are never overridden
            "metadata": {**extra.get("metadata", {}), **metadata, "outbox_attempt": attempt},
            "multitask_strategy": "enqueue",
            "if_not_exists": "create",
        }
        model = {} if entry.model is None else {"model": entry.model}
        if context := {**extra.get("context", {}), **model}:
            body["context"] = context
        if "config" in extra:
            body["config"] = dict(extra["config"])
        try:
            status, run, excerpt = await self._json("POST", path, hold=True, json=body)
        except base.NOT_SENT as exc:
            where = f"could not connect to LangGraph at {self.url}"
            raise base.described(TransientDeliveryError, where, exc) from exc
        except base.INVALID_REQUEST as exc:
            raise LangGraphError(f"invalid request to {self.url}{path}: {exc}") from exc
        except (httpx.HTTPError, Unreadable) as exc:
            said = f"sent a run to LangGraph at {self.url} but got no usable answer"
            raise base.described(AmbiguousError, said, exc) from exc
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
                    said = base.excerpt(await base.read_excerpt(response))
                    error = LangGraphHTTPError(response.status_code, said, self.url + path)
                    raise AmbiguousError(
                        f"run {run_id} was created; waiting failed: {error}", error
                    )
                async for _ in response.aiter_raw():
                    pass  # the final state is drained, never kept: only its end matters
        except httpx.HTTPError as exc:
            waited = f"run {run_id} was created on LangGraph at {self.url}; waiting for it failed"
            raise base.described(AmbiguousError, waited, exc) from exc

    async def find_run(self, entry: Entry, *, workspace_id: str, session_id: str) -> Any:
        """The run of ``entry`` (``run_id``, ``status``, ``metadata``, ``thread_id``) on the
        session's thread, else its former one (no project: before the upgrade), or None.
        Raises httpx errors, :class:`Unreadable` or ``ValueError``."""
        thread = self.thread_id(workspace_id, session_id)
        run = await self._find_run_on(entry, thread)
        if run is None and self.project and self.thread_id_of is None:
            thread = thread_id_for(workspace_id, session_id, self.thread_namespace)
            run = await self._find_run_on(entry, thread)
        return None if run is None else {**run, "thread_id": thread}

    async def _find_run_on(self, entry: Entry, thread: str) -> Any:
        """The run of ``entry`` among ``thread``'s (newest first, :data:`PAGE_SIZE` a page,
        at most :data:`MAX_PAGES` pages), or None (none, or no thread: 404)."""
        path = f"/threads/{quote(thread, safe='')}/runs"
        for page in range(MAX_PAGES):
            params = [("limit", str(PAGE_SIZE)), ("offset", str(page * PAGE_SIZE)), *_SELECT]
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

    async def took_input(self, entry: Entry, thread: str) -> bool:
        """Whether the graph took ``entry``'s prompt: a checkpoint of ``thread`` carries its
        ID (``POST .../history``). Raises httpx errors, :class:`Unreadable`, ``ValueError``."""
        path = f"/threads/{quote(thread, safe='')}/history"
        body = {"limit": 1, "metadata": {ENTRY_KEY: entry.id}}
        status, states, _ = await self._json("POST", path, json=body)
        if status != 200 or not isinstance(states, list):
            raise ValueError(f"the thread history answered {status} with {type(states).__name__}")
        return bool(states)

    async def verify(self, entry: Entry, *, workspace_id: str, session_id: str) -> Any:
        """Whether an attempt of ``entry`` whose outcome was unknown reached the server:
        ``(Verdict.DELIVERED, {"threadID", "runID"})`` when its run is found, in any status
        but an ``interrupted`` run that never took its prompt (:meth:`took_input`), else
        ``Verdict.ABSENT``; ``Verdict.INCONCLUSIVE`` for anything unreadable. Never raises
        for network or protocol problems (docs/howto/langgraph.md#outcomes)."""
        try:
            run = await self.find_run(entry, workspace_id=workspace_id, session_id=session_id)
            if run is None:
                return Verdict.ABSENT
            thread = run["thread_id"]
            if run.get("status") == "interrupted" and not await self.took_input(entry, thread):
                return Verdict.ABSENT  # cut before it started: the graph never had the prompt
        except (httpx.HTTPError, Unreadable, ValueError, RecursionError):
            return Verdict.INCONCLUSIVE
        run_id = run.get("run_id")
        if isinstance(run_id, str) and run_id:
            return Verdict.DELIVERED, {"threadID": thread, "runID": run_id}
        return Verdict.DELIVERED

    async def abort(self, entry: Entry, *, workspace_id: str, session_id: str) -> bool:
        """Cancel the pending or running run of ``entry`` (``action=interrupt``): True when
        one was, False when there was none. Raises :class:`LangGraphError`."""
        try:
            run = await self.find_run(entry, workspace_id=workspace_id, session_id=session_id)
        except (httpx.HTTPError, Unreadable, ValueError, RecursionError) as exc:
            where = f"could not find the run to cut on LangGraph at {self.url}"
            raise base.described(LangGraphError, where, exc) from exc
        if run is None or run.get("status") not in ("pending", "running"):
            return False
        thread = quote(run["thread_id"], safe="")
        path = f"/threads/{thread}/runs/{quote(str(run.get('run_id')), safe='')}/cancel"
        try:
            status, _, excerpt = await self._json("POST", path, params={"action": "interrupt"})
        except (httpx.HTTPError, Unreadable) as exc:
            where = f"could not cancel run {run.get('run_id')} on LangGraph at {self.url}"
            raise base.described(LangGraphError, where, exc) from exc
        if status == 404:
            return False  # it finished between the search and the cancel
        if not 200 <= status < 300:
            raise LangGraphHTTPError(status, excerpt, self.url + path)
        return True

    async def probe(self) -> None:
        """Whether the server knows ``assistant_id`` (docs/howto/langgraph.md, the probe):
        raises :class:`~django_outbox.errors.AgentMisconfigured` when it says it does not;
        httpx errors, :class:`Unreadable` or :class:`LangGraphHTTPError` when it cannot tell."""
        try:
            path = f"/assistants/{uuid.UUID(self.assistant_id)}"
            status, found, said = await self._json("GET", path)
        except ValueError:  # a graph name: its assistants
            path, search = "/assistants/search", {"graph_id": self.assistant_id, "limit": 1}
            status, found, said = await self._json("POST", path, json=search)
            if status == 200 and not found:
                status = 404
        if status == 200:
            return
        if status == 404:
            raise AgentMisconfigured(
                f"LangGraph at {self.url} has no assistant or graph {self.assistant_id!r}: "
                "check ASSISTANT_ID (a graph name from langgraph.json, or an assistant's UUID)"
            )
        raise LangGraphHTTPError(status, said, self.url + path)


# --- its settings: OUTBOX["LANGGRAPH"] ------------------------------------------------------------


def _langgraph_url(key: str, value: Any) -> str:
    """An http(s) URL without a trailing slash or credentials (the key goes in API_KEY)."""
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


_WAIT = declared(Config)["delivery_timeout"].default


@dataclass(frozen=True)
class LangGraphSettings:
    """Validated ``OUTBOX["LANGGRAPH"]`` (docs/howto/langgraph.md#settings): each key is a
    field below, in lower case (timeouts in float seconds)."""

    url: str = setting("", kind=_langgraph_url, doc="the LangGraph Agent Server; required")
    assistant_id: str = setting("", kind=_assistant_id, doc="graph name or assistant UUID")
    api_key: str | None = setting(None, kind=_api_key, doc="sent as X-Api-Key; no key when None")
    connect_timeout: float = setting(5.0, kind=DURATION, doc="connecting to the server")
    request_timeout: float = setting(30.0, kind=DURATION, doc="each read of one request")
    timeout: float = setting(_WAIT, kind=DURATION, doc="a run's wait; DELIVERY_TIMEOUT")
    max_response_bytes: int = setting(
        DEFAULT_MAX_RESPONSE_BYTES, kind=base.response_bytes, doc="the most read of one answer"
    )
    thread_namespace: str = setting(DEFAULT_LANGGRAPH_NAMESPACE, kind=_namespace, doc="UUID")
    project_threads: bool = setting(True, kind=_flag, doc="the project in the thread IDs")
    # setting() returns a dataclasses.field, which RUF009 cannot see through this annotation.
    thread_id: Any = setting(None, kind=_callable_or_path, doc="(ws, ses) -> thread ID")  # noqa: RUF009
    run_options: Any = setting(None, kind=_callable_or_path, doc="(entry, ...) -> options")  # noqa: RUF009


def parse_settings(
    raw: Any, delivery_timeout: float, where: str = "OUTBOX['LANGGRAPH']"
) -> LangGraphSettings:
    """Validate ``OUTBOX["LANGGRAPH"]``, or an ``AGENTS`` entry's options (``where`` names it):
    raises ``ImproperlyConfigured`` naming the key and its rule (docs/howto/langgraph.md)."""
    if isinstance(raw, Mapping):  # remembered first: a wrong later key never shows the key
        remember_secret(raw.get("API_KEY"))
    required = ("URL", "ASSISTANT_ID")
    timeout: dict[str, Any] = {"delivery_timeout": delivery_timeout}
    return base.parse_block(LangGraphSettings, raw, where, required=required, **timeout)


#: The name this module's block parser had before (docs/howto/langgraph.md).
langgraph_block = parse_settings

# --- settings-driven module functions: one client per settings object (the block, or an
# AGENTS entry's own keys); a rebuilt one makes a new client, the old kept for aclose().

_made = Made()
_BLOCK = "OUTBOX['LANGGRAPH']"


def _settings_of(agent: Agent | None) -> tuple[object, LangGraphSettings]:
    """``(the object the settings come from, the settings)`` for ``agent``: its options
    when it has any, else ``OUTBOX["LANGGRAPH"]``. Raises ``ImproperlyConfigured``."""
    conf = outbox_settings()
    if agent is not None and agent.options:
        where = f"OUTBOX['AGENTS'][{agent.name!r}]"
        return agent.options, parse_settings(agent.options, conf.config.delivery_timeout, where)
    block: LangGraphSettings | None = conf.blocks.get("LANGGRAPH")
    if block is None:
        raise ImproperlyConfigured(
            "OUTBOX['LANGGRAPH'] (or the AGENTS entry's own URL and ASSISTANT_ID) is required "
            "by django_outbox.delivery.langgraph: docs/howto/langgraph.md#settings"
        )
    return block, block


def client_for(agent: Agent | None = None) -> LangGraphClient:
    """The cached :class:`LangGraphClient` of ``agent`` (default: ``current_agent``), from its
    options or ``OUTBOX["LANGGRAPH"]``. Raises ``ImproperlyConfigured``."""
    served = agent or current_agent.get()
    source, block = _settings_of(served)
    from_block = isinstance(source, LangGraphSettings)
    key = _BLOCK if from_block or served is None else (served.name, id(source))

    def make() -> LangGraphClient:
        from ..outbox import key_space_owner  # (it imports the settings this module serves)

        names = "api_key connect_timeout request_timeout timeout max_response_bytes"
        options = base.settings_kwargs(block, names + " thread_namespace thread_id run_options")
        project = key_space_owner().id if block.project_threads else ""
        return LangGraphClient(block.url, block.assistant_id, project=project, **options)

    client: LangGraphClient = _made.get(key, source, make)
    return client


def session_thread(workspace_id: str, session_id: str, agent: Agent | None = None) -> str:
    """The session's thread as the settings make it (where an app reads its conversation).
    Raises ``ImproperlyConfigured`` and what ``THREAD_ID`` raises."""
    return client_for(agent).thread_id(workspace_id, session_id)


def _validate(name: str, options: Any) -> None:
    """``validate_agent_options`` of the module functions (the start, ``check`` E008)."""
    _settings_of(Agent(name, None, options=options))


async def _resolve(workspace_id: str) -> LangGraphClient:
    return client_for()


# aclose closes the running loop's httpx clients: call it from each loop that used them.
deliver, verify, abort = base.module_face(_resolve, LangGraphClient, __name__, (_validate,) * 3)
aclose = _made.aclose
