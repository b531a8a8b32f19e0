"""Credentials out of every text that leaves the process (docs/explanation/security.md).

:func:`redact` is the one door: stored error texts go through it (``rules.clean_text``),
and so do the package's log lines, their tracebacks included (:class:`RedactingFilter`,
attached to every ``django_outbox`` logger when the core is imported), system check
messages and command errors. It removes, whatever the text around them (an agent's
error body often echoes its request headers and environment):

* the userinfo of any ``scheme://user:password@host`` URL (``redis``, ``rediss``,
  ``unix``, ``http(s)``, ...): ``redis://user:***@host``; a userinfo without ``:`` is
  taken for a token and replaced whole; the password of a scheme-relative
  ``//user:password@host`` (``//app:***@db:5432``; a ``//`` without a ``:`` before its
  ``@`` is a comment, not a URL); and the password of a ``user:password@host`` written
  without a scheme (``app:***@db:5432``);
* the value given to any name holding a secret word as a whole part (``password``,
  ``passwd``, ``pwd``, ``pass``, ``secret``, ``token``, ``credentials``, ``api_key``,
  ``access_key``, ``private_key``, ``sessionid``, ...): environment lines
  (``DB_PASSWORD=…``, ``OPENAI_API_KEY=…``, ``AWS_SECRET_ACCESS_KEY=…``), query
  strings and ``key=value`` lists, headers (``X-Api-Key: …``), YAML (``password: …``),
  JSON and Python mappings (``"x-api-key": "…"``), JSON escaped inside JSON. The sign
  may be percent-encoded (``password%3D…``, ``%253D``, ``%22password%22%3A…``), the
  full-width or small equals sign or colon (U+FF1D, U+FE66, U+FF1A, U+FE55, U+FE13) or a
  colon look-alike (U+2236, U+A789), also as JSON escapes it (``\\uff1d``), with
  ideographic spaces around it; the value may stand alone on the next line
  (``password =\\n…``, YAML's ``password: |\\n  …``; a next line that holds more than
  one word, "Enter password:\\nThen press Enter", is prose and stays);
* ``Cookie`` / ``Set-Cookie`` values, every pair of them;
* ``Authorization`` / ``Proxy-Authorization`` values and ``Basic`` / ``Bearer`` tokens
  (a ``Bearer`` followed by a word of prose, "Bearer authentication", stays), also
  percent- or form-encoded (``Bearer%20…``, ``Bearer+…``);
* tokens of a well-known shape wherever they stand: ``sk-…`` (OpenAI, Anthropic),
  Stripe's secret and restricted keys (``sk_live_…``, ``rk_test_…``, ``sk-live-…``) and
  webhook secrets (``whsec_…``), ``ghp_…`` / ``gho_…`` / ``github_pat_…``, ``glpat-…``,
  ``xoxb-…`` and the other Slack tokens, ``hf_…``, ``npm_…``, ``AIza…``, ``AKIA…`` AWS
  access key IDs with the secret key written next to one (``id:secret``, a CSV row),
  and JSON Web Tokens. Stripe's publishable keys (``pk_live_…``) are public by design
  and stay;
* PEM private key blocks, from ``-----BEGIN … PRIVATE KEY-----`` to its ``END`` line
  (to the end of the text when a cut removed it);
* every password the process was configured with, wherever it appears: as given or
  decoded, base64-encoded in either alphabet, as the Basic token it makes, in any case,
  and with any of its characters escaped (percent-encoded, once or twice; an HTML
  reference, ``&#x73;``, ``&amp;``, escaped twice; a JSON, JavaScript or Python escape,
  ``\\u0073``, ``\\x73``, ``\\"``, at any depth): :func:`redact` decodes the escapes
  of a text once and masks a secret found there from its first to its last escape.
  :func:`remember_url`, :func:`remember_credentials` and :func:`remember_secret`
  register them (the settings do it for ``VALKEY_URL`` and ``OUTBOX["OPENCODE"]``).
  Values shorter than :data:`MIN_SECRET_CHARS` are only removed where they stand as a
  credential, since removing them everywhere would mangle ordinary words.

Ordinary text stays as it is ("token bucket full", "password reset link sent",
"Basic authentication failed"). No Django imports; nothing here raises on odd input.

Every pattern runs in time linear in the text, whatever it holds (an agent's body is
hostile input): each may start only where a run of its characters starts (a
look-behind), its repeats are bounded (``{0,64}``), cannot overlap the part that
follows them or are taken whole (atomic), and a scan that looks for a closing quote or
line stops at the first candidate. The comments at each pattern say which. A megabyte
of the worst near misses takes about half a second in all (tests/django/test_redaction.py).
"""

from __future__ import annotations

import base64
import bisect
import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

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

# scheme://userinfo@ — greedy up to the last "@" before the host (a password may hold "@"),
# or a scheme-relative "//user:password@host" (a "//" where a word may start; without a ":"
# it is left, "//me@example.com" in a comment). A scheme starts only where no scheme
# character precedes it, and the userinfo cannot pass a "/", which every later start holds:
# linear on any input.
_USERINFO = re.compile(
    r"(?P<scheme>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://|//(?<![^\s\"'(<\[{=,;|>`]//))"
    r"(?P<userinfo>[^\s/?#'\"<>`]*)@"
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
# where a run or a part of one starts (the look-behind: no letter or digit before it, or a
# percent-escape, "%22password"; "OPENAI_API_KEY" matches from "API"), the word not
# followed by a letter or digit ("tokenizer", "max_tokens" and "passwordless" are not
# secret names). Every repeat is bounded: constant work per start; the name is taken whole
# (possessive: what follows it is never a name character), and a start that is no letter or
# digit fails at once.
_NAME = (
    r"(?=[a-z0-9])(?:(?<![A-Za-z0-9])|(?<=%[0-9A-Fa-f]{2}))"
    rf"(?=(?:{_SECRET_WORD})(?![a-z0-9]))"
    r"[\w.\-]{1,64}+"
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
# The signs of an assignment: "=" and ":", their full-width and small forms (U+FF1D,
# U+FE66; U+FF1A, U+FE55, U+FE13) and the colon look-alikes of rich text (U+2236 RATIO,
# U+A789 MODIFIER LETTER COLON); also percent-encoded, once or twice ("password%3D…",
# "%253D"), and those beyond ASCII as JSON escapes them ("\uff1d"; the patterns using it
# ignore case).
_SIGN = (
    r"(?:[=:\uff1d\ufe66\uff1a\ufe55\ufe13\u2236\ua789]|%(?:25){0,2}3[ad]"
    r"|\\{1,7}u(?:ff1[ad]|fe66|fe55|fe13|2236|a789))"
)
# Spaces around a sign: ASCII, no-break and ideographic (also as JSON escapes them).
_SPACE = r"(?:[ \t\u00a0\u3000]|\\{1,7}u(?:00a0|3000))"
# Where a bare value ends: space, the next pair of a list, a quote or a closing bracket, in
# ASCII or as CJK punctuation (full-width comma, semicolon and parenthesis, the ideographic
# comma and full stop).
_VALUE_END = "\\s&#,;'\"<>)\\]}\uff0c\u3001\u3002\uff1b\uff09"
# A line break, as it is or escaped in a JSON string or a repr, at any depth ("\\n").
_BREAK = r"(?:\r?\n|\\{1,7}(?:r\\{1,7})?n)"
# A YAML block scalar's indicator ("password: |", ">-"), its value on the lines below (or on
# the same line, once an excerpt is written on one line).
_BLOCK = rf"(?:[|>][-+1-9]{{0,2}}(?=[\s\\]){_SPACE}*)"
# A value on the next line ("password =\n  hunter2", YAML's "password: |\n  hunter2"): one
# line break, and a line that is no assignment of its own (YAML's "secrets:\n  db: …", whose
# value is found on that line), no list item. Bounded: constant work per start.
_NEXT_LINE = (
    rf"{_BREAK}{_SPACE}*"
    rf"(?!-{_SPACE}|\\{{0,7}}[\"']?[\w.\-]{{1,64}}\\{{0,7}}[\"']?{_SPACE}*{_SIGN})"
)
# name=value, name: value, "name": "value" (and \"name\": \"value\"), with an optional
# auth scheme before a bare value (X-Auth-Token: Bearer abc); the name's quote and the sign
# may be percent-encoded (%22password%22%3A%22…). A bare value on the next line must be all
# that line holds ("Enter password:\nLogin failed" keeps "Login"); it is taken whole (an
# atomic group, so no start scans it twice) and cannot pass a backslash (an escaped break).
_ASSIGNED = re.compile(
    rf"(?i)(?P<name>{_NAME})(?:\\{{0,7}}[\"']|%(?:25){{0,2}}2[27])?{_SPACE}*{_SIGN}{_SPACE}*"
    rf"{_BLOCK}?(?P<next>{_NEXT_LINE})?"
    rf"(?P<value>{_QUOTED}|(?:(?:bearer|basic|token)[ \t]+)?(?!{_BREAK})"
    rf"(?(next)(?>[^{_VALUE_END}\\]+)(?={_SPACE}*(?:[\r\n\\\"'<)\]}},;]|\Z))|[^{_VALUE_END}]+))"
)
# Cookie / Set-Cookie: a quoted value, or every name=value pair of the header.
_COOKIE = re.compile(
    rf"(?i)(?P<head>(?<![\w.\-])(?:set-)?cookie\\{{0,7}}[\"']?{_SPACE}*{_SIGN}{_SPACE}*)"
    rf"(?P<value>{_QUOTED}|[^\s;,\"']+(?:;[ \t]*[^\s;,\"'=]+=[^\s;,\"']*)*)"
)
# Space between a header's parts: white space, or percent-encoded or "+" in a query string.
_GAP_CHAR = r"\s|%(?:25)?20|\+"
_GAP = rf"(?:{_GAP_CHAR})*+"
# Authorization: <scheme> <credentials>, as a header line or in a mapping's repr (or
# percent-encoded: Authorization%3A%20Bearer%20…).
_HEADER = re.compile(
    rf"(?i)(?P<head>(?<![\w-])(?:proxy-)?authorization\\{{0,7}}[\"']?{_GAP}{_SIGN}{_GAP}"
    rf"\\{{0,7}}[\"']?(?:(?:basic|bearer|digest|token|negotiate)(?:{_GAP_CHAR})++)?)"
    r"(?P<value>[^\s\"',;}\]\\]+)"
)
# A bare Basic/Bearer token: token68 characters (at least 6); see _is_credential for
# which words after the scheme are taken for a token.
_TOKEN = re.compile(
    rf"(?P<head>\b(?P<scheme>Basic|Bearer|basic|bearer|BASIC|BEARER)(?:{_GAP_CHAR})++)"
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
    r"|[rs]k[_-](?:live|test)[_-][A-Za-z0-9]{10,}"  # Stripe secret, restricted: sk_live_, sk-live-
    r"|whsec_[A-Za-z0-9+/]{20,}"  # Stripe webhook signing secrets
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"  # GitHub
    r"|glpat-[A-Za-z0-9_\-]{20,}"  # GitLab
    r"|xox[abeoprs]-[A-Za-z0-9\-]{10,}|xapp-[A-Za-z0-9\-]{10,}"  # Slack
    r"|hf_[A-Za-z0-9]{30,}|npm_[A-Za-z0-9]{30,}"  # Hugging Face, npm
    r"|AIza[A-Za-z0-9_\-]{35}"  # Google API keys
    # AWS access key IDs, and the secret key written next to one ("id:secret", a CSV row)
    r"|(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"(?:[\\\"':,;|\s]{1,8}[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=]))?"
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
# One escaped character, as the texts around an agent write it: percent-encoded (a UTF-8
# sequence, the "%" itself encoded up to twice more: %40, %2540), an HTML character
# reference (&#64; &#x40; &amp; &quot;, escaped once more: &amp;#64;) or a backslash escape
# of JSON, JavaScript or a repr (\u0040, \U0001f600, \x40, \", \/, \\; more backslashes
# inside JSON inside JSON). Every repeat is bounded: constant work per start.
_PERCENT_BYTE = r"%(?:25){0,2}"
_ESCAPE = re.compile(
    rf"{_PERCENT_BYTE}(?P<ascii>[0-7][0-9A-Fa-f])"
    rf"|(?P<utf8>{_PERCENT_BYTE}[c-fC-F][0-9A-Fa-f](?:{_PERCENT_BYTE}[89abAB][0-9A-Fa-f]){{1,3}})"
    r"|&(?:amp;)?#(?:(?P<decimal>[0-9]{1,7})|[xX](?P<hex>[0-9A-Fa-f]{1,6}));?"
    r"|&(?:amp;)?(?P<named>amp|lt|gt|quot|apos);"
    r"|\\{1,7}(?:[uU](?P<u>[0-9A-Fa-f]{4}(?:(?<=U[0-9A-Fa-f]{4})[0-9A-Fa-f]{4})?)"
    r"|x(?P<x>[0-9A-Fa-f]{2})|(?P<char>[\"'/\\]))"
)
_NAMED_REFERENCES = {"amp": "&", "lt": "<", "gt": ">", "quot": '"', "apos": "'"}

_lock = threading.Lock()
#: Remembered spellings (see :func:`_spellings`).
_secrets: set[str] = set()
_pattern: re.Pattern[str] | None = None


def _masked_userinfo(match: re.Match[str]) -> str:
    userinfo = match["userinfo"]
    if not userinfo or (match["scheme"] == "//" and ":" not in userinfo):
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
        if _ESCAPE.search(text):
            text = _without_escaped(pattern, text)
    text = _PEM.sub(_masked_pem, text)
    text = _USERINFO.sub(_masked_userinfo, text)
    text = _BARE_USERINFO.sub(_masked_bare_userinfo, text)
    text = _COOKIE.sub(_masked_assignment, text)
    text = _HEADER.sub(_masked_value, text)
    text = _ASSIGNED.sub(_masked_assignment, text)
    text = _TOKEN.sub(_masked_token, text)
    return _SHAPED.sub(MASK, text)


# --- what the process was configured with -------------------------------------------------


def _spellings(value: str) -> set[str]:
    """The ways ``value`` may be written, escapes aside (:func:`redact` decodes those): as
    given and percent-decoded, each also with "+" for a space and with a surrogate pair for
    a character beyond U+FFFF (as JSON escapes it), and base64-encoded in either alphabet,
    with and without its padding."""
    decoded = unquote(value)
    spellings = {value, decoded}
    for form in (value, decoded):
        spellings.add(form.replace(" ", "+"))
        spellings.add("".join(_surrogates(char) for char in form))
        if len(form) >= MIN_SECRET_CHARS:
            raw = form.encode("utf-8", "surrogatepass")
            for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
                spellings |= {encoded.decode("ascii"), encoded.decode("ascii").rstrip("=")}
    return spellings


def _surrogates(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return char
    code -= 0x10000
    return chr(0xD800 + (code >> 10)) + chr(0xDC00 + (code & 0x3FF))


def _folded(char: str) -> str:
    lower = char.lower()
    return lower if len(lower) == 1 else char


_Trie = dict[str, "_Trie"]


def _branches(node: _Trie) -> str:
    """The pattern for what may follow ``node`` of a trie ("" marks an end): the longest
    first (its repeats and alternatives are tried before stopping there). A run without
    branches is written as it is (no recursion per character: a long secret is fine)."""
    run = []
    keys = [key for key in node if key]
    while len(keys) == 1 and "" not in node:
        run.append(re.escape(keys[0]))
        node = node[keys[0]]
        keys = [key for key in node if key]
    branches = [re.escape(key) + _branches(node[key]) for key in sorted(keys)]
    if not branches:
        tail = ""
    elif "" in node:
        tail = f"(?:{'|'.join(branches)})?"
    else:
        tail = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
    return "".join(run) + tail


def _secrets_pattern(spellings: Iterable[str]) -> re.Pattern[str]:
    """One pattern for every spelling, in any case, the longest match first.

    The spellings are merged into a trie, so that a start costs what their common
    prefixes cost, not one try per spelling; and its first level is an alternation of
    literals, each case apart (the rest ignores case), which gives the search a set of
    first characters to skip every other character at once."""
    trie: _Trie = {}
    for text in spellings:
        node = trie
        for char in text:
            node = node.setdefault(_folded(char), {})
        node[""] = {}
    alternatives = []
    for key, child in sorted(trie.items()):
        rest = _branches(child)
        for variant in sorted({key, key.upper()}):
            if len(variant) == 1:
                alternatives.append(
                    f"{re.escape(variant)}(?i:{rest})" if rest else re.escape(variant)
                )
    return re.compile("|".join(alternatives))


def _unescaped(match: re.Match[str]) -> str:
    """The character an :data:`_ESCAPE` stands for (itself, if it stands for none)."""
    kind = match.lastgroup
    if kind == "ascii":
        return chr(int(match["ascii"], 16))
    if kind == "decimal":
        code = int(match["decimal"])
    elif kind == "named":
        return _NAMED_REFERENCES[match["named"]]
    elif kind == "char":
        return match["char"]
    elif kind == "utf8":
        raw = bytes(int(part[-2:], 16) for part in match[0].split("%")[1:])
        text = raw.decode("utf-8", "replace")
        return text if len(text) == 1 else match[0]
    else:  # hex, u, x
        code = int(match[kind or 0], 16)
    return chr(code) if code <= 0x10FFFF else match[0]


def _without_escaped(pattern: re.Pattern[str], text: str) -> str:
    """``text`` without the spellings ``pattern`` finds once its escapes are decoded
    (:data:`_ESCAPE`): each found span is masked from the first to the last character or
    escape it covers in ``text``. Linear: one pass to decode, one to map back when found."""
    decoded = _ESCAPE.sub(_unescaped, text)
    if pattern.search(decoded) is None:
        return text
    # Where each escape went: (start in decoded, end in decoded, start in text, end in text).
    escapes: list[tuple[int, int, int, int]] = []
    shift = 0  # characters decoding removed before this point
    for match in _ESCAPE.finditer(text):
        start, end = match.span()
        length = len(_unescaped(match))
        escapes.append((start - shift, start - shift + length, start, end))
        shift += end - start - length
    starts = [escape[0] for escape in escapes]

    def original(index: int, *, end: bool) -> int:
        """Where the decoded ``index`` (a span's start, or its end) stands in ``text``."""
        at = bisect.bisect_right(starts, index - 1 if end else index) - 1
        if at < 0:
            return index
        _, decoded_end, start, stop = escapes[at]
        if end and index <= decoded_end:
            return stop
        if not end and index < decoded_end:
            return start
        return stop + index - decoded_end

    pieces, done = [], 0
    for match in pattern.finditer(decoded):
        start, stop = original(match.start(), end=False), original(match.end(), end=True)
        pieces += [text[done:start], MASK]
        done = max(done, stop)
    pieces.append(text[done:])
    return "".join(pieces)


def remember_secret(value: object) -> None:
    """Remove ``value`` (a password or token; None and "" are ignored) from every text
    :func:`redact` sees from now on, in each of its usual spellings."""
    if not isinstance(value, str) or not value:
        return
    global _pattern
    with _lock:
        new = {text for text in _spellings(value) if len(text) >= MIN_SECRET_CHARS} - _secrets
        if not new:
            return
        _secrets.update(new)
        _pattern = _secrets_pattern(_secrets)


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
