"""Built-in deliverer, verifier and aborter for an opencode server (``opencode serve``): the
module functions ``OUTBOX["DELIVERER"]`` & co. name (settings in ``OUTBOX["OPENCODE"]``), or an
:class:`OpencodeClient`'s bound methods. The outbox's session ID is opencode's (``ses_...``).
What a real opencode server does, which this module relies on (checked against one by
``tests/opencode/test_opencode_real.py``), and what each answer means:
docs/howto/opencode.md#what-opencode-does.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any
from urllib.parse import quote, unquote, urljoin, urlsplit, urlunsplit

import httpx
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..conf import outbox_settings
from ..core.config import DURATION, DURATION_OR_ZERO, Config, ConfigError, declared, setting
from ..core.entry import Entry, Verdict, parse_time
from ..core.redaction import redact, remember_credentials
from .base import (
    DEFAULT_MAX_RESPONSE_BYTES,
    HttpBackend,
    Made,
    Unreadable,
    excerpt,
    http_url,
    module_face,
    origin,
    parse_block,
    read_bounded,
    response_bytes,
    settings_kwargs,
)

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "OpencodeClient",
    "OpencodeError",
    "OpencodeHTTPError",
    "OpencodeSessionIDError",
    "OpencodeSettings",
    "aclose",
    "client_for",
    "deliver",
    "message_id_for",
    "parse_settings",
    "verify",
]

_BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _skip_space(text: str, i: int) -> int:
    """The index of the first non-JSON-whitespace character of ``text`` at or after ``i``."""
    match = _JSON_SPACE.match(text, i)
    return match.end() if match else i


class OpencodeError(Exception):
    """A definitive delivery failure reported by this module (not ambiguous, not transient)."""


class OpencodeHTTPError(OpencodeError):
    """opencode answered a non-2xx status. ``status`` (int), ``body`` (excerpt, str), ``url``;
    the body and URL redacted: an agent echoing the credentials cannot put them in the error
    text (docs/explanation/security.md)."""

    def __init__(self, status: int, body: str, url: str) -> None:
        self.status = status
        self.body = body = redact(body)
        self.url = url = redact(url)
        excerpt = f": {body}" if body else ""
        super().__init__(f"opencode answered HTTP {status} for {url}{excerpt}")


class OpencodeSessionIDError(OpencodeError, ValueError):
    """The session ID is not an opencode session ID (must start with ``ses``)."""


def message_id_for(entry: Entry) -> str:
    """The opencode ``messageID`` for ``entry``, the same for every attempt of one request:
    ``msg_``, 12 hex digits of ``acceptedAt`` in opencode's time encoding (Valkey's clock: a
    session's IDs follow accept order) and 14 base62 characters of a SHA-256 of the entry's
    request key (docs/howto/opencode.md#what-opencode-does)."""
    try:
        ms, micros = divmod(parse_time(entry.accepted_at), 1000)
    except (TypeError, ValueError):
        ms, micros = 0, 0
    time_part = (ms * 0x1000 + micros) & 0xFFFF_FFFF_FFFF
    digest = int.from_bytes(hashlib.sha256(entry.request_key.encode("utf-8")).digest(), "big")
    tail = []
    for _ in range(14):
        digest, digit = divmod(digest, 62)
        tail.append(_BASE62[digit])
    return f"msg_{time_part:012x}{''.join(tail)}"


def _check_session_id(session_id: str) -> str:
    if not isinstance(session_id, str) or not session_id.startswith("ses"):
        raise OpencodeSessionIDError(
            f"{session_id!r} is not an opencode session ID (they start with 'ses'); "
            "opencode answers 500 for it"
        )
    return quote(session_id, safe="")


def split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """``(url without its userinfo, (username, password) or None)``; both percent-decoded.

    ``http://opencode:p%40ss@host:4096`` gives ``("http://host:4096", ("opencode",
    "p@ss"))``; a userinfo without ``:`` is a username with an empty password (as
    httpx reads it). A URL that does not parse is returned as it is.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url, None
    if "@" not in parts.netloc:
        return url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    return urlunsplit(parts._replace(netloc=host)), (unquote(user), unquote(password))


def _json_array(text: str) -> Iterator[Any]:
    """The elements of the JSON array ``text``, parsed one at a time (so only one is held
    at once). Raises ``ValueError`` when ``text`` is not exactly one JSON array."""
    decoder = json.JSONDecoder()
    i = _skip_space(text, 0)
    if text[i : i + 1] != "[":
        raise ValueError("not a JSON array")
    i = _skip_space(text, i + 1)
    if text[i : i + 1] != "]":
        while True:
            value, i = decoder.raw_decode(text, i)
            yield value
            i = _skip_space(text, i)
            if text[i : i + 1] == "]":
                break
            if text[i : i + 1] != ",":
                raise ValueError("malformed JSON array")
            i = _skip_space(text, i + 1)
    if _skip_space(text, i + 1) != len(text):
        raise ValueError("extra data after the JSON array")


def _user_message_has_text(message: Any, text: str) -> bool | None:
    """True/False if ``message`` is a well-formed ``{info, parts}`` object, None if malformed."""
    if not isinstance(message, dict):
        return None
    info, parts = message.get("info"), message.get("parts")
    if not isinstance(info, dict) or not isinstance(parts, list):
        return None
    if info.get("role") != "user":
        return False
    return any(
        isinstance(part, dict) and part.get("type") == "text" and part.get("text") == text
        for part in parts
    )


class OpencodeClient(HttpBackend):
    """Deliver outbox entries to one opencode server, verify and abort them there.

    ``base_url``: e.g. ``"http://127.0.0.1:4096"`` (a path prefix is kept; a
    ``user:password@`` in it is taken out and used as the Basic credentials unless
    ``password`` is given). ``username`` / ``password``: HTTP Basic, to ``base_url``'s origin
    only; no auth when ``password`` is None. Seconds: ``connect_timeout``; ``timeout``, the
    delivery POST's total deadline (it blocks for the whole turn: keep it long);
    ``verify_timeout``, one verification's (and one abort's) total deadline; ``clock_skew``,
    how far the agent's clock may lag ours (:meth:`verify`). ``max_response_bytes``: the most
    the verifier reads of one answer. ``transport``: an httpx async transport (tests).
    docs/reference/settings.md#opencode
    """

    def __init__(
        self,
        base_url: str,
        *,
        username: str = "opencode",
        password: str | None = None,
        connect_timeout: float = 5.0,
        timeout: float = 600.0,
        verify_timeout: float = 30.0,
        clock_skew: float = 2.0,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base_url, credentials = split_credentials(base_url)
        if password is None and credentials is not None:
            username, password = credentials
        remember_credentials(username, password)  # never shown, wherever it appears
        self.base_url = base_url.rstrip("/")
        self.username = username
        self.password = password
        self.verify_timeout = float(verify_timeout)
        self.clock_skew = float(clock_skew)
        super().__init__(
            connect_timeout=connect_timeout,
            timeout=timeout,
            max_response_bytes=max_response_bytes,
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"<OpencodeClient {self.base_url}>"

    # -- the httpx client of the running loop ------------------------------------

    def _credentials(self) -> tuple[dict[str, str], tuple[str, str] | None]:
        return {}, None if self.password is None else (self.username, self.password)

    # -- deliver -------------------------------------------------------------------

    def _refused(self, status: int, url: str, said: str) -> OpencodeError:
        if status:
            return OpencodeHTTPError(status, said, url)
        return OpencodeError(redact(f"{url}: {said}"))

    async def deliver(
        self, entry: Entry, *, workspace_id: str, session_id: str, attempt: int
    ) -> dict[str, str]:
        """Send ``entry`` as a user prompt: ``POST {base}/session/{session_id}/message`` with
        ``{"parts": [{"type": "text", "text": ...}], "messageID": message_id_for(entry)}`` (a
        text part per merged prompt, in accept order; ``"model"`` when the entry has one).
        Returns on 2xx (the turn has ended) ``{"sessionID", "messageID"}``, the entry's
        ``agentRef`` (docs/howto/deliverer.md#what-it-returns). Raises
        :class:`OpencodeSessionIDError` before sending for a session ID not starting with
        ``ses``, else as
        docs/howto/opencode.md#what-opencode-does classifies the ending:
        :class:`TransientDeliveryError`, :class:`AmbiguousError`, :class:`HoldDeliveryError`,
        :class:`OpencodeHTTPError` or :class:`OpencodeError`."""
        path = f"/session/{_check_session_id(session_id)}/message"
        body: dict[str, Any] = {
            "parts": [{"type": "text", "text": text} for text in (entry.parts or (entry.text,))],
            "messageID": message_id_for(entry),
        }
        if entry.model is not None:
            body["model"] = entry.model
        await self._send(self.base_url + path, body, key="", where=f"opencode at {self.base_url}")
        return {"sessionID": session_id, "messageID": body["messageID"]}

    async def abort(self, entry: Entry, *, workspace_id: str, session_id: str) -> None:
        """End the session's running turn: ``POST {base}/session/{sid}/abort``
        (docs/howto/cutting.md); harmless when none runs. Raises :class:`OpencodeHTTPError`
        for a non-2xx answer, :class:`OpencodeSessionIDError`, httpx errors or
        ``TimeoutError`` (``verify_timeout``) otherwise; the verifier decides the entry's
        outcome anyway."""
        url = f"{self.base_url}/session/{_check_session_id(session_id)}/abort"
        status, _, raw = await self._exchange("POST", url, self.verify_timeout)
        if not 200 <= status < 300:
            raise OpencodeHTTPError(status, excerpt(raw), url)

    # -- verify ----------------------------------------------------------------------

    async def verify(self, entry: Entry, *, workspace_id: str, session_id: str) -> Verdict:
        """Decide whether an attempt of ``entry`` whose outcome was unknown reached opencode:
        its ``messageID``, then the transcript (docs/howto/opencode.md#what-opencode-does).
        DELIVERED, ABSENT (safe to send again) or INCONCLUSIVE; never raises for network or
        protocol problems."""
        try:
            sid = _check_session_id(session_id)
        except OpencodeSessionIDError:
            return Verdict.INCONCLUSIVE
        mid = message_id_for(entry)
        client = self._client()
        timeout = httpx.Timeout(self.verify_timeout, connect=self.connect_timeout)
        try:
            # ``verify_timeout`` is the whole verification's deadline, not a per-read one.
            async with asyncio.timeout(self.verify_timeout):
                status, body, _ = await self._get(
                    client, f"{self.base_url}/session/{sid}/message/{mid}", timeout
                )
                if status == 200:
                    found = _user_message_has_text(json.loads(body), entry.text)
                    return Verdict.DELIVERED if found else Verdict.INCONCLUSIVE
                if status != 404:
                    return Verdict.INCONCLUSIVE
                return await self._judge_transcript(
                    client, entry, mid, f"{self.base_url}/session/{sid}/message", timeout
                )
        except (httpx.HTTPError, Unreadable, ValueError, RecursionError, TimeoutError):
            return Verdict.INCONCLUSIVE

    async def _get(
        self, client: httpx.AsyncClient, url: str, limits: httpx.Timeout, *, paged: bool = False
    ) -> tuple[int, bytearray, str | None]:
        """GET ``url`` on the agent: ``(status, body, next page's URL or None)``.

        Reads at most ``max_response_bytes`` of the body (raw: the client asks for no
        compression). With ``paged``, the next page is ``Link: rel=next`` resolved
        against ``url``. Raises ``httpx.HTTPError``, or :class:`Unreadable` for a body
        too large or compressed anyway, and for a next link to another origin (scheme,
        host, port) or with credentials in it: the agent's credentials go to the agent
        only.
        """
        async with client.stream("GET", url, timeout=limits) as response:
            body = await read_bounded(response, self.max_response_bytes)
            link = response.links.get("next", {}).get("url") if paged else None
            if not link:
                return response.status_code, body, None
            try:
                next_url = httpx.URL(urljoin(str(response.url), link))
            except httpx.InvalidURL as exc:  # not an httpx.HTTPError
                raise Unreadable(f"an invalid next link: {exc}") from exc
            if next_url.userinfo or origin(next_url) != origin(httpx.URL(self.base_url)):
                raise Unreadable("a next link to another origin")
            return response.status_code, body, str(next_url)

    async def _judge_transcript(
        self, client: httpx.AsyncClient, entry: Entry, mid: str, url: str, limits: httpx.Timeout
    ) -> Verdict:
        """Step 2 of :meth:`verify` over every page of the transcript. Each page is read
        whole and parsed one message at a time, so one page's text and one message are
        all that is held. Raises what :meth:`_get` raises, and ``ValueError`` for a page
        that is not a JSON array; the verdict of the first deciding message stands, but
        only once every page was read."""
        try:
            window_ms = parse_time(entry.last_attempt_at or entry.accepted_at) // 1000
        except (TypeError, ValueError):
            return Verdict.INCONCLUSIVE
        window_ms -= int(self.clock_skew * 1000)
        verdict: Verdict | None = None
        next_url: str | None = url
        for _ in range(100):
            if next_url is None:
                break
            status, body, next_url = await self._get(client, next_url, limits, paged=True)
            if status != 200:
                return Verdict.INCONCLUSIVE
            text = body.decode(json.detect_encoding(body), "surrogatepass")
            del body
            for message in _json_array(text):
                if verdict is None:
                    verdict = self._judge_message(entry, mid, window_ms, message)
            if next_url is None:
                return Verdict.ABSENT if verdict is None else verdict
        return Verdict.INCONCLUSIVE  # more pages than we are willing to read: partial

    @staticmethod
    def _judge_message(entry: Entry, mid: str, window_ms: int, message: Any) -> Verdict | None:
        """DELIVERED or INCONCLUSIVE if ``message`` decides, None to look further."""
        has_text = _user_message_has_text(message, entry.text)
        if has_text is None:
            return Verdict.INCONCLUSIVE
        info = message["info"]
        if info.get("id") == mid:
            # Stored between our two GETs (or the server's lookup is inconsistent).
            return Verdict.DELIVERED if has_text else Verdict.INCONCLUSIVE
        if not has_text:
            return None
        times = info.get("time")
        created = times.get("created") if isinstance(times, dict) else None
        if isinstance(created, bool) or not isinstance(created, int | float):
            return Verdict.INCONCLUSIVE  # our text, but we cannot place it in time
        return Verdict.DELIVERED if created >= window_ms else None


# --- its settings: OUTBOX["OPENCODE"] -------------------------------------------------------------


def _opencode_name(key: str) -> str:
    return f"OUTBOX['OPENCODE'][{key!r}]"


def _http_url(name: str, value: Any) -> str:
    """``value`` without a trailing slash if it is an http(s) URL (its credentials are
    remembered for redaction), else raise naming ``name`` (credentials redacted)."""
    url, why = http_url(value, "http://127.0.0.1:4096")
    if url is None:
        raise ImproperlyConfigured(f"{name} {why}")
    return url


def _workspace_urls(value: Any) -> Mapping[str, str] | Callable[[str], Any]:
    """A ``WORKSPACE_URLS`` dict with its URLs checked, or a callable; raises otherwise."""
    name = _opencode_name("WORKSPACE_URLS")
    if isinstance(value, Mapping):
        return {ws: _http_url(f"{name}[{ws!r}]", url) for ws, url in value.items()}
    if callable(value):
        return value
    raise ImproperlyConfigured(f"{name} must be a dict, a callable or a dotted path to one")


# The kinds of the OPENCODE keys raise ConfigError naming the key inside the block (_opencode
# puts OUTBOX['OPENCODE'] in front), or, for a URL, ImproperlyConfigured naming the entry.


def _base_url(key: str, value: Any) -> str | None:
    return None if value is None else _http_url(_opencode_name(key), value)


def _workspace_urls_setting(key: str, value: Any) -> Any:
    """A dotted path is kept as it is: it is imported on first use (``_workspace_lookup``)."""
    return value if value is None or isinstance(value, str) else _workspace_urls(value)


def _username(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value or ":" in value:
        raise ConfigError(key, "must be a non-empty string without ':'")
    return value


def _password(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(key, "must be a string or None")
    return value


@dataclass(frozen=True)
class OpencodeSettings:
    """Validated ``OUTBOX["OPENCODE"]`` (docs/howto/deliverer.md, "The built-in opencode
    deliverer"): each key is a field below, in lower case.

    As stored: ``base_url`` without a trailing slash; ``workspace_urls`` a dict with its
    URLs checked, a callable (sync or async), or its dotted path (imported on first use,
    see :meth:`aurl_for`); credentials in a URL's userinfo are used when ``password`` is
    None; timeouts and ``clock_skew`` in float seconds.
    """

    # Checked in this order (a block with two wrong keys names the first).
    base_url: str | None = setting(
        None, kind=_base_url, doc="the opencode serve URL; required unless WORKSPACE_URLS"
    )
    # setting() returns a dataclasses.field, which RUF009 cannot see through this annotation.
    workspace_urls: Mapping[str, str] | Callable[[str], Any] | str | None = setting(  # noqa: RUF009
        None,
        kind=_workspace_urls_setting,
        doc="{workspace_id: URL}, a callable (workspace_id) -> URL or None, or its path",
    )
    username: str = setting("opencode", kind=_username, doc="the HTTP Basic user")
    password: str | None = setting(
        None, kind=_password, doc="the HTTP Basic password; no auth when None"
    )
    max_response_bytes: int = setting(
        DEFAULT_MAX_RESPONSE_BYTES,
        kind=response_bytes,
        doc="the most the verifier reads of one answer",
    )
    connect_timeout: float = setting(5.0, kind=DURATION, doc="connecting to the agent")
    timeout: float = setting(
        declared(Config)["delivery_timeout"].default,
        kind=DURATION,
        doc="one delivery request; the default is DELIVERY_TIMEOUT",
    )
    verify_timeout: float = setting(30.0, kind=DURATION, doc="each read of the verifier's GETs")
    clock_skew: float = setting(
        2.0, kind=DURATION_OR_ZERO, doc="tolerance comparing the agent's times with the entry's"
    )

    @cached_property
    def _workspace_lookup(self) -> Mapping[str, str] | Callable[[str], Any] | None:
        value = self.workspace_urls
        if isinstance(value, str):
            try:
                value = import_string(value)
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"{_opencode_name('WORKSPACE_URLS')} cannot be imported: {exc}"
                ) from exc
            value = _workspace_urls(value)
        return value

    async def aurl_for(self, workspace_id: str) -> str:
        """The opencode server URL for ``workspace_id`` (no trailing slash).

        ``WORKSPACE_URLS`` first (a missing workspace or a callable's None falls back
        to ``BASE_URL``). Raises ``ImproperlyConfigured`` when there is no URL, when a
        dotted path does not import, or when the callable returns a non-http(s) URL.
        """
        lookup = self._workspace_lookup
        url: Any = None
        if isinstance(lookup, Mapping):
            url = lookup.get(workspace_id)
        elif lookup is not None:
            url = lookup(workspace_id)
            if inspect.isawaitable(url):
                url = await url
            if url is not None:
                url = _http_url(f"{_opencode_name('WORKSPACE_URLS')}({workspace_id!r})", url)
        url = url or self.base_url
        if url is None:
            raise ImproperlyConfigured(
                f"no opencode URL for workspace {workspace_id!r}: "
                f"{_opencode_name('WORKSPACE_URLS')} has none and BASE_URL is not set"
            )
        return url


def parse_settings(raw: Any, delivery_timeout: float) -> OpencodeSettings:
    """Validate ``OUTBOX["OPENCODE"]`` (``django_outbox.conf`` calls it when the block is
    set). Raises ``ImproperlyConfigured`` naming the first wrong key and its rule."""
    if isinstance(raw, Mapping) and raw.get("BASE_URL") is None and not raw.get("WORKSPACE_URLS"):
        raise ImproperlyConfigured(f"{_opencode_name('BASE_URL')} is required (or WORKSPACE_URLS)")
    values: dict[str, Any] = {}
    try:
        return parse_block(
            OpencodeSettings,
            raw,
            "OUTBOX['OPENCODE']",
            delivery_timeout=delivery_timeout,
            values=values,
        )
    finally:
        # Good credentials are redacted from now on, even when a later key is wrong.
        if "password" in values:
            remember_credentials(values["username"], values["password"])


# --- settings-driven module functions ---------------------------------------------
#
# OUTBOX["OPENCODE"] is parsed by parse_settings above, for django_outbox.conf. One
# client per base URL, made from the settings object it came from: when conf.py rebuilds its
# settings (setting_changed, conf.reset()), the next client_for() sees a new object and makes
# new clients, the old ones kept until aclose() has closed them.

_made = Made()


def _opencode_settings() -> OpencodeSettings:
    block: OpencodeSettings | None = outbox_settings().blocks.get("OPENCODE")
    if block is None:
        raise ImproperlyConfigured(
            "OUTBOX['OPENCODE'] is required by django_outbox.delivery.opencode "
            "(a dict with at least BASE_URL)"
        )
    return block


async def client_for(workspace_id: str) -> OpencodeClient:
    """The cached :class:`OpencodeClient` serving ``workspace_id`` under the current settings.

    One client per base URL. Raises ``ImproperlyConfigured`` for bad settings.
    ``WORKSPACE_URLS`` may be a dict, or a callable ``(workspace_id) -> URL | None``
    (sync or async; a sync one must not block) or its dotted path; a missing
    workspace or ``None`` falls back to ``BASE_URL``
    (:meth:`OpencodeSettings.aurl_for`).
    """
    s = _opencode_settings()
    url = await s.aurl_for(workspace_id)
    _made.drop(lambda key, source: source is s)  # settings replaced: every URL's client

    def make() -> OpencodeClient:
        names = "username password connect_timeout timeout verify_timeout clock_skew"
        return OpencodeClient(url, **settings_kwargs(s, names + " max_response_bytes"))

    client: OpencodeClient = _made.get(url, s, make)
    return client


# A merged delivery is one message with a text part per prompt. aclose closes the running
# loop's httpx clients of every cached (and replaced) opencode client: call it from each
# event loop that used deliver / verify before that loop ends (the worker at shutdown).
def _validate(name: str, options: Any) -> None:
    """``validate_agent_options`` of the callables below: ``manage.py check`` (E002, E008)
    and the worker's start refuse them without an ``OUTBOX["OPENCODE"]`` block."""
    _opencode_settings()


deliver, verify, abort = module_face(client_for, OpencodeClient, __name__, (_validate,) * 3)
aclose = _made.aclose
