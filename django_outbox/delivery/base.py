"""What every built-in HTTP agent shares, written once: the client per event loop, bounded
reads, the request that carries a prompt and how its answer is classified, the backends made
from settings and the module functions a setting names
(docs/howto/agents.md#what-every-agent-carries). Each backend keeps only its protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import math
import re
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Hashable, Mapping
from datetime import UTC
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured

from ..core.config import ConfigError, declared, kinds
from ..core.entry import Entry
from ..core.redaction import redact, remember_url
from ..errors import AmbiguousError, HoldDeliveryError, TransientDeliveryError

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "EXCERPT_CHARS",
    "INVALID_REQUEST",
    "LONGEST_RETRY_AFTER",
    "NOT_SENT",
    "AgentRefused",
    "HttpBackend",
    "Made",
    "Unreadable",
    "described",
    "excerpt",
    "http_url",
    "module_face",
    "origin",
    "parse_block",
    "parse_retry_after",
    "read_bounded",
    "read_excerpt",
    "refusal",
    "response_bytes",
]

#: Characters of an error answer kept in an exception's text (whitespace collapsed).
EXCERPT_CHARS = 500
#: Bytes read of an error answer for its excerpt.
EXCERPT_BYTES = 4 * EXCERPT_CHARS
#: Errors httpx raises only before any of the request was written: nothing reached the
#: agent, so the attempt is transient.
NOT_SENT: tuple[type[Exception], ...] = (
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    httpx.ProxyError,
)
#: No valid request could be formed (a bad URL, a header httpx refuses): definitive.
INVALID_REQUEST: tuple[type[Exception], ...] = (
    httpx.LocalProtocolError,
    httpx.UnsupportedProtocol,
    httpx.InvalidURL,
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_REDIRECTS = 5


class Unreadable(Exception):
    """An answer not read: larger than the limit, or compressed though none was asked for;
    the agents raise it too for what they will not follow or parse (a next link elsewhere,
    not JSON)."""


class AgentRefused(Exception):
    """A definitive refusal by an agent, what :meth:`HttpBackend._refused` gives unless the
    backend has its own error: ``status`` (0: no answer, e.g. a redirect not followed),
    ``url`` and ``body`` (a short excerpt), all redacted (docs/explanation/security.md)."""

    def __init__(self, status: int, url: str, body: str) -> None:
        self.status, self.url, self.body = status, redact(url), redact(body)
        text = f"the agent answered HTTP {status} for {self.url}" if status else self.url
        super().__init__(text + (f": {self.body}" if self.body else ""))


class HttpBackend:
    """The base of a built-in agent's client: :meth:`_new_client` makes the httpx client
    (the subclass says how), :meth:`_client` gives the running loop's one, :meth:`aclose`
    closes it, :attr:`has_clients` tells whether some loop still holds one open.

    ``connect_timeout`` (seconds): to establish a connection; ``timeout`` (seconds): the
    delivery's deadline (each backend says what it covers); ``max_response_bytes``: the most
    read of one answer; ``transport``: an httpx async transport (tests)."""

    def __init__(
        self,
        *,
        connect_timeout: float,
        timeout: float,
        max_response_bytes: int,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.connect_timeout = float(connect_timeout)
        self.timeout = float(timeout)
        self.max_response_bytes = int(max_response_bytes)
        self._transport = transport
        self._lock = threading.Lock()
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = (
            weakref.WeakKeyDictionary()
        )

    #: Seconds one read of the client may wait by default (None: ``timeout``).
    read_timeout: float | None = None

    def _credentials(self) -> tuple[dict[str, str], tuple[str, str] | None]:
        """``(headers, Basic auth or None)`` the backend's every request carries (its
        credentials: to its own origin only, never shown)."""
        return {}, None

    def _new_client(self) -> httpx.AsyncClient:
        headers, auth = self._credentials()
        read = self.timeout if self.read_timeout is None else self.read_timeout
        return httpx.AsyncClient(
            auth=auth,
            timeout=httpx.Timeout(read, connect=self.connect_timeout),
            transport=self._transport,
            follow_redirects=False,  # credentials go to the agent's origin only
            # identity: what is read is what is counted (no decompression bomb)
            headers={"Accept": "application/json", "Accept-Encoding": "identity", **headers},
        )

    def _client(self) -> httpx.AsyncClient:
        """The running loop's client (a client is bound to the loop it was made on), made on
        first use or after it was closed. Raises ``RuntimeError`` outside a running loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._clients.get(loop)
            if client is None or client.is_closed:
                client = self._clients[loop] = self._new_client()
            return client

    async def aclose(self) -> None:
        """Close the running loop's httpx client (a no-op if it has none)."""
        with self._lock:
            client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    @property
    def has_clients(self) -> bool:
        """True while some event loop still holds an open httpx client of this object."""
        with self._lock:
            return any(not c.is_closed for c in self._clients.values())

    def _refused(self, status: int, url: str, said: str) -> Exception:
        """The backend's definitive error for an answer of ``status`` to ``url`` (``said``:
        a redacted excerpt of its body); also raised for a redirect it does not follow.
        :class:`AgentRefused` unless the backend names its own."""
        return AgentRefused(status, url, said)

    async def _exchange(
        self, method: str, url: str, seconds: float, *, body: Any = None, key: str = ""
    ) -> tuple[int, httpx.Headers, bytes]:
        """One request (``body`` sent as JSON) and its answer: ``(status, headers, body
        excerpt)``. ``seconds`` is a total deadline over the whole exchange (connecting,
        sending, headers, an error's excerpt): an agent dripping its answer cannot outlive
        it. Only a non-2xx answer's body is read, at most :data:`EXCERPT_BYTES`, until the
        deadline. Redirects to the same origin are followed (307/308; for a GET any), never
        elsewhere: the credentials stay with the agent. ``key`` is sent as the
        ``Idempotency-Key`` (docs/howto/agents.md#the-idempotency-key). Raises httpx errors
        (``ConnectTimeout`` when the deadline passes before any of the request was
        written), ``TimeoutError`` when it passes after, :meth:`_refused`'s error for a
        redirect not followed."""
        client = self._client()
        headers = {"Idempotency-Key": key} if key else {}
        content = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            content = json.dumps(body, ensure_ascii=False).encode("utf-8")
        home = origin(httpx.URL(url))
        when = asyncio.get_running_loop().time() + seconds
        for _ in range(_MAX_REDIRECTS + 1):
            sending = _Sending()
            request = client.build_request(
                method, url, content=content, headers=headers, extensions={"trace": sending.trace}
            )
            try:
                async with asyncio.timeout_at(when):
                    response = await client.send(request, stream=True)
            except TimeoutError as exc:
                if sending.connecting:
                    raise httpx.ConnectTimeout(f"no connection within {seconds:g}s") from exc
                raise
            try:
                status = response.status_code
                if 300 <= status < 400 and "location" in response.headers:
                    follows = status in (307, 308) or method == "GET"
                    target = httpx.URL(urljoin(url, response.headers["location"]))
                    if not follows or target.userinfo or origin(target) != home:
                        where = "another origin" if follows else "a place"
                        said = f"a redirect to {where} this agent does not follow"
                        raise self._refused(status, url, said)
                    url = str(target)
                    continue
                raw = b""
                if not 200 <= status < 300:
                    limit = min(EXCERPT_BYTES, self.max_response_bytes)
                    raw = await read_excerpt(response, limit, until=when)
                return status, response.headers, raw
            finally:
                with contextlib.suppress(httpx.HTTPError):
                    await response.aclose()
        raise self._refused(0, url, f"more than {_MAX_REDIRECTS} redirects")

    async def _send(self, url: str, body: Any, *, key: str, where: str) -> None:
        """``POST`` the prompt ``body`` to ``url`` under ``timeout``; return on 2xx, else raise
        the outcome it means (docs/explanation/lifecycle.md#what-happens-to-a-message):
        :class:`TransientDeliveryError` when none of it was sent (:data:`NOT_SENT`),
        :class:`AmbiguousError` when it may have arrived (a timeout or cut once sent), the
        backend's own error when no valid request could be formed, and for an answer what
        :func:`refusal` says. ``where`` names the agent in the error texts (redacted)."""
        try:
            status, headers, raw = await self._exchange(
                "POST", url, self.timeout, body=body, key=key
            )
        except NOT_SENT as exc:
            raise described(TransientDeliveryError, f"could not connect to {where}", exc) from exc
        except INVALID_REQUEST as exc:
            raise self._refused(0, url, f"invalid request: {type(exc).__name__}: {exc}") from exc
        except TimeoutError as exc:
            late = httpx.ReadTimeout(f"its {self.timeout:g}s deadline passed")
            raise described(AmbiguousError, f"no whole answer from {where}", late) from exc
        except httpx.TransportError as exc:
            raise described(AmbiguousError, f"sent to {where} but got no answer", exc) from exc
        if 200 <= status < 300:
            return
        error = self._refused(status, url, excerpt(raw))
        raised = refusal(status, headers, error)
        if raised is error:
            raise error
        raise raised from error


class _Sending:
    """What httpcore reports of one request (its ``trace`` extension): ``connecting`` while
    a connection is being made and none of the request is written yet. A transport that
    reports nothing leaves it False: a timeout then counts as maybe sent."""

    def __init__(self) -> None:
        self.connecting = False

    async def trace(self, event: str, info: Mapping[str, Any]) -> None:
        if event == "connection.connect_tcp.started":
            self.connecting = True
        elif event.endswith(".send_request_headers.started"):
            self.connecting = False


def origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """``(scheme, host, port)`` of ``url``, lower-cased, the default port filled in: where a
    request may carry the agent's credentials (the same origin only)."""
    scheme = url.scheme.lower()
    return scheme, url.host.lower(), url.port or _DEFAULT_PORTS.get(scheme)


def excerpt(raw: bytes | str, chars: int = EXCERPT_CHARS) -> str:
    """A short, redacted excerpt of an answer for an error text: whitespace collapsed, at
    most ``chars`` characters (then ``...``)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    text = " ".join(text.split())
    text = text if len(text) <= chars else text[:chars] + "..."
    return redact(text)


async def read_bounded(response: httpx.Response, limit: int) -> bytearray:
    """The raw body of a streamed ``response``, at most ``limit`` bytes. Raises
    :class:`Unreadable` for a compressed body or one over ``limit`` (declared or read),
    httpx errors as they come."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise Unreadable(f"a {encoding}-compressed answer, though none was asked for")
    declared = response.headers.get("content-length", "").strip()
    if declared.isdigit() and int(declared) > limit:
        raise Unreadable(f"an answer of {declared} bytes; the limit is {limit}")
    body = bytearray()
    async for chunk in response.aiter_raw():  # raw: a chunk is at most 64 KiB
        body += chunk
        if len(body) > limit:
            raise Unreadable(f"an answer over {limit} bytes")
    return body


async def read_excerpt(
    response: httpx.Response, limit: int = EXCERPT_BYTES, *, until: float | None = None
) -> bytes:
    """At most ``limit`` bytes of a streamed ``response``'s body, read until the loop time
    ``until`` (None: no deadline); what came before a cut, an error or the deadline, and
    nothing of a compressed body. Never raises: the status is known, the body only
    decorates the error."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        return b""
    raw = bytearray()
    with contextlib.suppress(httpx.HTTPError, TimeoutError):
        async with asyncio.timeout_at(until):
            async for chunk in response.aiter_raw():  # raw: a chunk is at most 64 KiB
                raw += chunk
                if len(raw) >= limit:
                    return bytes(raw[:limit])
    return bytes(raw)


#: The longest wait :func:`parse_retry_after` reads, in seconds (about 31 years): a longer
#: ``Retry-After`` is this long. ``HOLD_MAX`` bounds every hold far below it.
LONGEST_RETRY_AFTER = 1e9

_DELTA_SECONDS = re.compile(r"[0-9]+")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds, or an HTTP date
    measured against ``now``, epoch seconds, default the local clock); None when absent
    or unreadable. A date in the past is 0. Delta-seconds are ASCII digits only (RFC 9110,
    10.2.3: another script's digits are unreadable); any wait, however many digits it has, is
    read as at most :data:`LONGEST_RETRY_AFTER` seconds — the hold itself is bounded by
    ``HOLD_MAX`` (docs/howto/agents.md#held-retry-after) — never as an error."""
    if value is None:
        return None
    value = value.strip()
    if _DELTA_SECONDS.fullmatch(value):
        # float() reads digits of any length (inf past ~309 of them); int() would refuse
        # more than 4300 and float(int()) overflow past ~309.
        return min(float(value), LONGEST_RETRY_AFTER)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    seconds = when.timestamp() - (time.time() if now is None else now)
    return min(max(0.0, seconds), LONGEST_RETRY_AFTER) if math.isfinite(seconds) else None


def described(kind: type[Exception], what: str, exc: BaseException) -> Exception:
    """``kind(text, exc)``: an outcome error whose text is ``what``, then ``exc``'s type and
    message (redacted; no trailing colon when the message is empty), carrying ``exc``."""
    text = redact(f"{what}: {type(exc).__name__}: {exc}".rstrip(": "))
    return kind(text, exc)


def refusal(status: int, headers: Mapping[str, str], error: Exception) -> Exception:
    """What a non-2xx answer to the request that carried the prompt raises, ``error`` being
    the backend's own error for it (its status, URL and excerpt): the table in
    docs/howto/agents.md#how-an-answer-is-classified.
    A 429 or 503 with a ``Retry-After`` is a hold whatever the header says: the agent said
    "not now", nothing was taken; a wait that cannot be read counts as 0, and the outbox
    waits at least ``HOLD_FLOOR`` anyway (docs/howto/agents.md#held-retry-after)."""
    if status in (429, 503) and "retry-after" in headers:
        wait = parse_retry_after(headers.get("retry-after"))
        return HoldDeliveryError(str(error), error, retry_after=wait or 0.0)
    if status >= 500:
        return AmbiguousError(str(error), error)
    return error


class Made:
    """The backends a module made from settings: one per ``key`` (an agent's name, a base
    URL, a settings block), remade when the object its settings come from is replaced
    (``setting_changed``, ``conf.reset()``); a replaced backend is kept until
    :meth:`aclose` has closed its clients in every loop that used it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[Hashable, tuple[object, HttpBackend]] = {}
        self._retired: list[HttpBackend] = []

    def get(self, key: Hashable, source: object, make: Callable[[], HttpBackend]) -> Any:
        """The backend of ``key`` made from ``source`` (compared by identity), made now by
        ``make`` when there is none or ``source`` is not the one it was made from."""
        with self._lock:
            made = self._made.get(key)
            if made is not None and made[0] is source:
                return made[1]
            if made is not None and made[1].has_clients:
                self._retired.append(made[1])
            backend = make()
            self._made[key] = (source, backend)
            return backend

    @property
    def retired(self) -> list[HttpBackend]:
        """The replaced backends whose clients are not closed yet (a copy)."""
        with self._lock:
            return list(self._retired)

    def drop(self, keep: Callable[[Hashable, object], bool]) -> None:
        """Forget (retire) every backend whose ``(key, source)`` ``keep`` refuses."""
        with self._lock:
            for key, (source, backend) in list(self._made.items()):
                if not keep(key, source):
                    del self._made[key]
                    if backend.has_clients:
                        self._retired.append(backend)

    async def aclose(self) -> None:
        """Close the running loop's httpx clients of every backend made (and replaced)."""
        with self._lock:
            backends = [backend for _, backend in self._made.values()] + list(self._retired)
        for backend in backends:
            await backend.aclose()
        with self._lock:
            self._retired[:] = [b for b in self._retired if b.has_clients]


#: What every built-in backend's ``deliver`` declares: it sends every part of a merged
#: delivery (:data:`~django_outbox.core.agents.CAPABILITY_MERGE`).
CARRIES_MERGE = frozenset({"merge"})


def settings_kwargs(block: object, names: str) -> dict[str, Any]:
    """``{name: block.name}`` for each of the space-separated ``names``: a backend's
    keyword arguments read off its validated settings block."""
    return {name: getattr(block, name) for name in names.split()}


def module_face(
    resolve: Callable[[str], Awaitable[Any]],
    backend: type[HttpBackend],
    module: str,
    validators: tuple[Callable[..., None], ...] = (),
    capabilities: frozenset[str] = CARRIES_MERGE,
) -> tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]], Callable[..., Any]]:
    """``(deliver, verify, abort)``: the functions an ``OUTBOX`` setting names, each calling
    the method of that name on the ``backend`` object ``await resolve(workspace_id)`` gives
    (which raises ``ImproperlyConfigured`` for bad settings). ``module`` is the module they
    are published in (their ``__module__``); ``validators``, one per function in that
    order, check an ``AGENTS`` entry that names it (their ``validate_agent_options``:
    ``manage.py check`` and the worker's start); ``capabilities`` is what ``deliver`` (and
    ``backend.deliver``) declare they carry out
    (:func:`~django_outbox.core.agents.capabilities_of`). A ``backend`` with a ``probe``
    method gives ``deliver`` an ``outbox_probe`` the worker's start awaits
    (:func:`~django_outbox.core.agents.probe_agents`)."""

    async def deliver(entry: Entry, *, workspace_id: str, session_id: str, attempt: int) -> Any:
        found = await resolve(workspace_id)
        return await found.deliver(
            entry, workspace_id=workspace_id, session_id=session_id, attempt=attempt
        )

    async def verify(entry: Entry, *, workspace_id: str, session_id: str) -> Any:
        found = await resolve(workspace_id)
        return await found.verify(entry, workspace_id=workspace_id, session_id=session_id)

    async def abort(entry: Entry, *, workspace_id: str, session_id: str) -> Any:
        found = await resolve(workspace_id)
        return await found.abort(entry, workspace_id=workspace_id, session_id=session_id)

    what = f":class:`{backend.__name__}` (the one the settings name)"
    deliver.__doc__ = f"An agent's ``DELIVERER``: ``deliver`` of {what}."
    verify.__doc__ = (
        f"An agent's ``VERIFIER``: ``verify`` of {what}; never raises for network problems."
    )
    abort.__doc__ = f"An agent's ``ABORTER``: ``abort`` of {what} (docs/howto/cutting.md)."
    functions: tuple[Any, Any, Any] = (deliver, verify, abort)
    for function in functions:
        function.__module__ = module
        function.__qualname__ = function.__name__
    for function, validator in zip(functions, validators, strict=False):
        function.validate_agent_options = validator
    deliver.outbox_capabilities = capabilities  # type: ignore[attr-defined]
    backend.deliver.outbox_capabilities = capabilities  # type: ignore[attr-defined]
    if hasattr(backend, "probe"):  # the worker's start asks it (docs/howto/agents.md)

        async def probe() -> None:
            await (await resolve("")).probe()

        deliver.outbox_probe = probe  # type: ignore[attr-defined]
    return functions


# --- a backend's own block of settings ---------------------------------------------------

#: The most a backend reads of one answer from its agent, by default (16 MiB).
DEFAULT_MAX_RESPONSE_BYTES = 16 * 1024 * 1024


def response_bytes(key: str, value: Any) -> int:
    """A ``MAX_RESPONSE_BYTES``: an integer >= 1; raises ``ConfigError`` naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"must be an integer >= 1 (bytes), got {value!r}")
    return value


def http_url(value: Any, example: str) -> tuple[str | None, str]:
    """``(the URL without a trailing slash, "")`` when ``value`` is an http(s) URL, else
    ``(None, why)``: a rule naming ``example``, the value shown redacted. A URL's
    credentials are remembered for redaction either way."""
    if isinstance(value, str):
        remember_url(value)
        try:
            parts = urlsplit(value)
        except ValueError:
            parts = None
        if parts is not None and parts.scheme in ("http", "https") and parts.netloc:
            return value.rstrip("/"), ""
    shown = redact(value) if isinstance(value, str) else value
    return None, f"must be an http(s) URL such as {example}, got {shown!r}"


def parse_block(
    cls: type[Any],
    raw: Any,
    where: str,
    *,
    delivery_timeout: float,
    required: tuple[str, ...] = (),
    values: dict[str, Any] | None = None,
) -> Any:
    """``cls`` (a settings dataclass whose fields are declared with
    :func:`~django_outbox.core.config.setting`) made from the block ``raw``: each key is a
    field in upper case, checked in declaration order by its kind; ``TIMEOUT`` defaults to
    the outbox's ``DELIVERY_TIMEOUT``. ``where`` names the block in errors
    (``OUTBOX['OPENCODE']``, an ``AGENTS`` entry). Raises ``ImproperlyConfigured`` naming
    the first wrong key and its rule: a block that is not a dict, an unknown key (a typo is
    not ignored), a missing ``required`` key. ``values`` (a dict the caller owns) receives
    the keys checked so far, also when a later one is wrong."""
    declarations = declared(cls)
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict")
    known = {name.upper() for name in declarations}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ImproperlyConfigured(f"{where} has unknown keys {unknown}; known: {sorted(known)}")
    for key in required:
        if raw.get(key) is None:
            raise ImproperlyConfigured(f"{where}[{key!r}] is required")
    defaults = {name: declaration.default for name, declaration in declarations.items()}
    if "timeout" in defaults:
        defaults["timeout"] = delivery_timeout  # TIMEOUT's default is DELIVERY_TIMEOUT
    values = {} if values is None else values
    try:
        for name, kind in kinds(cls).items():
            key = name.upper()
            values[name] = kind(key, raw.get(key, defaults[name]))
    except ConfigError as exc:
        raise ImproperlyConfigured(f"{where}[{exc.key!r}] {exc.rule}") from exc
    return cls(**values)
