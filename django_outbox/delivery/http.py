"""The generic HTTP agent: POST each prompt to a URL with an ``Idempotency-Key``, verify an
unknown outcome with a GET, abort with a POST; an ``OUTBOX["AGENTS"]`` entry names its
functions and holds its settings (:class:`HttpAgentSettings`). While the worker calls it, the
entry it serves is :data:`django_outbox.core.agents.current_agent`. Settings, the body's
placeholders and what each answer means: docs/howto/http-agent.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from types import MappingProxyType
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from django.core.exceptions import ImproperlyConfigured

from ..core.agents import Agent, current_agent
from ..core.config import DURATION, ConfigError, setting
from ..core.entry import Entry, Verdict
from ..core.redaction import redact, remember_secret, remember_url
from .base import (
    LONGEST_RETRY_AFTER,
    HttpBackend,
    Made,
    excerpt,
    module_face,
    parse_block,
    parse_retry_after,
    response_bytes,
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
DEFAULT_BODY: Mapping[str, Any] = MappingProxyType(
    {
        "entry_id": "{entry_id}",
        "idempotency_key": "{idempotency_key}",
        "workspace_id": "{workspace_id}",
        "session_id": "{session_id}",
        "text": "{text}",
        "parts": "{parts}",
        "model": "{model}",
    }
)
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


def _url_template(key: str, value: Any, *, required: bool = False) -> str | None:
    """A URL template's kind: an http(s) URL whose ``{placeholders}`` are known and outside
    its host (a client-chosen ID never chooses where requests and credentials go)."""
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
            raise ConfigError(
                key,
                f"has a placeholder in its host ({redact(value)!r}): the IDs filled in come "
                "from clients, and a client must never choose where the outbox sends requests "
                "(and the agent's credentials); put them in the path",
            )
        if unknown:
            raise ConfigError(
                key, f"uses unknown placeholders {unknown}; known: {list(URL_PLACEHOLDERS)}"
            )
        if parts and parts.scheme in ("http", "https") and parts.netloc:
            return value
    shown = redact(value) if isinstance(value, str) else value
    raise ConfigError(
        key,
        "must be an http(s) URL template such as "
        f"'https://agent/sessions/{{session_id}}/prompts', got {shown!r}",
    )


def _check_body(key: str, value: Any, *, top: bool = True) -> Any:
    """``BODY``: JSON-able (dicts with str keys, lists, str, numbers, bool, None) whose
    strings use only known placeholders; None (at the top): :data:`DEFAULT_BODY`."""
    if value is None and top:
        return DEFAULT_BODY
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ConfigError(key, "keys must be strings")
        for item in value.values():
            _check_body(key, item, top=False)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_body(key, item, top=False)
    elif isinstance(value, str):
        unknown = sorted(set(_PLACEHOLDER.findall(value)) - set(BODY_PLACEHOLDERS))
        if unknown:
            raise ConfigError(
                key, f"uses unknown placeholders {unknown}; known: {list(BODY_PLACEHOLDERS)}"
            )
    elif value is not None and not isinstance(value, bool | int | float):
        raise ConfigError(
            key,
            "must be JSON: dicts, lists, strings, numbers, booleans or None, "
            f"not {type(value).__name__}",
        )
    return value


def _check_headers(key: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigError(key, "must be a dict of str to str")
    for name, item in value.items():
        if name.lower() in _RESERVED_HEADERS:
            raise ConfigError(key, f"must not set {name!r}: the agent sets it")
        remember_secret(item)  # "Bearer abc" and its token alone
        remember_secret(item.partition(" ")[2])
    return dict(value)


@dataclass(frozen=True)
class HttpAgentSettings:
    """One HTTP agent's settings, validated (docs/howto/http-agent.md#settings): each key of
    its ``AGENTS`` entry (besides the callables) is a field below, in lower case; timeouts
    in float seconds, each a total deadline."""

    # Checked in this order (an entry with two wrong keys names the first).
    send_url: str = setting("", kind=partial(_url_template, required=True), doc="the send")
    verify_url: str | None = setting(None, kind=_url_template, doc="the verifier's GET")
    abort_url: str | None = setting(None, kind=_url_template, doc="the abort POST")
    # Defaults filled in by the kinds (None: the default body, no headers).
    body: Any = setting(None, kind=_check_body, doc="the JSON body template")  # noqa: RUF009
    headers: Mapping[str, str] | None = setting(
        None, kind=_check_headers, doc="sent with every request"
    )
    connect_timeout: float = setting(5.0, kind=DURATION, doc="connecting")
    timeout: float = setting(60.0, kind=DURATION, doc="the send")
    verify_timeout: float = setting(30.0, kind=DURATION, doc="the verifier's GET")
    abort_timeout: float = setting(10.0, kind=DURATION, doc="the abort")
    max_response_bytes: int = setting(64 * 1024, kind=response_bytes, doc="read of one answer")

    @classmethod
    def parse(cls, agent: str, options: Mapping[str, Any]) -> HttpAgentSettings:
        """Validate the ``OUTBOX["AGENTS"][agent]`` keys; raises ``ImproperlyConfigured``
        naming the first wrong key (an unknown key too: a typo is not ignored)."""
        where = f"OUTBOX['AGENTS'][{agent!r}]"
        made: HttpAgentSettings = parse_block(cls, options, where, delivery_timeout=60.0)
        return made


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
        return dict(self.settings.headers or {}), None

    def _refused(self, status: int, url: str, said: str) -> HttpAgentError:
        text = f"agent answered HTTP {status} for {url}" if status else url
        return HttpAgentError(
            text + (f": {said}" if said else ""), status=status, url=url, body=said
        )

    async def deliver(
        self, entry: Entry, *, workspace_id: str, session_id: str, attempt: int
    ) -> None:
        """``POST SEND_URL`` with the ``BODY`` filled in and ``Idempotency-Key:`` the entry's
        :attr:`~django_outbox.core.entry.Entry.request_key`; a merged delivery sends every
        prompt's text (``{parts}`` lists them, ``{text}`` joins them). Returns on 2xx; raises
        :class:`TransientDeliveryError`, :class:`AmbiguousError`, :class:`HoldDeliveryError`
        or :class:`HttpAgentError` as docs/howto/http-agent.md#what-each-answer-means says.
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
        await self._send(url, _fill_body(s.body, values), key=key, where=f"the agent at {url}")

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
        return {200: Verdict.DELIVERED, 404: Verdict.ABSENT}.get(status, Verdict.INCONCLUSIVE)

    async def abort(self, entry: Entry, *, workspace_id: str, session_id: str) -> None:
        """``POST ABORT_URL`` (with the request's ``Idempotency-Key`` and ``{"entry_id",
        "workspace_id", "session_id"}``): cut the running turn. Returns on 2xx; raises
        :class:`HttpAgentError` for another status, httpx errors or ``TimeoutError``
        otherwise; ``ImproperlyConfigured`` without an ``ABORT_URL``."""
        s = self.settings
        if s.abort_url is None:
            raise ImproperlyConfigured(f"{_name(self.name, 'ABORT_URL')} is not set")
        key = entry.request_key
        url = _fill_url(s.abort_url, workspace_id, session_id, entry.id, key)
        body = {"entry_id": entry.id, "workspace_id": workspace_id, "session_id": session_id}
        status, _, raw = await self._exchange("POST", url, s.abort_timeout, body=body, key=key)
        if not 200 <= status < 300:
            said = excerpt(raw)
            text = f"agent answered HTTP {status} to the abort at {url}" + (
                f": {said}" if said else ""
            )
            raise HttpAgentError(text, status=status, url=url, body=said)


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
