"""Credentials out of every text that leaves the process (docs/explanation/security.md).

:func:`redact` is the one door: stored error texts go through it (``rules.clean_text``),
and so do the package's log lines, their tracebacks included (:class:`RedactingFilter`,
attached to every ``django_outbox`` logger when the core is imported), system check
messages and command errors. It removes:

* the userinfo of any ``scheme://user:password@host`` URL (``redis``, ``rediss``,
  ``unix``, ``http(s)``, ...): ``redis://user:***@host``; a userinfo without ``:`` is
  taken for a token and replaced whole;
* the value of ``password=``, ``token=``, ``secret=``, ``api_key=`` (and the like) in
  query strings, ``key=value`` lists and ``"password": "..."`` mappings;
* ``Authorization`` / ``Proxy-Authorization`` values and ``Basic`` / ``Bearer`` tokens;
* every password the process was configured with, wherever it appears (as given,
  percent-encoded or decoded, and as the Basic token it makes):
  :func:`remember_url`, :func:`remember_credentials` and :func:`remember_secret`
  register them (the settings do it for ``VALKEY_URL`` and ``OUTBOX["OPENCODE"]``).
  Values shorter than :data:`MIN_SECRET_CHARS` are only removed where they stand as a
  credential, since removing them everywhere would mangle ordinary words.

No Django imports; nothing here raises on odd input.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import quote, quote_plus, unquote, urlsplit

#: What replaces a credential.
MASK = "***"
#: Remembered values shorter than this are not removed everywhere (see the module docstring).
MIN_SECRET_CHARS = 4
#: The package's loggers; :func:`protect_loggers` gives each a :class:`RedactingFilter`.
LOGGER_NAMES = (
    "django_outbox",
    "django_outbox.worker",
    "django_outbox.ws",
    "django_outbox.events",  # the publisher's name in 0.1.0 (deprecated)
    "django_outbox.consumers",
    "django_outbox.policy",
)

# scheme://userinfo@ — greedy up to the last "@" before the host (a password may hold "@").
# A scheme starts only where no scheme character precedes it: linear on any input.
_USERINFO = re.compile(
    r"(?P<scheme>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#'\"<>`]*)@"
)
_NAMES = (
    r"password|passwd|pwd|secret|client_secret|token|access_token|refresh_token|"
    r"api_key|apikey|api-key"
)
# password=value (query strings, kwargs, key=value lists) and "password": "value" mappings.
_ASSIGNED = re.compile(
    rf"(?i)(?<![\w-])(?:(?P<q>[\"'])(?P<qname>{_NAMES})(?P=q)\s*:\s*|(?P<name>{_NAMES})\s*=\s*)"
    r"(?P<value>'[^']*'|\"[^\"]*\"|[^\s&#,;'\"<>)\]}]*)"
)
# Authorization: <scheme> <credentials>, as a header line or in a mapping's repr.
_HEADER = re.compile(
    r"(?i)(?P<head>(?<![\w-])(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?"
    r"(?:(?:basic|bearer|digest|token|negotiate)\s+)?)(?P<value>[^\s\"',;}\]]+)"
)
# A bare Basic/Bearer token: token68 characters, with a digit or a symbol in it (so the
# words after "Basic" in "Basic authentication failed" stay).
_TOKEN = re.compile(
    r"(?P<head>\b(?:Basic|Bearer|basic|bearer)\s+)"
    r"(?P<value>(?=[A-Za-z0-9._~+/-]*[0-9._~+/-])[A-Za-z0-9._~+/-]{6,}=*)"
)

_lock = threading.Lock()
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _masked_userinfo(match: re.Match[str]) -> str:
    userinfo = match["userinfo"]
    if not userinfo:
        return match[0]
    user, colon, _ = userinfo.partition(":")
    kept = f"{user}:{MASK}" if colon else MASK
    return f"{match['scheme']}{kept}@"


def _masked_assignment(match: re.Match[str]) -> str:
    value = match["value"]
    head = match[0][: match.start("value") - match.start()]
    if value[:1] in ("'", '"') and len(value) >= 2:
        return f"{head}{value[0]}{MASK}{value[0]}"
    return f"{head}{MASK}"


def _masked_value(match: re.Match[str]) -> str:
    return f"{match['head']}{MASK}"


def redact(text: str) -> str:
    """``text`` without credentials (see the module docstring); other text is unchanged.

    Never raises; a non-str is returned as it is.
    """
    if not isinstance(text, str) or not text:
        return text
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    text = _USERINFO.sub(_masked_userinfo, text)
    text = _ASSIGNED.sub(_masked_assignment, text)
    text = _HEADER.sub(_masked_value, text)
    return _TOKEN.sub(_masked_value, text)


# --- what the process was configured with -------------------------------------------------


def _forms(value: str) -> set[str]:
    """The ways ``value`` may be written: as given, decoded, encoded, as a repr or JSON."""
    decoded = unquote(value)
    forms = {value, decoded}
    for form in (value, decoded):
        forms |= {quote(form, safe=""), quote(form), quote_plus(form)}
        forms |= {repr(form)[1:-1], json.dumps(form)[1:-1]}
    return forms


def remember_secret(value: object) -> None:
    """Remove ``value`` (a password or token; None and "" are ignored) from every text
    :func:`redact` sees from now on, in each of its usual spellings."""
    if not isinstance(value, str) or not value:
        return
    global _pattern
    with _lock:
        new = {form for form in _forms(value) if len(form) >= MIN_SECRET_CHARS} - _secrets
        if not new:
            return
        _secrets.update(new)
        ordered = sorted(_secrets, key=len, reverse=True)  # the longest spelling first
        _pattern = re.compile("|".join(re.escape(s) for s in ordered))


def remember_credentials(username: str | None, password: str | None) -> None:
    """Remember an HTTP Basic password and the ``base64(username:password)`` token it makes."""
    if not password:
        return
    remember_secret(password)
    token = base64.b64encode(f"{username or ''}:{password}".encode()).decode("ascii")
    remember_secret(token)


def remember_url(url: object) -> None:
    """Remember the password (and a userinfo-only token) of ``url``, and the values of its
    ``password=``-like query parameters. Never raises."""
    if not isinstance(url, str):
        return
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
    except ValueError:
        return
    if "@" in netloc:
        userinfo = netloc.rpartition("@")[0]
        user, colon, password = userinfo.partition(":")
        if colon:
            remember_credentials(unquote(user), unquote(password))
            remember_secret(password)
        else:
            remember_secret(user)
    for match in _ASSIGNED.finditer(parts.query):
        value = match["value"].strip("'\"")
        remember_secret(value)
        remember_secret(unquote(value))


# --- logging --------------------------------------------------------------------------------


class RedactingFilter(logging.Filter):
    """A ``logging.Filter`` that passes every record with its credentials removed.

    The message is formatted once and redacted (``args`` are then dropped); a traceback
    (``exc_info``) or ``stack_info`` holding a credential is replaced by its redacted
    text (``exc_text``), so no handler can format the original. Attach it to a logger
    (only records made there) or to a handler (every record it emits).
    """

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True  # logging reports the broken call itself
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[0] is not None:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            cleaned = redact(text)
            if cleaned != text:
                record.exc_info, record.exc_text = None, cleaned
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


_filter = RedactingFilter()


def protect_loggers(names: Iterable[str] = LOGGER_NAMES) -> None:
    """Attach the shared :class:`RedactingFilter` to each named logger (once)."""
    for name in names:
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)


protect_loggers()
