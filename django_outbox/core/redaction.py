"""Credentials out of every text that leaves the process (docs/explanation/security.md).

:func:`redact` is the one door: stored error texts go through it (``rules.clean_text``),
and so do the package's log lines, their tracebacks included (:class:`RedactingFilter`,
attached to every ``django_outbox`` logger when the core is imported), system check
messages and command errors. It removes, whatever the text around them (an agent's
error body often echoes its request headers and environment):

* the userinfo of any ``scheme://user:password@host`` URL (``redis``, ``rediss``,
  ``unix``, ``http(s)``, ...): ``redis://user:***@host``; a userinfo without ``:`` is
  taken for a token and replaced whole; and the password of a ``user:password@host``
  written without a scheme (``app:***@db:5432``);
* the value given to any name holding a secret word as a whole part (``password``,
  ``passwd``, ``pwd``, ``pass``, ``secret``, ``token``, ``credentials``, ``api_key``,
  ``access_key``, ``private_key``, ``sessionid``, ...): environment lines
  (``DB_PASSWORD=…``, ``OPENAI_API_KEY=…``, ``AWS_SECRET_ACCESS_KEY=…``), query
  strings and ``key=value`` lists, headers (``X-Api-Key: …``), YAML (``password: …``),
  JSON and Python mappings (``"x-api-key": "…"``), JSON escaped inside JSON;
* ``Cookie`` / ``Set-Cookie`` values, every pair of them;
* ``Authorization`` / ``Proxy-Authorization`` values and ``Basic`` / ``Bearer`` tokens
  (a ``Bearer`` followed by a word of prose, "Bearer authentication", stays);
* tokens of a well-known shape wherever they stand: ``sk-…`` (OpenAI, Anthropic),
  ``sk_live_…``, ``ghp_…`` / ``gho_…`` / ``github_pat_…``, ``glpat-…``, ``xoxb-…`` and
  the other Slack tokens, ``hf_…``, ``npm_…``, ``AIza…``, ``AKIA…`` AWS access key IDs
  and JSON Web Tokens;
* PEM private key blocks, from ``-----BEGIN … PRIVATE KEY-----`` to its ``END`` line
  (to the end of the text when a cut removed it);
* every password the process was configured with, wherever it appears (as given,
  percent-encoded in either case or decoded, base64-encoded, and as the Basic token it
  makes): :func:`remember_url`, :func:`remember_credentials` and :func:`remember_secret`
  register them (the settings do it for ``VALKEY_URL`` and ``OUTBOX["OPENCODE"]``).
  Values shorter than :data:`MIN_SECRET_CHARS` are only removed where they stand as a
  credential, since removing them everywhere would mangle ordinary words.

Ordinary text stays as it is ("token bucket full", "password reset link sent",
"Basic authentication failed"). No Django imports; nothing here raises on odd input.

Every pattern runs in time linear in the text, whatever it holds (an agent's body is
hostile input): each may start only where a run of its characters starts (a
look-behind), its repeats are bounded (``{0,64}``) or cannot overlap the part that
follows them, and a scan that looks for a closing quote or line stops at the first
candidate. The comments at each pattern say which.
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
# A scheme starts only where no scheme character precedes it, and the userinfo cannot pass
# a "/", which every later start holds: linear on any input.
_USERINFO = re.compile(
    r"(?P<scheme>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#'\"<>`]*)@"
)
# user:password@host without a scheme (a DSN, "app:pw@db:5432"): it starts only after
# whitespace, a quote, a bracket or "=", ",", ";" (or at the start); the password is
# bounded (128 characters) so that no start scans further. "mailto:" is an address.
_BARE_USERINFO = re.compile(
    r"(?<![^\s\"'(<\[{=,;])(?!mailto:)(?P<user>[^\s:/@\"'<>()\[\]{}=,;]{1,64}):"
    r"(?P<password>[^\s/?#\"'<>]{1,128})@(?=[A-Za-z0-9\[])"
)

# A secret word, as a whole part of a name (case-insensitive): the distinctive words may
# follow letters (PGPASSWORD, accessToken, clientSecret, csrftoken, JSESSIONID); "key"
# counts only after a qualifier (api_key, SECRET_ACCESS_KEY, x-api-key), and "pass" and
# "pwd" only as a part of their own (DB_PASS, not bypass). "sessionid" is case-sensitive
# so that the outbox's own "sessionID" (not a secret) stays.
_SECRET_WORD = (
    r"[a-z0-9]{0,24}?(?:password|passwd|passphrase|secret|token|credentials?|apikey)"
    r"|(?:api|access|secret|private|signing|encryption|master|client|auth|app|account|service)"
    r"[_.-]?key"
    r"|pass|pwd"
    r"|(?-i:[A-Za-z0-9]{0,24}?(?:sessionid|SESSIONID|sessid|SESSID))"
)
# A name: letters, digits, "_", "." and "-" (at most 64), starting with a secret word
# where a run or a part of one starts (the look-behind: no letter or digit before it;
# "OPENAI_API_KEY" matches from "API"), the word not followed by a letter or digit
# ("tokenizer", "max_tokens" and "passwordless" are not secret names). Every repeat is
# bounded: constant work per start.
_NAME = (
    r"(?<![A-Za-z0-9])"
    rf"(?=(?:{_SECRET_WORD})(?![a-z0-9]))"
    r"[\w.\-]{1,64}"
)
# A quoted value: a JSON string with its escapes, a Python repr's '...', or either quote
# escaped (once or more: JSON inside a JSON string, \"...\", or deeper) and closed by the
# same escaped quote with no backslash before it (a quote escaped once more is inside).
# Each scan ends at the first quote or newline that can close it (an escaped quote ends at
# the next such escape; there are at most 14 kinds of them). An opening quote never
# closed (a cut excerpt) runs to the next quote or line end.
_QUOTED = (
    r"\"(?:[^\"\\\n]|\\.)*\""
    r"|'(?:[^'\\\n]|\\.)*'"
    r"|(?P<escaped>\\{1,7}[\"'])(?:(?!(?<!\\)(?P=escaped))[^\n])*(?<!\\)(?P=escaped)"
    r"|\\{0,7}[\"'][^\"'\n]*"
)
# name=value, name: value, "name": "value" (and \"name\": \"value\"), with an optional
# auth scheme before a bare value (X-Auth-Token: Bearer abc).
_ASSIGNED = re.compile(
    rf"(?i)(?P<name>{_NAME})\\{{0,7}}[\"']?[ \t]*[=:][ \t]*"
    rf"(?P<value>{_QUOTED}|(?:(?:bearer|basic|token)[ \t]+)?[^\s&#,;'\"<>)\]}}]+)"
)
# Cookie / Set-Cookie: a quoted value, or every name=value pair of the header.
_COOKIE = re.compile(
    r"(?i)(?P<head>(?<![\w.\-])(?:set-)?cookie\\{0,7}[\"']?[ \t]*[:=][ \t]*)"
    rf"(?P<value>{_QUOTED}|[^\s;,\"']+(?:;[ \t]*[^\s;,\"'=]+=[^\s;,\"']*)*)"
)
# Authorization: <scheme> <credentials>, as a header line or in a mapping's repr.
_HEADER = re.compile(
    r"(?i)(?P<head>(?<![\w-])(?:proxy-)?authorization\\{0,7}[\"']?\s*[:=]\s*\\{0,7}[\"']?"
    r"(?:(?:basic|bearer|digest|token|negotiate)\s+)?)(?P<value>[^\s\"',;}\]\\]+)"
)
# A bare Basic/Bearer token: token68 characters (at least 6); see _is_credential for
# which words after the scheme are taken for a token.
_TOKEN = re.compile(
    r"(?P<head>\b(?P<scheme>Basic|Bearer|basic|bearer|BASIC|BEARER)\s+)"
    r"(?P<value>[A-Za-z0-9._~+/-]{6,}=*)"
)
#: Words that follow "Bearer" in prose rather than a token (6 letters or more: a shorter
#: word is never taken for a token).
_PROSE_AFTER_SCHEME = frozenset(
    "access authentication authorisation authorization cannot challenge credential "
    "credentials expired format header headers instead invalid missing prefix realm "
    "required scheme should string tokens".split()
)
_MIXED_CASE = re.compile(r"[a-z][A-Z]")
# Tokens of a well-known shape, wherever they stand (not inside a longer word): a fixed
# prefix, then one run of the token's characters, so a failed start costs its prefix.
_SHAPED = re.compile(
    r"(?<![A-Za-z0-9_\-])(?:"
    r"sk-[A-Za-z0-9_\-]{20,}"  # OpenAI (sk-, sk-proj-, sk-svcacct-), Anthropic (sk-ant-)
    r"|[rs]k_(?:live|test)_[A-Za-z0-9]{10,}"  # Stripe
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|xox[abeoprs]-[A-Za-z0-9\-]{10,}|xapp-[A-Za-z0-9\-]{10,}"  # Slack
    r"|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{30,}"  # Hugging Face, npm
    r"|AIza[A-Za-z0-9_\-]{35}"  # Google API keys
    r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"  # AWS access key IDs
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*"  # JSON Web Tokens
    r")"
)
# A PEM private key block, to its END line or, when a cut removed it, to the end of the
# text. The lazy scan stops at the first END line; a block without one takes the rest of
# the text, later BEGIN lines included, so no start scans twice.
_PEM = re.compile(
    r"-----BEGIN (?P<label>[A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?)-----"
    r"[\s\S]*?(?P<end>-----END [A-Z0-9 ]{0,40}?PRIVATE KEY(?: BLOCK)?-----|\Z)"
)
_OPENING_QUOTE = re.compile(r"\\{0,7}[\"']")
#: A percent-escape in a remembered spelling: matched in either case (%2f is %2F).
_PERCENT_ESCAPE = re.compile(r"(%[0-9A-Fa-f]{2})")

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


def _masked_bare_userinfo(match: re.Match[str]) -> str:
    return f"{match['user']}:{MASK}@"


def _masked_quoted(value: str) -> str:
    """``value`` masked, keeping its quotes (``"***"``, ``'***'``, ``\\"***\\"``; an
    unclosed quote stays unclosed)."""
    opening = _OPENING_QUOTE.match(value)
    if opening is None:
        return MASK
    quote_ = opening[0]
    closed = len(value) >= 2 * len(quote_) and value.endswith(quote_)
    return f"{quote_}{MASK}{quote_ if closed else ''}"


def _masked_assignment(match: re.Match[str]) -> str:
    head = match[0][: match.start("value") - match.start()]
    return f"{head}{_masked_quoted(match['value'])}"


def _masked_value(match: re.Match[str]) -> str:
    return f"{match['head']}{MASK}"


def _is_credential(scheme: str, value: str) -> bool:
    """Whether the word after ``Basic`` / ``Bearer`` is a credential rather than prose:
    it holds a digit or a symbol, mixes case inside (``dXNlcjpwYXNz``), is 16 characters
    or more, or follows ``Bearer`` and is no word of :data:`_PROSE_AFTER_SCHEME`."""
    if not value.isalpha() or _MIXED_CASE.search(value) or len(value) >= 16:
        return True
    return scheme.lower() == "bearer" and value.lower() not in _PROSE_AFTER_SCHEME


def _masked_token(match: re.Match[str]) -> str:
    if _is_credential(match["scheme"], match["value"]):
        return f"{match['head']}{MASK}"
    return match[0]


def _masked_pem(match: re.Match[str]) -> str:
    label = match["label"]
    end = f"-----END {label}-----" if match["end"] else ""
    return f"-----BEGIN {label}-----{MASK}{end}"


def redact(text: str) -> str:
    """``text`` without credentials (see the module docstring); other text is unchanged.

    Never raises; a non-str is returned as it is.
    """
    if not isinstance(text, str) or not text:
        return text
    pattern = _pattern
    if pattern is not None:
        text = pattern.sub(MASK, text)
    text = _PEM.sub(_masked_pem, text)
    text = _USERINFO.sub(_masked_userinfo, text)
    text = _BARE_USERINFO.sub(_masked_bare_userinfo, text)
    text = _COOKIE.sub(_masked_assignment, text)
    text = _HEADER.sub(_masked_value, text)
    text = _ASSIGNED.sub(_masked_assignment, text)
    text = _TOKEN.sub(_masked_token, text)
    return _SHAPED.sub(MASK, text)


# --- what the process was configured with -------------------------------------------------


def _forms(value: str) -> set[str]:
    """The ways ``value`` may be written: as given, decoded, encoded, as a repr or JSON,
    and base64-encoded (standard and URL-safe, with and without padding)."""
    decoded = unquote(value)
    forms = {value, decoded}
    for form in (value, decoded):
        forms |= {quote(form, safe=""), quote(form), quote_plus(form)}
        forms |= {repr(form)[1:-1], json.dumps(form)[1:-1]}
        if len(form) >= MIN_SECRET_CHARS:
            raw = form.encode("utf-8", "surrogatepass")
            for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
                forms |= {encoded.decode("ascii"), encoded.decode("ascii").rstrip("=")}
    return forms


def _spelled(form: str) -> str:
    """A pattern matching ``form`` literally, its percent-escapes in either case."""
    parts = _PERCENT_ESCAPE.split(form)
    return "".join(
        f"%[{part[1].upper()}{part[1].lower()}][{part[2].upper()}{part[2].lower()}]"
        if index % 2
        else re.escape(part)
        for index, part in enumerate(parts)
    )


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
        _pattern = re.compile("|".join(_spelled(s) for s in ordered))


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
