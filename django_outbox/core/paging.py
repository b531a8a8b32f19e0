"""Pages of the global session indices, continued from a position (docs/reference/admin.md).

An index (``KeySpace.index_keys``: the attention or the all-sessions ZSET; one copy on
a standalone server, one per shard on Valkey Cluster) orders ``"<ws> <ses>"`` members
by score (ms), ties by member, as one ZSET does; the all-sessions index is read
newest first, so in reverse. A page continues from an :class:`IndexPosition` (the
last session a page showed, or the first one to page back) instead of an offset, so
sessions resolved or added before it cannot shift a session out of the next page.

Reading runs in the *seek order*: the index order forward, its reverse backward.
:func:`copy_page_plan` reads what one copy holds after a position with one ``ZRANGE
... BYSCORE ... LIMIT`` from the position's score and one ``ZCOUNT`` (what lies
before it), in O(page size) rows, however big the copy. A session shares its score
with others when they entered the index in the same millisecond (parking a workspace
puts all its sessions there at once); the position's ``tie`` says where it stood
among them, so the read starts just before it. Only a tie offset that is unknown
(paging back, another shard's copy) or stale by more than a page, among more than a
page of equal scores, costs more round trips: the ties are probed, at most
``max(need, MIN_PROBES)`` probes a round, until the position is found.
:func:`merge_copies` merges the copies' answers into one page.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .rules import IDENTIFIER_RE, check_identifier

logger = logging.getLogger("django_outbox")

#: A session of an index: ``(workspace ID, session ID, score in ms or None)``.
Row = tuple[str, str, float | None]
#: A read plan: yields lists of plain commands, is sent their answers, returns its result.
ReadPlan = Generator[list[tuple[Any, ...]], list[Any], Any]

#: The largest tie offset a position may carry.
MAX_TIE = 2**31
#: Round trips one copy may spend finding a position among equal scores.
SEEK_ROUNDS = 12
#: Probes per round among equal scores, at least (a page's worth when pages are bigger).
MIN_PROBES = 16
#: Probes at doubling distances, sent while no upper bound of the position is known.
GALLOP_PROBES = 24
#: Separates the fields of a position's text form (not a character of an ID or a score).
SEPARATOR = "~"


# =====================================================================================
# positions and rows
# =====================================================================================


@dataclass(frozen=True, slots=True)
class IndexPosition:
    """A session's place in an index: its score (ms; None on a page of given sessions,
    which have no scores), its IDs, and ``tie``: how many sessions of its copy of the
    index have the same score and sort at or before it in index order (1 for the first
    of its score; 0 when unknown). ``tie`` only spares round trips: a wrong one costs
    time, never a session."""

    score_ms: float | None
    workspace_id: str
    session_id: str
    tie: int = 0

    @property
    def member(self) -> str:
        """The index member: ``"<ws> <ses>"``."""
        return f"{self.workspace_id} {self.session_id}"

    def to_text(self) -> str:
        """``"<score>~<ws>~<ses>~<tie>"`` (URL-safe; the score is empty when None)."""
        score = "" if self.score_ms is None else format_score(self.score_ms)
        return SEPARATOR.join((score, self.workspace_id, self.session_id, str(self.tie)))

    @classmethod
    def from_text(cls, text: str) -> IndexPosition:
        """Parse :meth:`to_text`. Raises ``ValueError`` for anything else: a finite score
        or none, two valid IDs (:class:`InvalidIdentifier` is a ``ValueError``), a tie
        offset from 0 to :data:`MAX_TIE`."""
        fields = text.split(SEPARATOR)
        if len(fields) != 4:
            raise ValueError("a position is score~workspace~session~tie")
        score_text, ws, ses, tie_text = fields
        score = None
        if score_text:
            score = float(score_text)
            if not math.isfinite(score):
                raise ValueError("a position's score must be finite")
        if not tie_text.isdigit() or int(tie_text) > MAX_TIE:
            raise ValueError(f"a position's tie offset is a number from 0 to {MAX_TIE}")
        check_identifier("workspace ID", ws)
        check_identifier("session ID", ses)
        return cls(score, ws, ses, int(tie_text))


def format_score(score: float) -> str:
    """A score as Valkey reads it back exactly (integral ms without a fraction)."""
    if score.is_integer() and abs(score) < 2**53:
        return str(int(score))
    return repr(score)


def as_text(value: Any) -> str:
    """A reply's bytes or str as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def score_pairs(values: Any) -> list[Any]:
    """ZRANGE ... WITHSCORES answers as (member, score) pairs, whatever the client decoded."""
    flat: list[Any] = list(values or [])
    if flat and isinstance(flat[0], tuple | list):
        return flat
    return list(zip(flat[::2], flat[1::2], strict=True))


def member_text(value: Any) -> str:
    """An index or SET member as str, whatever bytes it holds: bytes that are not UTF-8
    become lone surrogates (``surrogateescape``) instead of raising, so a corrupt member
    is one :func:`is_valid_row` / :func:`valid_identifiers` can skip."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return str(value)


#: Corrupt index members skipped by this process's reads since it started (a member that
#: is not ``"<ws> <ses>"`` of two valid IDs, or a SET member that is not a valid ID).
#: docs/reference/admin.md#corrupt-index-members
corrupt_members_skipped = 0


def note_corrupt(where: str, members: Sequence[str]) -> None:
    """Count and log (one warning per read, ``django_outbox`` logger) ``members`` of
    ``where`` (a key or an index name) skipped as corrupt."""
    global corrupt_members_skipped
    if not members:
        return
    corrupt_members_skipped += len(members)
    shown = ", ".join(ascii(m)[:80] for m in members[:3])
    logger.warning(
        "outbox: skipped %d corrupt member(s) of %s (not valid IDs): %s%s",
        len(members),
        where,
        shown,
        " ..." if len(members) > 3 else "",
    )


def is_valid_row(row: Row) -> bool:
    """Whether both IDs of an index row are valid workspace and session IDs."""
    return bool(IDENTIFIER_RE.fullmatch(row[0]) and IDENTIFIER_RE.fullmatch(row[1]))


def valid_identifiers(members: Iterable[Any], where: str) -> list[str]:
    """The members of a SET (or ZSET) of workspace or session IDs that are valid IDs, as
    str, in their order; every other one (not UTF-8, not matching the ID allow-list) is
    skipped and :func:`note_corrupt` counts and logs it. A corrupt member written by
    hand or by another program must never turn a read into an error."""
    good: list[str] = []
    bad: list[str] = []
    for member in members:
        text = member_text(member)
        (good if IDENTIFIER_RE.fullmatch(text) else bad).append(text)
    note_corrupt(where, bad)
    return good


def index_rows(values: Iterable[Any]) -> list[Row]:
    """``[member, score, ...]`` or ``[(member, score)]`` of "<ws> <ses>" members as rows.

    A member that is not UTF-8 is kept as text with lone surrogates (:func:`member_text`),
    so paging counts it where the ZSET holds it; readers drop rows that fail
    :func:`is_valid_row` before using their IDs."""
    out = []
    for item in values:
        member, score = item if isinstance(item, tuple | list) else (item, None)
        ws, _, ses = member_text(member).partition(" ")
        if ws and ses:
            out.append((ws, ses, None if score is None else float(score)))
    return out


def _key(row: Row) -> tuple[float, str]:
    return (row[2] or 0.0, f"{row[0]} {row[1]}")


def in_index_order(found: Iterable[Row], descending: bool) -> list[Row]:
    """``(ws, ses, score)`` sorted as one index ZSET holding them all would list them:
    by score, then member ``"<ws> <ses>"`` (ZRANGE), or both reversed (ZREVRANGE)."""
    return sorted(found, key=_key, reverse=descending)


def merge_index_pages(answers: list[Any], descending: bool) -> list[Row]:
    """Merge ZRANGE (or ZREVRANGE) ... WITHSCORES answers, one per copy of an index,
    into one list in index order. If each copy gave its first ``n`` members, the
    first ``n`` of the merge are exactly the first ``n`` of the whole index."""
    return in_index_order(
        [row for answer in answers for row in index_rows(score_pairs(answer))], descending
    )


def is_after(row: Row, position: IndexPosition, descending: bool) -> bool:
    """Whether ``row`` comes strictly after ``position`` in an order by (score, member),
    descending or not."""
    mine, theirs = _key(row), (position.score_ms or 0.0, position.member)
    return mine < theirs if descending else mine > theirs


# =====================================================================================
# reading one copy
# =====================================================================================


@dataclass(frozen=True, slots=True)
class CopyPage:
    """What one copy of an index holds after a position, in seek order.

    ``rows``: the first ones after it, at most the ``need`` asked for, fewer only when
    the copy has no more (or when ``complete`` is False: the copy gave up finding the
    position, and holds unknown rows after its last one). ``passed``: its sessions at
    or before the position. ``ties``: member -> tie offset in index order, where known.
    """

    rows: list[Row]
    passed: int = 0
    complete: bool = True
    ties: dict[str, int] = field(default_factory=dict)


def tie_offsets(rows: Sequence[Row], first: int = 0) -> dict[str, int]:
    """member -> how many rows of its score sort at or before it, for ``rows`` read in
    index order from the ``first``-th of ``rows[0]``'s score (0: from its first)."""
    ties: dict[str, int] = {}
    run = 0
    for i, (ws, ses, score) in enumerate(rows):
        run = first + 1 if i == 0 else (run + 1 if score == rows[i - 1][2] else 1)
        ties[f"{ws} {ses}"] = run
    return ties


def first_page_plan(key: str, need: int, descending: bool) -> ReadPlan:
    """The first ``need`` rows of one copy (one ZRANGE or ZREVRANGE): a :class:`CopyPage`."""
    order = "ZREVRANGE" if descending else "ZRANGE"
    (answer,) = yield [(order, key, 0, need - 1, "WITHSCORES")]
    rows = index_rows(score_pairs(answer))
    return CopyPage(rows, 0, True, tie_offsets(rows))


def _from_score(
    key: str, score: float, descending: bool, offset: int, count: int
) -> tuple[Any, ...]:
    """Rows from the ``offset``-th of score ``score`` on, in seek order."""
    s = format_score(score)
    bounds = (s, "-inf", "BYSCORE", "REV") if descending else (s, "+inf", "BYSCORE")
    return ("ZRANGE", key, *bounds, "LIMIT", offset, count, "WITHSCORES")


def _tie_probe(key: str, score: float, descending: bool, offset: int) -> tuple[Any, ...]:
    """The ``offset``-th row of score ``score`` exactly, in seek order."""
    s = format_score(score)
    rev = ("REV",) if descending else ()
    return ("ZRANGE", key, s, s, "BYSCORE", *rev, "LIMIT", offset, 1, "WITHSCORES")


def _count_ties(key: str, score: float) -> tuple[Any, ...]:
    s = format_score(score)
    return ("ZCOUNT", key, s, s)


def _count_before(key: str, score: float, descending: bool) -> tuple[Any, ...]:
    s = format_score(score)
    return ("ZCOUNT", key, f"({s}", "+inf") if descending else ("ZCOUNT", key, "-inf", f"({s}")


def _probe_offsets(lo: int, hi: int | None, need: int) -> list[int]:
    if hi is None:
        return [lo + need * 2**i - 1 for i in range(GALLOP_PROBES)]
    n = max(need, MIN_PROBES)
    return sorted({lo + (hi - lo) * i // (n + 1) for i in range(1, n + 1)})


def copy_page_plan(
    key: str,
    position: IndexPosition,
    need: int,
    slack: int,
    descending: bool,
    *,
    hint: int = 0,
    index_order: bool = True,
) -> ReadPlan:
    """The first ``need`` rows after ``position`` in one copy, in the seek order
    (``descending`` or not): a :class:`CopyPage`.

    Costs one round trip of two commands (a ZRANGE of about ``need + slack`` rows from
    the position's score, a ZCOUNT), started ``slack`` rows before the tie offset
    ``hint`` when it is given, so up to ``slack`` sessions of the position's score
    resolved before it change nothing; ``index_order``: the seek order is the index's
    (then the rows' tie offsets are known). When more than ``slack`` sessions of that
    score sort before the position and ``hint`` does not find them, the ties are
    probed (a few more round trips of O(need) commands, the first of which counts them)
    until it is found.
    """
    score = position.score_ms
    if score is None:
        raise ValueError("a position in an index needs a score")
    top = hint if 0 < hint <= MAX_TIE else slack + 1  # ties at or before the position
    offset = max(0, top - 1 - slack)
    count = top - offset + need
    window, before = yield [
        _from_score(key, score, descending, offset, count),
        _count_before(key, score, descending),
    ]
    passed = int(before)
    lo, hi = 0, None  # bounds of the position's tie offset (ties at or before it)

    def check(answer: Any, offset: int, count: int) -> CopyPage | None:
        """A page if this window holds the position and ``need`` rows after it; else
        narrow ``lo``/``hi`` from it."""
        nonlocal lo, hi
        rows = index_rows(score_pairs(answer))
        k = next((i for i, row in enumerate(rows) if is_after(row, position, descending)), None)
        k = len(rows) if k is None else k
        if offset and not k:  # the window starts after the position: it is below offset
            hi = offset if hi is None else min(hi, offset)
            return None
        found = rows[k:]
        if len(found) >= need or len(rows) < count:
            first = offset if rows and rows[0][2] == score else 0
            ties = tie_offsets(rows, first) if index_order else {}
            return CopyPage(found[:need], passed + offset + k, True, ties)
        lo = offset + k
        if found:  # the window crossed the position: its offset is known
            hi = lo
        return None

    page = check(window, offset, count)
    rounds, counted = 1, False
    while page is None and rounds < SEEK_ROUNDS:
        rounds += 1
        if hi is not None and lo > hi:  # the ties changed between two reads: start over
            lo, hi, counted = 0, None, False
        if hi is not None and hi - lo <= slack:
            # From before ``lo``, to see that the window holds the position, by up to
            # ``slack`` rows: sessions may have left, or come, since the probes.
            offset = max(0, lo - 1 - slack)
            count = hi - offset + need + slack
            (window,) = yield [_from_score(key, score, descending, offset, count)]
            page = check(window, offset, count)
            continue
        probes = _probe_offsets(lo, hi, need)
        # The first probes also count the ties: none sorts later than the last of them.
        answers = yield [
            *(_tie_probe(key, score, descending, y) for y in probes),
            *([] if counted else [_count_ties(key, score)]),
        ]
        if not counted:
            counted = True
            ties = int(answers.pop())
            hi = ties if hi is None else min(hi, ties)
        for y, answer in zip(probes, answers, strict=True):
            rows = index_rows(score_pairs(answer))
            if rows and not is_after(rows[0], position, descending):
                lo = max(lo, y + 1)
            else:
                hi = y if hi is None else min(hi, y)
    return page or CopyPage([], passed + lo, complete=False)


def merge_copies(pages: Sequence[CopyPage], descending: bool) -> tuple[list[Row], bool]:
    """The copies' rows in seek order (``descending`` or not), and whether a copy that
    gave up cut them: nothing past its last row is kept (nothing at all when it has
    none), as its own rows there are unknown. With complete copies that gave ``need``
    rows each, the first ``need`` of the merge are the first ``need`` of the index."""
    rows = in_index_order((row for page in pages for row in page.rows), descending)
    cut = False
    for page in pages:
        if page.complete:
            continue
        cut = True
        if not page.rows:
            return [], True
        last = page.rows[-1]
        last_key = _key(last)
        rows = [r for r in rows if (_key(r) >= last_key if descending else _key(r) <= last_key)]
    return rows, cut


def page_of_sorted(
    rows: Sequence[Row],
    position: IndexPosition | None,
    per_page: int,
    descending: bool,
    forward: bool = True,
) -> tuple[list[Row], int, bool]:
    """A page of ``rows`` (sorted in index order, ``descending`` or not) after
    ``position`` (``forward``) or before it: ``(page in index order, rows at or before
    the position in seek order, whether more follow the page in seek order)``."""
    seq = list(rows) if forward else list(reversed(rows))
    seek_descending = descending if forward else not descending
    k = 0
    if position is not None:
        k = next((i for i, r in enumerate(seq) if is_after(r, position, seek_descending)), len(seq))
    found = seq[k : k + per_page]
    return (found if forward else found[::-1]), k, len(seq) > k + per_page


def page_of_given(
    pairs: Sequence[tuple[str, str]],
    position: IndexPosition | None,
    per_page: int,
    forward: bool = True,
) -> tuple[list[Row], int, bool]:
    """A page of ``pairs`` in the order given, after (or before) ``position``'s pair
    (None, or one of ``pairs``: raises ``ValueError`` otherwise). Same shape as
    :func:`page_of_sorted`."""
    members = [f"{ws} {ses}" for ws, ses in pairs]
    seq: list[tuple[str, str, float | None]] = [(ws, ses, None) for ws, ses in pairs]
    if not forward:
        seq.reverse()
        members.reverse()
    k = 0 if position is None else members.index(position.member) + 1
    found = seq[k : k + per_page]
    return (found if forward else found[::-1]), k, len(seq) > k + per_page


def side_by_side(*plans: ReadPlan) -> ReadPlan:
    """Run read plans as one: each round sends what every unfinished plan asks for next,
    and the plan returns their results in order."""
    results: list[Any] = [None] * len(plans)
    asked: dict[int, list[tuple[Any, ...]]] = {}

    def advance(i: int, answers: list[Any] | None) -> None:
        try:
            asked[i] = plans[i].send(answers)  # type: ignore[arg-type]
        except StopIteration as done:
            asked.pop(i, None)
            results[i] = done.value

    for i in range(len(plans)):
        advance(i, None)
    while asked:
        order = sorted(asked)
        answers = yield [call for i in order for call in asked[i]]
        at = 0
        for i in order:
            size = len(asked[i])
            advance(i, answers[at : at + size])
            at += size
    return results


def read_side_by_side(
    execute_many: Callable[[list[tuple[Any, ...]]], list[Any]], *plans: ReadPlan
) -> list[Any]:
    """Run read plans side by side over ``execute_many`` (``Transport.execute_many``):
    each round trip sends what every unfinished plan asks for next; returns their
    results in order. A failed command raises its error."""
    plan = side_by_side(*plans)
    answers: list[Any] | None = None
    while True:
        try:
            calls = plan.send(answers)  # type: ignore[arg-type]
        except StopIteration as done:
            results: list[Any] = done.value
            return results
        answers = execute_many(calls) if calls else []
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
