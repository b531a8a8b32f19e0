"""The generic HTTP agent: POST each prompt to a URL with an ``Idempotency-Key`` (the entry
ID; ``<entry ID>.<revision>`` once the request changed), verify an unknown outcome with a GET
(docs/howto/http-agent.md).

Configure it as an ``OUTBOX["AGENTS"]`` entry; its keys besides the callables are its
settings (:class:`HttpAgentSettings`)::

    OUTBOX = {
        "AGENTS": {
            "runs": {
                "DELIVERER": "django_outbox.delivery.http.deliver",
                "VERIFIER": "django_outbox.delivery.http.verify",
                "ABORTER": "django_outbox.delivery.http.abort",  # optional
                "SEND_URL": "https://agent.internal/v1/sessions/{session_id}/prompts",
                "VERIFY_URL": "https://agent.internal/v1/prompts/{idempotency_key}",
                "ABORT_URL": "https://agent.internal/v1/sessions/{session_id}/abort",
                "HEADERS": {"Authorization": "Bearer ..."},
            },
        },
    }

One module serves any number of such entries: while the worker calls it, the entry it
serves is :data:`django_outbox.core.agents.current_agent`. How an answer is classified
(DESIGN 19.2; the outcomes of docs/explanation/lifecycle.md):

=========================================================  ==================================
the send (``POST SEND_URL``)                               outcome
=========================================================  ==================================
2xx                                                        delivered
refused, unreachable, or the deadline passed connecting    transient (no attempt used)
timeout once sent, connection cut, 5xx (502, 504, 500...)  ambiguous: verified, never resent
429 or 503 with ``Retry-After`` (any value)                held, no attempt used (at least
                                                           ``HOLD_FLOOR``: a "now" is no storm)
other 4xx, 429 without ``Retry-After``, a redirect          failed (an attempt used)
=========================================================  ==================================

The verifier's ``GET VERIFY_URL``: 200 → DELIVERED, 404 → ABSENT, anything else (another
status, a timeout, a cut) → INCONCLUSIVE. Every timeout is a total deadline over the whole
exchange (connect, send, headers, body), so an agent that drips its answer byte by byte
cannot outlive it; an error body still dripping at the deadline is cut there, and the
status decides. At most ``MAX_RESPONSE_BYTES`` of an answer are read (only an error's
answer is read at all, for a short excerpt). Requests go to the origin (scheme, host,
port) of their URL only: a redirect is followed only when it is a 307/308 (or, for the
GET, any redirect) to the same origin, so the ``HEADERS`` (credentials) never leave it.
Header values are remembered as secrets: no error text, log line or stored ``lastError``
shows them (:mod:`django_outbox.core.redaction`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured

from ..core.agents import Agent, current_agent
from ..core.config import ConfigError, duration
from ..core.entry import Entry, Verdict
from ..core.redaction import redact, remember_secret, remember_url
from ..errors import AmbiguousError, TransientDeliveryError
from .base import (
    INVALID_REQUEST,
    LONGEST_RETRY_AFTER,
    NOT_SENT,
    HttpBackend,
    Made,
    excerpt,
    module_face,
    origin,
    parse_retry_after,
    read_excerpt,
    refusal,
)

__all__ = [
    "DEFAULT_BODY",
    "LONGEST_RETRY_AFTER",
    "HttpAgent",
    "HttpAgentError",
    "HttpAgentSettings",
    "abort",
    "aclose",
    "agent_for",
    "deliver",
    "parse_retry_after",
    "verify",
]

#: The body sent when the entry sets no ``BODY``: every placeholder once.
DEFAULT_BODY: Mapping[str, Any] = {
    "entry_id": "{entry_id}",
    "idempotency_key": "{idempotency_key}",
    "workspace_id": "{workspace_id}",
    "session_id": "{session_id}",
    "text": "{text}",
    "parts": "{parts}",
    "model": "{model}",
}
#: The names a URL template may use (each value is percent-encoded whole), in its path or
#: query only: a client-chosen ID never picks the host. ``{idempotency_key}`` is the
#: request's ``Idempotency-Key`` (``Entry.request_key``): the entry ID, then
#: ``<entry ID>.<revision>`` once the request changed.
URL_PLACEHOLDERS = ("workspace_id", "session_id", "entry_id", "idempotency_key")
#: The names a ``BODY`` string may use: a string that is exactly ``"{model}"`` becomes the
#: entry's model object (or null), one that is exactly ``"{parts}"`` the list of the
#: delivery's texts (one for a prompt alone; each merged prompt's, in queue order, for a
#: merged delivery); other strings have each ``{name}`` replaced by text. ``{text}`` is
#: the whole message: a prompt's text, or a merged delivery's texts joined by a blank
#: line, so a template written before merging existed still carries every prompt
#: (docs/howto/http-agent.md#the-body).
BODY_PLACEHOLDERS = (
    *URL_PLACEHOLDERS,
    "text",
    "parts",
    "model",
    "client_message_id",
    "user_id",
)
#: What joins the texts of a merged delivery in ``{text}``.
MERGED_TEXT_SEPARATOR = "\n\n"
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_MAX_REDIRECTS = 5
#: Headers the agent does not choose: the outbox sets them.
_RESERVED_HEADERS = {"idempotency-key", "content-type", "content-length", "host"}


class HttpAgentError(Exception):
    """The agent answered a status that says the prompt was not taken (a definitive
    failure), or a redirect this module does not follow. ``status`` (int, 0 for none),
    ``url`` (redacted), ``body`` (a short excerpt, redacted)."""

    def __init__(self, message: str, *, status: int = 0, url: str = "", body: str = "") -> None:
        super().__init__(redact(message))
        self.status = status
        self.url = redact(url)
        self.body = redact(body)


# --- settings ---------------------------------------------------------------------------


def _name(agent: str, key: str) -> str:
    return f"OUTBOX['AGENTS'][{agent!r}][{key!r}]"


def _url_template(agent: str, key: str, value: Any, *, required: bool) -> str | None:
    if value is None and not required:
        return None
    if isinstance(value, str):
        remember_url(value)
        unknown = sorted(set(_PLACEHOLDER.findall(value)) - set(URL_PLACEHOLDERS))
        try:
            parts = urlsplit(_fill_url(value, "w", "s", "e", "k"))
            chosen_host = "{" in urlsplit(value).netloc
        except (ValueError, KeyError):
            parts, chosen_host = None, False
        if chosen_host:
            raise ImproperlyConfigured(
                f"{_name(agent, key)} has a placeholder in its host ({redact(value)!r}): the "
                "IDs filled in come from clients, and a client must never choose where the "
                "outbox sends requests (and the agent's credentials); put them in the path"
            )
        if not unknown and parts and parts.scheme in ("http", "https") and parts.netloc:
            return value
        if unknown:
            raise ImproperlyConfigured(
                f"{_name(agent, key)} uses unknown placeholders {unknown}; "
                f"known: {list(URL_PLACEHOLDERS)}"
            )
    shown = redact(value) if isinstance(value, str) else value
    raise ImproperlyConfigured(
        f"{_name(agent, key)} must be an http(s) URL template such as "
        f"'https://agent/sessions/{{session_id}}/prompts', got {shown!r}"
    )


def _check_body(agent: str, value: Any) -> Any:
    """``BODY``: JSON-able (dicts with str keys, lists, str, numbers, bool, None) whose
    strings use only known placeholders."""

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise ImproperlyConfigured(f"{_name(agent, 'BODY')} keys must be strings")
                walk(item)
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)
        elif isinstance(node, str):
            unknown = sorted(set(_PLACEHOLDER.findall(node)) - set(BODY_PLACEHOLDERS))
            if unknown:
                raise ImproperlyConfigured(
                    f"{_name(agent, 'BODY')} uses unknown placeholders {unknown}; "
                    f"known: {list(BODY_PLACEHOLDERS)}"
                )
        elif node is not None and not isinstance(node, bool | int | float):
            raise ImproperlyConfigured(
                f"{_name(agent, 'BODY')} must be JSON: dicts, lists, strings, numbers, "
                f"booleans or None, not {type(node).__name__}"
            )

    walk(value)
    return value


def _check_headers(agent: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ImproperlyConfigured(f"{_name(agent, 'HEADERS')} must be a dict of str to str")
    for key, item in value.items():
        if key.lower() in _RESERVED_HEADERS:
            raise ImproperlyConfigured(
                f"{_name(agent, 'HEADERS')} must not set {key!r}: the agent sets it"
            )
        remember_secret(item)  # "Bearer abc" and its token alone
        remember_secret(item.partition(" ")[2])
    return dict(value)


@dataclass(frozen=True)
class HttpAgentSettings:
    """One HTTP agent's settings, validated (docs/howto/http-agent.md).

    ``send_url`` (required), ``verify_url``, ``abort_url``: URL templates with
    ``{workspace_id}``, ``{session_id}``, ``{entry_id}`` (percent-encoded whole);
    ``body``: the JSON body template (:data:`DEFAULT_BODY`); ``headers``: sent with every
    request (credentials: never shown); ``connect_timeout``, ``timeout`` (the send),
    ``verify_timeout``, ``abort_timeout``: seconds, each a total deadline;
    ``max_response_bytes``: the most read of one answer.
    """

    send_url: str
    verify_url: str | None = None
    abort_url: str | None = None
    body: Any = field(default_factory=lambda: dict(DEFAULT_BODY))
    headers: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 5.0
    timeout: float = 60.0
    verify_timeout: float = 30.0
    abort_timeout: float = 10.0
    max_response_bytes: int = 64 * 1024

    #: The keys of an AGENTS entry this agent reads (besides DELIVERER/VERIFIER/ABORTER).
    KEYS = (
        "SEND_URL",
        "VERIFY_URL",
        "ABORT_URL",
        "BODY",
        "HEADERS",
        "CONNECT_TIMEOUT",
        "TIMEOUT",
        "VERIFY_TIMEOUT",
        "ABORT_TIMEOUT",
        "MAX_RESPONSE_BYTES",
    )

    @classmethod
    def parse(cls, agent: str, options: Mapping[str, Any]) -> HttpAgentSettings:
        """Validate the ``OUTBOX["AGENTS"][agent]`` keys; raises ``ImproperlyConfigured``
        naming the first wrong key (an unknown key too: a typo is not ignored)."""
        unknown = sorted(set(options) - set(cls.KEYS))
        if unknown:
            raise ImproperlyConfigured(
                f"OUTBOX['AGENTS'][{agent!r}] has unknown keys {unknown} for the HTTP agent; "
                f"known: {list(cls.KEYS)}"
            )
        values: dict[str, Any] = {
            "send_url": _url_template(agent, "SEND_URL", options.get("SEND_URL"), required=True),
            "verify_url": _url_template(
                agent, "VERIFY_URL", options.get("VERIFY_URL"), required=False
            ),
            "abort_url": _url_template(
                agent, "ABORT_URL", options.get("ABORT_URL"), required=False
            ),
        }
        if "BODY" in options:
            values["body"] = _check_body(agent, options["BODY"])
        if "HEADERS" in options:
            values["headers"] = _check_headers(agent, options["HEADERS"])
        for key in ("CONNECT_TIMEOUT", "TIMEOUT", "VERIFY_TIMEOUT", "ABORT_TIMEOUT"):
            if key in options:
                try:
                    values[key.lower()] = duration(key, options[key])
                except ConfigError as exc:
                    raise ImproperlyConfigured(f"{_name(agent, key)} {exc.rule}") from exc
        if "MAX_RESPONSE_BYTES" in options:
            size = options["MAX_RESPONSE_BYTES"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ImproperlyConfigured(
                    f"{_name(agent, 'MAX_RESPONSE_BYTES')} must be an integer >= 1 (bytes)"
                )
            values["max_response_bytes"] = size
        return cls(**values)


def _validate_send(agent: str, options: Mapping[str, Any]) -> None:
    HttpAgentSettings.parse(agent, options)


def _validate_verify(agent: str, options: Mapping[str, Any]) -> None:
    if HttpAgentSettings.parse(agent, options).verify_url is None:
        raise ImproperlyConfigured(
            f"{_name(agent, 'VERIFY_URL')} is required by django_outbox.delivery.http.verify"
        )


def _validate_abort(agent: str, options: Mapping[str, Any]) -> None:
    if HttpAgentSettings.parse(agent, options).abort_url is None:
        raise ImproperlyConfigured(
            f"{_name(agent, 'ABORT_URL')} is required by django_outbox.delivery.http.abort"
        )


# --- requests ---------------------------------------------------------------------------


def _fill_url(template: str, workspace_id: str, session_id: str, entry_id: str, key: str) -> str:
    values = {
        "workspace_id": workspace_id,
        "session_id": session_id,
        "entry_id": entry_id,
        "idempotency_key": key,
    }
    return _PLACEHOLDER.sub(lambda m: quote(values[m[1]], safe=""), template)


def _fill_body(node: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(node, Mapping):
        return {key: _fill_body(item, values) for key, item in node.items()}
    if isinstance(node, list | tuple):
        return [_fill_body(item, values) for item in node]
    if isinstance(node, str):
        whole = _PLACEHOLDER.fullmatch(node)
        if whole:
            return values[whole[1]]
        return _PLACEHOLDER.sub(lambda m: _as_text(values[m[1]]), node)
    return node


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


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


class HttpAgent(HttpBackend):
    """One HTTP agent (an ``AGENTS`` entry): :meth:`deliver`, :meth:`verify`, :meth:`abort`.

    ``settings``: :class:`HttpAgentSettings`; ``transport``: an httpx async transport
    (tests). One ``httpx.AsyncClient`` per running event loop; :meth:`aclose` closes the
    running loop's one.
    """

    def __init__(
        self,
        name: str,
        settings: HttpAgentSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.name = name
        self.settings = settings
        super().__init__(
            connect_timeout=settings.connect_timeout,
            timeout=settings.timeout,
            max_response_bytes=settings.max_response_bytes,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"<HttpAgent {self.name}>"

    def _credentials(self) -> tuple[dict[str, str], tuple[str, str] | None]:
        return dict(self.settings.headers), None

    async def _exchange(
        self, method: str, url: str, deadline: float, *, body: bytes | None = None, key: str = ""
    ) -> tuple[int, httpx.Headers, bytes]:
        """One request and its answer, following same-origin redirects (307/308; for a GET
        any): ``(status, headers, body excerpt)``. The body is read only for a non-2xx
        answer, at most ``max_response_bytes``, and only until ``deadline``: once the status
        is in, a body still dripping is cut there and the status decides. Raises httpx
        errors (``ConnectTimeout`` when ``deadline`` seconds in all pass while connecting,
        before any of the request was written), ``TimeoutError`` when they pass after,
        :class:`HttpAgentError` for a redirect elsewhere."""
        client = self._client()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if key:
            headers["Idempotency-Key"] = key
        home = origin(httpx.URL(url))
        when = asyncio.get_running_loop().time() + deadline
        for _ in range(_MAX_REDIRECTS + 1):
            sending = _Sending()
            request = client.build_request(
                method, url, content=body, headers=headers, extensions={"trace": sending.trace}
            )
            try:
                async with asyncio.timeout_at(when):
                    response = await client.send(request, stream=True)
            except TimeoutError as exc:
                if sending.connecting:
                    raise httpx.ConnectTimeout(
                        f"no connection within {deadline:g}s", request=request
                    ) from exc
                raise
            try:
                status = response.status_code
                if 300 <= status < 400 and "location" in response.headers:
                    follows = status in (307, 308) or method == "GET"
                    target = httpx.URL(urljoin(url, response.headers["location"]))
                    if not follows or target.userinfo or origin(target) != home:
                        raise HttpAgentError(
                            f"the agent redirected {method} {url} ({status}) to "
                            f"{'another origin' if follows else 'a place'} this agent "
                            "does not follow",
                            status=status,
                            url=url,
                        )
                    url = str(target)
                    continue
                raw = b""
                if not 200 <= status < 300:
                    raw = await read_excerpt(response, self.settings.max_response_bytes, until=when)
                return status, response.headers, raw
            finally:
                with contextlib.suppress(httpx.HTTPError):
                    await response.aclose()
        raise HttpAgentError(f"more than {_MAX_REDIRECTS} redirects from {url}", url=url)

    # -- deliver ---------------------------------------------------------------------

    async def deliver(
        self, entry: Entry, *, workspace_id: str, session_id: str, attempt: int
    ) -> None:
        """``POST SEND_URL`` with the ``BODY`` and ``Idempotency-Key:`` the entry's
        :attr:`~django_outbox.core.entry.Entry.request_key` (the same for every resend of the
        same request, so an agent that honours it never runs a prompt twice; new once the
        request changed, after an edit or an operator's retry of a failure). A merged
        delivery sends every prompt's text: ``{parts}`` lists them, ``{text}`` joins them.
        Returns on 2xx; raises :class:`TransientDeliveryError` (nothing was sent),
        :class:`AmbiguousError` (maybe sent), :class:`HoldDeliveryError` (429/503 with
        ``Retry-After``) or :class:`HttpAgentError` (refused), as the module's table says.
        """
        s = self.settings
        key = entry.request_key
        url = _fill_url(s.send_url, workspace_id, session_id, entry.id, key)
        texts = list(entry.parts or (entry.text,))
        values = {
            "workspace_id": workspace_id,
            "session_id": session_id,
            "entry_id": entry.id,
            "idempotency_key": key,
            "text": MERGED_TEXT_SEPARATOR.join(texts),
            "parts": texts,
            "model": entry.model,
            "client_message_id": entry.client_message_id,
            "user_id": entry.user_id,
        }
        body = json.dumps(_fill_body(s.body, values), ensure_ascii=False).encode("utf-8")
        try:
            status, headers, raw = await self._exchange("POST", url, s.timeout, body=body, key=key)
        except NOT_SENT as exc:
            raise TransientDeliveryError(
                redact(f"could not connect to the agent at {url}: {type(exc).__name__}: {exc}"),
                exc,
            ) from exc
        except INVALID_REQUEST as exc:
            raise HttpAgentError(
                f"invalid request to {url}: {type(exc).__name__}: {exc}", url=url
            ) from exc
        except TimeoutError as exc:
            raise AmbiguousError(
                redact(f"no whole answer from {url} within {s.timeout:g}s"), exc
            ) from exc
        except httpx.TransportError as exc:
            raise AmbiguousError(
                redact(f"sent to {url} but got no answer: {type(exc).__name__}: {exc}"), exc
            ) from exc
        if 200 <= status < 300:
            return
        said = excerpt(raw)
        error = HttpAgentError(
            f"agent answered HTTP {status} for {url}" + (f": {said}" if said else ""),
            status=status,
            url=url,
            body=said,
        )
        raised = refusal(status, headers, error)
        if raised is error:
            raise error
        raise raised from error

    # -- verify ----------------------------------------------------------------------

    async def verify(self, entry: Entry, *, workspace_id: str, session_id: str) -> Verdict:
        """``GET VERIFY_URL`` with ``Idempotency-Key:`` the key of the request it verifies
        (also ``{idempotency_key}`` in the URL): 200 → DELIVERED, 404 → ABSENT, anything else
        (another status, a timeout, a cut, a redirect elsewhere) → INCONCLUSIVE. Never raises
        for network problems; ``ImproperlyConfigured`` without a ``VERIFY_URL``."""
        s = self.settings
        if s.verify_url is None:
            raise ImproperlyConfigured(f"{_name(self.name, 'VERIFY_URL')} is not set")
        key = entry.request_key
        url = _fill_url(s.verify_url, workspace_id, session_id, entry.id, key)
        try:
            status, _, _ = await self._exchange("GET", url, s.verify_timeout, key=key)
        except (httpx.HTTPError, HttpAgentError, TimeoutError):
            return Verdict.INCONCLUSIVE
        if status == 200:
            return Verdict.DELIVERED
        if status == 404:
            return Verdict.ABSENT
        return Verdict.INCONCLUSIVE

    # -- abort -----------------------------------------------------------------------

    async def abort(self, entry: Entry, *, workspace_id: str, session_id: str) -> None:
        """``POST ABORT_URL`` (with the request's ``Idempotency-Key`` and the ``BODY``'s
        placeholders' values as JSON): cut the running turn. Returns on 2xx; raises
        :class:`HttpAgentError` for another status, httpx errors or ``TimeoutError``
        otherwise; ``ImproperlyConfigured`` without an ``ABORT_URL``."""
        s = self.settings
        if s.abort_url is None:
            raise ImproperlyConfigured(f"{_name(self.name, 'ABORT_URL')} is not set")
        key = entry.request_key
        url = _fill_url(s.abort_url, workspace_id, session_id, entry.id, key)
        body = json.dumps(
            {"entry_id": entry.id, "workspace_id": workspace_id, "session_id": session_id}
        ).encode()
        status, _, raw = await self._exchange("POST", url, s.abort_timeout, body=body, key=key)
        if not 200 <= status < 300:
            said = excerpt(raw)
            raise HttpAgentError(
                f"agent answered HTTP {status} to the abort at {url}"
                + (f": {said}" if said else ""),
                status=status,
                url=url,
                body=said,
            )


# --- the module functions an AGENTS entry names -----------------------------------------

_made = Made()


def agent_for(agent: Agent | None = None) -> HttpAgent:
    """The :class:`HttpAgent` of ``agent`` (default: the one the worker serves now,
    :data:`~django_outbox.core.agents.current_agent`), made once per settings object.
    Raises ``ImproperlyConfigured`` outside an ``AGENTS`` entry or for bad settings."""
    agent = agent or current_agent.get()
    if agent is None:
        raise ImproperlyConfigured(
            "django_outbox.delivery.http serves an OUTBOX['AGENTS'] entry: name it there "
            "(docs/howto/http-agent.md)"
        )
    served = agent

    def make() -> HttpAgent:
        return HttpAgent(served.name, HttpAgentSettings.parse(served.name, served.options))

    made: HttpAgent = _made.get((agent.name, id(agent.options)), agent.options, make)
    return made


async def _resolve(workspace_id: str) -> HttpAgent:
    return agent_for()


# It sends every part of a merged delivery ({parts}; {text} joins them). The checks validate
# an AGENTS entry naming these (conf.AgentSettings); aclose closes the running loop's httpx
# clients of every HTTP agent made so far (the worker at shutdown; tests at teardown).
_CHECKS = (_validate_send, _validate_verify, _validate_abort)
deliver, verify, abort = module_face(_resolve, HttpAgent, __name__, _CHECKS)
aclose = _made.aclose
