"""The outcome table of a delivery's end: every way an attempt ends, against what
happened to the entry meanwhile (docs/explanation/lifecycle.md, "What happens to a
message"; docs/howto/cutting.md, "What happens to the cut prompt"; docs/howto/steering.md;
docs/explanation/lifecycle.md, "Parking a workspace").

One row per pair. The entry under test is prompt ``a``, accepted before prompt ``b``; the
row's meanwhile runs inside the agent's call (the deliverer, or the verifier of an entry
whose last outcome was unknown), and the call then ends as the row says. Each row
checks, right after the settle: ``a``'s stored state, the settle's result, the ending
recorded, that the session's lease is released, the queue's order; then lets the
worker run the session dry (after an unpark) and checks what it did first and whether
``a`` was ever sent again. Whatever the row, the agent never has ``a`` twice, and a cut
``a`` is never sent after its cut.

Real parts: the real Valkey, the real delivery step with its lease keeper and cut watch,
a second real worker for a lost lease. The agent is an in-process stand-in with a
transcript that its verifier reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from django_outbox import Entry, Verdict
from django_outbox.errors import (
    AmbiguousError,
    HoldDeliveryError,
    PriorAttemptPendingError,
    TransientDeliveryError,
)
from tests.support.helpers import SES, WS, wait_for
from tests.support.scenarios import amake

__all__ = ["amake"]  # the fixture


# -- the agent ------------------------------------------------------------------------------


class Agent:
    """An agent with a transcript: a normal delivery puts the entry into it and a normal
    verification reads it. ``once`` replaces the next call of one kind (the row's
    attempt); ``calls`` lists every call as ``(kind, text)``."""

    def __init__(self) -> None:
        self.transcript: list[str] = []
        self.calls: list[tuple[str, str]] = []
        self.once: dict[str, Callable[[Entry], Awaitable[Any]]] = {}
        self.aborts = 0

    #: It takes a merged delivery (the rows read what the claim merged, not the agent).
    outbox_capabilities = frozenset({"merge"})

    async def deliver(self, entry: Entry, **kwargs: Any) -> None:
        self.calls.append(("deliver", entry.text))
        if "deliver" in self.once:
            await self.once.pop("deliver")(entry)
            return
        self.transcript.append(entry.id)

    async def verify(self, entry: Entry, **kwargs: Any) -> Verdict:
        self.calls.append(("verify", entry.text))
        if "verify" in self.once:
            return await self.once.pop("verify")(entry)
        return self.verdict(entry)

    def verdict(self, entry: Entry) -> Verdict:
        return Verdict.DELIVERED if entry.id in self.transcript else Verdict.ABSENT

    async def abort(self, entry: Entry, **kwargs: Any) -> None:
        self.aborts += 1


@dataclass
class Run:
    """One row's world: the outbox, its agent, the accepted entries by text, notes the
    meanwhile takes (checked after the step: an assertion inside the agent's call would
    only be classified as a failed delivery), and hooks to run after the step."""

    outbox: Any
    agent: Agent
    ids: dict[str, str]
    make: Callable[..., Any]
    valkey: Any
    options: dict[str, Any]
    notes: list[tuple[str, Any]] = field(default_factory=list)
    after: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


# -- how the attempt ends ----------------------------------------------------------------------
#
# Each ending: (the step it ends: deliver | verify, what the agent does, outbox settings,
# the attempts before it: a list of ("deliver" | "verify", what the agent does)).


async def _returns(run, entry):
    run.agent.transcript.append(entry.id)


def _raises(exc: BaseException, *, has_it: bool = False):
    async def end(run, entry):
        if has_it:
            run.agent.transcript.append(entry.id)
        raise exc

    return end


async def _hangs(run, entry):
    await asyncio.Event().wait()  # until DELIVERY_TIMEOUT, or a cut cancels the send


def _verdict(value):
    async def end(run, entry):
        if isinstance(value, BaseException):
            raise value
        return run.agent.verdict(entry) if value is None else value

    return end


TRANSIENT = TransientDeliveryError("connection refused")
UNKNOWN = AmbiguousError("the reply was lost")
ENDINGS: dict[str, tuple[str, Any, dict[str, Any], list[tuple[str, Any]]]] = {
    "delivered": ("deliver", _returns, {}, []),
    "transient": ("deliver", _raises(TRANSIENT), {}, []),
    "prior_pending": ("deliver", _raises(PriorAttemptPendingError("busy")), {}, []),
    "failed": ("deliver", _raises(RuntimeError("500")), {}, []),
    "failed_last": ("deliver", _raises(RuntimeError("500")), {"max_attempts": 1}, []),
    "transient_last": ("deliver", _raises(TRANSIENT), {"max_transient_failures": 1}, []),
    "held": ("deliver", _raises(HoldDeliveryError("429", retry_after=0)), {}, []),
    "held_last": (
        "deliver",
        _raises(HoldDeliveryError("429", retry_after=0)),
        {"hold_max_total": 0.000_001},  # held a microsecond: the second hold gives up
        [("deliver", _raises(HoldDeliveryError("429", retry_after=0)))],
    ),
    "failed_after_hold": (
        "deliver",
        _raises(RuntimeError("500")),
        {},
        [("deliver", _raises(HoldDeliveryError("429", retry_after=0)))],
    ),
    "unknown_had": ("deliver", _raises(UNKNOWN, has_it=True), {}, []),
    "unknown_lost": ("deliver", _raises(UNKNOWN), {}, []),
    "timeout": ("deliver", _hangs, {"delivery_timeout": 1.0}, []),
    "unknown_no_verifier": ("deliver", _raises(UNKNOWN), {"verifier": None}, []),
    "found": ("verify", _verdict(None), {}, [("deliver", _raises(UNKNOWN, has_it=True))]),
    "absent": ("verify", _verdict(None), {}, [("deliver", _raises(UNKNOWN))]),
    "absent_last": (
        "verify",
        _verdict(None),
        {"max_attempts": 1},
        [("deliver", _raises(UNKNOWN))],
    ),
    "inconclusive": (
        "verify",
        _verdict(Verdict.INCONCLUSIVE),
        {},
        [("deliver", _raises(UNKNOWN))],
    ),
    "inconclusive_last": (
        "verify",
        _verdict(Verdict.INCONCLUSIVE),
        {"max_verify_attempts": 1},
        [("deliver", _raises(UNKNOWN))],
    ),
    "verifier_raised": (
        "verify",
        _verdict(RuntimeError("verifier down")),
        {},
        [("deliver", _raises(UNKNOWN))],
    ),
}


# -- what happened to the entry meanwhile ---------------------------------------------------------


async def _nothing(run: Run) -> None:
    return None


async def _stop(run: Run) -> None:
    run.notes.append(("stop", (await run.outbox.ainterrupt(WS, SES)).value))


async def _cancel_it(run: Run) -> None:
    # The in-flight branch of cancel: not removed as a queued prompt, its turn is cut.
    run.notes.append(("cancel", (await run.outbox.acancel(WS, SES, run.ids["a"])).value))
    run.notes.append(("cut", (await run.outbox.acut(WS, SES, run.ids["a"])).value))


async def _send_now_c(run: Run) -> None:
    c = await _accept(run, "c")
    run.notes.append(("send_now", (await run.outbox.asend_now(WS, SES, c.id)).value))


async def _cancel_b(run: Run) -> None:
    run.notes.append(("cancel", (await run.outbox.acancel(WS, SES, run.ids["b"])).value))


async def _edit_it(run: Run) -> None:
    result = await run.outbox.aedit(WS, SES, run.ids["a"], text="edited")
    run.notes.append(("edit", result.value))


async def _move_c_next(run: Run) -> None:
    c = await _accept(run, "c")
    run.notes.append(("move", (await run.outbox.amove(WS, SES, c.id, to="next")).value))


async def _merge_behind_expires(run: Run) -> None:
    """A merge prompt m, accepted and moved right behind a merge prompt a in flight (where
    a's next delivery would take it in), passes its expiry."""
    m = await _accept(run, "m", if_busy="merge", expires_after=0.5)
    assert m.expires_at is not None
    run.notes.append(("move", (await run.outbox.amove(WS, SES, m.id, to="next")).value))
    await wait_for(lambda: time.time() > _parse(m.expires_at) + 0.05, timeout=10)


async def _park(run: Run) -> None:
    run.notes.append(("park", await run.outbox.apark_workspace(WS, "maintenance")))


async def _park_and_stop(run: Run) -> None:
    await _park(run)
    await _stop(run)


async def _cleanup(run: Run) -> None:
    run.notes.append(("cleanup", await run.outbox.acleanup_workspace(WS) > 0))


async def _lease_lost(run: Run) -> None:
    """The lease expired under the call (a partition) and another worker took the session
    over: it recovers the entry as verifying and verifies it, its verifier still running
    when this call ends."""
    run.valkey.delete(run.outbox.keys.session(WS, SES).lock)
    inside, release = asyncio.Event(), asyncio.Event()

    async def verifier(entry: Entry, **kwargs: Any) -> Verdict:
        run.agent.calls.append(("verify", entry.text))
        inside.set()
        await release.wait()
        return run.agent.verdict(entry)

    other = run.make(**{**run.options, "verifier": verifier})
    other.owner = "other-worker"
    step = asyncio.ensure_future(other.adeliver_once(WS, SES))
    await asyncio.wait_for(inside.wait(), 10)

    async def finish() -> None:
        lease = (await run.outbox.asnapshot(WS, SES)).lease
        run.notes.append(("lease after the lost settle", lease and lease.owner))
        release.set()
        run.notes.append(("other worker stepped", await asyncio.wait_for(step, 10)))

    run.after.append(finish)


MEANWHILE: dict[str, Callable[[Run], Awaitable[None]]] = {
    "nothing": _nothing,
    "Stop": _stop,
    "cancel": _cancel_it,
    "send-now": _send_now_c,
    "cancel b": _cancel_b,
    "edit": _edit_it,
    "move": _move_c_next,
    "expiry": _nothing,  # the entry expires before the call ends (see _run_row)
    "park": _park,
    "park+Stop": _park_and_stop,
    "cleanup": _cleanup,
    "lease lost": _lease_lost,
    "merged": _nothing,  # a and m went as one merged message (see _run_row)
    "merge behind expired": _merge_behind_expires,
    "merged+Stop": _stop,
}


def _id(text: str) -> str:
    """A test ID that reads as the behaviour, without whitespace (a node ID the mutation
    check can name: tools/mutate/run.py reads failed node IDs up to a space)."""
    return "_".join(text.split())


def _parse(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


async def _accept(run: Run, text: str, **options: Any) -> Entry:
    entry = await run.outbox.aaccept(
        WS, SES, user_id="u", client_message_id=text, text=text, **options
    )
    run.ids[text] = entry.id
    return entry


# -- the table --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """ending x meanwhile -> a's state after the settle (``status[/reason][<parkedFrom]``
    and `` cut`` when interrupted; None: gone), the settle's result, the ending recorded
    for a then, whether the worker left alone ever sends a again, its first step after
    (``"verify a"``, ``"deliver b"``, ... or None: nothing to do), and the queue's order
    after the settle (texts)."""

    ending: str
    meanwhile: str
    after: str | None
    result: str
    ended: str | None
    resent: bool
    first: str | None
    queue: str
    why: str

    @property
    def id(self) -> str:
        return _id(f"{self.ending} after {self.meanwhile} -> {self.why}")


R = Row
ROWS = [
    # -- nothing happened meanwhile: the plain outcome table (lifecycle.md)
    R("delivered", "nothing", None, "removed", "delivered", False, "deliver b", "b",
      "removed as delivered, b next"),
    R("transient", "nothing", "pending", "updated", None, True, "deliver a", "a b",
      "pending again in front of b"),
    R("prior_pending", "nothing", "pending", "updated", None, True, "deliver a", "a b",
      "pending again in front of b"),
    R("failed", "nothing", "pending", "updated", None, True, "deliver a", "a b",
      "pending, one attempt used"),
    R("failed_last", "nothing", "error/max_attempts", "updated", None, False, "deliver b", "a b",
      "error, never sent again, b next"),
    R("transient_last", "nothing", "error/transient_exhausted", "updated", None, False,
      "deliver b", "a b",
      "error, never sent again"),
    R("held", "nothing", "pending", "updated", None, True, "deliver a", "a b",
      "pending, b waits behind it"),
    R("held_last", "nothing", "error/hold_exhausted", "updated", None, False, "deliver b", "a b",
      "error once held HOLD_MAX_TOTAL"),
    R("failed_after_hold", "nothing", "pending", "updated", None, True, "deliver a", "a b",
      "a failure ends the run of holds"),
    R("unknown_had", "nothing", "verifying", "updated", None, False, "verify a", "a b",
      "verified first, found, never resent"),
    R("unknown_lost", "nothing", "verifying", "updated", None, True, "verify a", "a b",
      "verified first, absent, sent again"),
    R("timeout", "nothing", "verifying", "updated", None, True, "verify a", "a b",
      "unknown, verified before anything else"),
    R("unknown_no_verifier", "nothing", "error/unverifiable", "updated", None, False,
      "deliver b", "a b",
      "error, never resent blindly"),
    R("found", "nothing", None, "removed", "delivered", False, "deliver b", "b",
      "removed as delivered"),
    R("absent", "nothing", "pending", "updated", None, True, "deliver a", "a b",
      "pending, sent again in front of b"),
    R("absent_last", "nothing", "error/max_attempts", "updated", None, False, "deliver b", "a b",
      "error, attempts used up"),
    R("inconclusive", "nothing", "verifying", "updated", None, True, "verify a", "a b",
      "verified again before b"),
    R("inconclusive_last", "nothing", "error/unverifiable", "updated", None, False, "deliver b",
      "a b",
      "error after MAX_VERIFY_ATTEMPTS"),
    R("verifier_raised", "nothing", "verifying", "updated", None, True, "verify a", "a b",
      "verified again before b"),
    # -- Stop: a cut prompt that provably never reached the agent is cancelled, never
    #    sent again; one the agent has is delivered; an unknown one is verified
    R("delivered", "Stop", None, "removed", "delivered", False, "deliver b", "b",
      "delivered interrupted"),
    R("transient", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent again"),
    R("prior_pending", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent again"),
    R("failed", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent again"),
    R("failed_last", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, not an error"),
    R("transient_last", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, not an error"),
    R("held", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent after the hold"),
    R("held_last", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, not an error"),
    R("unknown_had", "Stop", "verifying cut", "updated", None, False, "verify a", "a b",
      "verified: found, delivered"),
    R("unknown_lost", "Stop", "verifying cut", "updated", None, False, "verify a", "a b",
      "verified: absent, cancelled"),
    R("timeout", "Stop", "verifying cut", "updated", None, False, "verify a", "a b",
      "the send is cut, verified, never sent"),
    R("unknown_no_verifier", "Stop", "error/unverifiable cut", "updated", None, False,
      "deliver b", "a b",
      "error, never resent"),
    R("found", "Stop", None, "removed", "delivered", False, "deliver b", "b",
      "delivered interrupted"),
    R("absent", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent again"),
    R("absent_last", "Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, not an error"),
    R("inconclusive", "Stop", "verifying cut", "updated", None, False, "verify a", "a b",
      "verified again, then cancelled"),
    R("inconclusive_last", "Stop", "error/unverifiable cut", "updated", None, False,
      "deliver b", "a b",
      "error, never resent"),
    R("verifier_raised", "Stop", "verifying cut", "updated", None, False, "verify a", "a b",
      "verified again, then cancelled"),
    # -- cancel of the prompt in flight: its turn is cut, as Stop
    R("delivered", "cancel", None, "removed", "delivered", False, "deliver b", "b",
      "delivered interrupted"),
    R("transient", "cancel", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent again"),
    R("held", "cancel", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent after the hold"),
    R("unknown_lost", "cancel", "verifying cut", "updated", None, False, "verify a", "a b",
      "verified: absent, cancelled"),
    R("absent", "cancel", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent again"),
    R("inconclusive", "cancel", "verifying cut", "updated", None, False, "verify a", "a b",
      "verified again, then cancelled"),
    # -- Send now of a new prompt c: c goes in front of the pending prompts, a is cut
    R("delivered", "send-now", None, "removed", "delivered", False, "deliver c", "c b",
      "delivered interrupted, c next"),
    R("transient", "send-now", None, "cancelled", "cancelled", False, "deliver c", "c b",
      "cancelled, c next"),
    R("failed", "send-now", None, "cancelled", "cancelled", False, "deliver c", "c b",
      "cancelled, c next"),
    R("held", "send-now", None, "cancelled", "cancelled", False, "deliver c", "c b",
      "cancelled, c next"),
    R("unknown_lost", "send-now", "verifying cut", "updated", None, False, "verify a", "a c b",
      "verified ahead of c, then cancelled"),
    R("unknown_had", "send-now", "verifying cut", "updated", None, False, "verify a", "a c b",
      "verified ahead of c, delivered"),
    R("absent", "send-now", None, "cancelled", "cancelled", False, "deliver c", "c b",
      "cancelled, c next"),
    R("inconclusive", "send-now", "verifying cut", "updated", None, False, "verify a", "a c b",
      "still ahead of c"),
    # -- the queue behind changed meanwhile: a goes back in accept order
    R("transient", "cancel b", "pending", "updated", None, True, "deliver a", "a",
      "back at the tail of an empty queue"),
    R("delivered", "cancel b", None, "removed", "delivered", False, None, "",
      "removed, nothing left"),
    R("unknown_lost", "cancel b", "verifying", "updated", None, True, "verify a", "a",
      "verifying alone"),
    R("transient", "move", "pending", "updated", None, True, "deliver a", "a c b",
      "in front of the moved c"),
    R("failed", "move", "pending", "updated", None, True, "deliver a", "a c b",
      "in front of the moved c"),
    R("unknown_lost", "move", "verifying", "updated", None, True, "verify a", "a c b",
      "verified in front of the moved c"),
    R("delivered", "move", None, "removed", "delivered", False, "deliver c", "c b",
      "removed, the moved c next"),
    R("absent", "move", "pending", "updated", None, True, "deliver a", "a c b",
      "c never moves ahead of it"),
    R("transient", "edit", "pending", "updated", None, True, "deliver a", "a b",
      "the edit was refused, sent unchanged"),
    R("absent", "edit", "pending", "updated", None, True, "deliver a", "a b",
      "the edit was refused, sent unchanged"),
    R("delivered", "expiry", None, "removed", "delivered", False, "deliver b", "b", "delivered"),
    R("transient", "expiry", "pending", "updated", None, False, "deliver b", "a b",
      "expires at the next claim, never sent"),
    R("failed", "expiry", "pending", "updated", None, False, "deliver b", "a b",
      "expires at the next claim, never sent"),
    R("held", "expiry", "pending", "updated", None, False, "deliver b", "a b",
      "expires at the next claim, never sent"),
    R("unknown_had", "expiry", "verifying", "updated", None, False, "verify a", "a b",
      "a verified entry never expires: found"),
    R("unknown_lost", "expiry", "verifying", "updated", None, False, "verify a", "a b",
      "verified absent, then expires, never sent"),
    R("absent", "expiry", "pending", "updated", None, False, "deliver b", "a b",
      "expires at the next claim, never sent"),
    R("inconclusive", "expiry", "verifying", "updated", None, False, "verify a", "a b",
      "verified again, absent, then expires"),
    # -- the workspace was parked meanwhile: the outcome is recorded, a stays parked,
    #    unpark resumes from it
    R("delivered", "park", None, "removed", "delivered", False, "deliver b", "b",
      "a confirmed delivery still completes"),
    R("transient", "park", "parked<pending", "updated", None, True, "deliver a", "a b",
      "parked, resumes pending"),
    R("held", "park", "parked<pending", "updated", None, True, "deliver a", "a b",
      "parked, resumes pending"),
    R("failed_last", "park", "error/max_attempts", "updated", None, False, "deliver b", "a b",
      "error wins over parked"),
    R("unknown_lost", "park", "parked<verifying", "updated", None, True, "verify a", "a b",
      "parked, resumes verifying"),
    R("unknown_no_verifier", "park", "error/unverifiable", "updated", None, False, "deliver b",
      "a b",
      "error wins over parked"),
    R("found", "park", None, "removed", "delivered", False, "deliver b", "b",
      "a confirmed delivery still completes"),
    R("absent", "park", "parked<pending", "updated", None, True, "deliver a", "a b",
      "parked, resumes pending"),
    R("inconclusive", "park", "parked<verifying", "updated", None, True, "verify a", "a b",
      "parked, resumes verifying"),
    R("transient", "park+Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent after unpark"),
    R("absent", "park+Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "cancelled, never sent after unpark"),
    # -- the session was cleaned up, or the lease lost: nothing is recorded, the lease
    #    is not released (it is not ours), the outcome is left to verification
    R("transient", "cleanup", None, "lost", None, False, None, "",
      "nothing recorded, nothing left"),
    R("delivered", "lease lost", None, "lost", "delivered", False, "deliver b", "b",
      "the other worker's verification found it"),
    R("transient", "lease lost", "pending", "lost", None, True, "deliver a", "a b",
      "the other worker's verification: absent"),
    R("unknown_had", "lease lost", None, "lost", "delivered", False, "deliver b", "b",
      "the other worker's verification found it"),
    R("found", "lease lost", None, "lost", "delivered", False, "deliver b", "b",
      "the other worker's verification found it"),
    R("absent", "lease lost", "pending", "lost", None, True, "deliver a", "a b",
      "the other worker's verification: absent"),
    # -- a merged message (a, then m, both merge prompts): m takes a's outcome
    R("delivered", "merged", None, "removed", "delivered", False, "deliver b", "b",
      "both delivered"),
    R("transient", "merged", "pending", "updated", None, True, "deliver a", "a m b",
      "both pending, merged again"),
    R("failed", "merged", "pending", "updated", None, True, "deliver a", "a m b",
      "both pending, an attempt each"),
    R("failed_last", "merged", "error/max_attempts", "updated", None, False, "deliver b", "a m b",
      "both error"),
    R("unknown_had", "merged", "verifying", "updated", None, False, "verify a", "a m b",
      "verified as one: found"),
    R("unknown_lost", "merged", "verifying", "updated", None, True, "verify a", "a m b",
      "verified as one: absent, sent again"),
    R("unknown_no_verifier", "merged", "error/unverifiable", "updated", None, False,
      "deliver b", "a m b",
      "both error"),
    R("found", "merged", None, "removed", "delivered", False, "deliver b", "b", "both delivered"),
    R("absent", "merged", "pending", "updated", None, True, "deliver a", "a m b",
      "both pending, merged again"),
    R("inconclusive", "merged", "verifying", "updated", None, True, "verify a", "a m b",
      "both still verifying"),
    # -- a merge prompt queued behind a merge prompt in flight expired meanwhile: it is
    #    never merged into a's next delivery, nor sent
    R("transient", "merge behind expired", "pending", "updated", None, True, "deliver a",
      "a m b", "a sent alone, m expires"),
    R("failed", "merge behind expired", "pending", "updated", None, True, "deliver a",
      "a m b", "a sent alone, m expires"),
    R("unknown_lost", "merge behind expired", "verifying", "updated", None, True, "verify a",
      "a m b", "a verified, sent alone, m expires"),
    R("delivered", "merge behind expired", None, "removed", "delivered", False, "deliver b",
      "m b", "m expires at the next claim"),
    R("delivered", "merged+Stop", None, "removed", "delivered", False, "deliver b", "b",
      "both delivered"),
    R("transient", "merged+Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "both cancelled, never sent"),
    R("held", "merged+Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "both cancelled, never sent"),
    R("unknown_lost", "merged+Stop", "verifying cut", "updated", None, False, "verify a", "a m b",
      "verified as one, then both cancelled"),
    R("absent", "merged+Stop", None, "cancelled", "cancelled", False, "deliver b", "b",
      "both cancelled, never sent"),
]  # fmt: skip

#: Each meanwhile's notes, as the row's call must have left them.
NOTES = {
    "Stop": [("stop", "cut")],
    "cancel": [("cancel", "in_flight"), ("cut", "cut")],
    "send-now": [("send_now", "cut")],
    "cancel b": [("cancel", "removed")],
    "edit": [("edit", "busy")],
    "move": [("move", "moved")],
    "merge behind expired": [("move", "moved")],
    "park": [("park", 2)],
    "park+Stop": [("park", 2), ("stop", "cut")],
    "cleanup": [("cleanup", True)],
    "lease lost": [("lease after the lost settle", "other-worker"), ("other worker stepped", True)],
    "merged+Stop": [("stop", "cut")],
}


#: The counters a recorded ending leaves on the entry (attempts, transientFails, holds,
#: verifyAttempts): docs/explanation/lifecycle.md, "What happens to a message".
COUNTS = {
    "transient": (0, 1, 0, 0),
    "prior_pending": (0, 1, 0, 0),
    "failed": (1, 0, 0, 0),
    "failed_last": (1, 0, 0, 0),
    "transient_last": (0, 1, 0, 0),
    "held": (0, 0, 1, 0),
    "held_last": (0, 0, 2, 0),
    "failed_after_hold": (1, 0, 0, 0),
    "unknown_had": (0, 0, 0, 0),
    "unknown_lost": (0, 0, 0, 0),
    "timeout": (0, 0, 0, 0),
    "unknown_no_verifier": (0, 0, 0, 0),
    "absent": (1, 0, 0, 0),
    "absent_last": (1, 0, 0, 0),
    "inconclusive": (0, 0, 0, 1),
    "inconclusive_last": (0, 0, 0, 1),
    "verifier_raised": (0, 0, 0, 1),
}
#: Endings whose outcome is unknown: a merged message stays one (verified through its
#: head); any other ending ends the merge (docs/howto/steering.md#merging).
UNKNOWN_ENDINGS = {"unknown_had", "unknown_lost", "timeout", "unknown_no_verifier",
                   "inconclusive", "inconclusive_last", "verifier_raised"}  # fmt: skip


def _counts(entry: Entry) -> tuple[int, int, int, int]:
    return (entry.attempts, entry.transient_fails, entry.holds, entry.verify_attempts)


def _state(entry: Entry | None) -> str | None:
    if entry is None:
        return None
    out = str(entry.status)
    if entry.reason and str(entry.status) == "error":
        out += f"/{entry.reason}"
    if entry.parked_from:
        out += f"<{entry.parked_from}"
    if entry.interrupted:
        out += " cut"
    return out


async def _run_row(amake, r, row: Row) -> None:
    kind, end, settings, before = ENDINGS[row.ending]
    agent = Agent()
    options: dict[str, Any] = {
        "deliverer": agent.deliver,
        "verifier": agent.verify,
        "aborter": agent.abort,
        "retry_backoff": 0,
        "max_backoff": 1,
        "verify_delay": 0,
        "verify_backoff": 0,
        "max_verify_backoff": 1,
        "max_attempts": 5,
        "max_transient_failures": 5,
        "hold_floor": 0.001,
        "max_verify_attempts": 5,
        **settings,
    }
    outbox = amake(**options)
    run = Run(outbox, agent, {}, amake, r, options)
    merged = row.meanwhile.startswith("merged")
    a = await _accept(
        run,
        "a",
        **({"if_busy": "merge"} if merged or row.meanwhile.startswith("merge ") else {}),
        **({"expires_after": 2.0} if row.meanwhile == "expiry" else {}),
    )
    if merged:
        await _accept(run, "m", if_busy="merge")
    await _accept(run, "b")

    for step, does in before:  # the attempts before the row's (e.g. the unknown one)
        agent.once[step] = lambda entry, does=does: does(run, entry)
        assert await outbox.adeliver_once(WS, SES)
        # A hold waits at least HOLD_FLOOR (1 ms here): until a is due again
        due = {e.id: e for e in await outbox.alist(WS, SES)}[a.id].next_attempt_at
        if due is not None:
            await wait_for(lambda due=due: time.time() > _parse(due) + 0.001, timeout=10)
    assert not agent.once, "an attempt before the row's was not made"

    meanwhile = MEANWHILE[row.meanwhile]

    async def attempt(entry: Entry) -> Any:
        await meanwhile(run)
        if row.meanwhile == "expiry":
            await wait_for(lambda: time.time() > _parse(a.expires_at) + 0.05, timeout=10)
        return await end(run, entry)

    agent.once[kind] = attempt
    results: list[str] = []
    outbox.step_listeners.append(lambda step, outcome, result, s: results.append(result))
    assert await outbox.adeliver_once(WS, SES)
    assert kind not in agent.once, "the row's attempt was not made"
    for hook in run.after:
        await hook()

    # Right after the settle.
    assert run.notes == NOTES.get(row.meanwhile, []), run.notes
    assert results == [row.result]
    snap = await outbox.asnapshot(WS, SES)
    assert snap.lease is None, "the session's lease was not released"
    by_id = {e.id: e for e in snap.entries}
    texts = {v: k for k, v in run.ids.items()}
    assert " ".join(texts[e.id] for e in snap.entries) == row.queue
    assert _state(by_id.get(a.id)) == row.after
    endings = [e.how for e in snap.endings if e.entry_id == a.id]
    assert endings == ([row.ended] if row.ended else [])
    if row.result == "updated":  # the outcome recorded on the entry, its error kept
        assert _counts(by_id[a.id]) == COUNTS[row.ending]
        assert by_id[a.id].last_error
    if merged:  # the member takes the head's outcome (only the head is marked cut)
        m = run.ids["m"]
        assert _state(by_id.get(m)) == (row.after and row.after.replace(" cut", ""))
        assert [e.how for e in snap.endings if e.entry_id == m] == endings
        if row.result == "updated":
            assert _counts(by_id[m]) == COUNTS[row.ending]
            merge = a.id if row.ending in UNKNOWN_ENDINGS else None
            assert (by_id[a.id].merged_into, by_id[m].merged_into) == (merge, merge)
    if row.after and row.after.startswith("parked"):
        assert str(by_id[run.ids["b"]].status) == "parked"

    # Left alone (after an unpark), the worker runs the session dry.
    sent_before = len(agent.calls)
    cut = (row.after is None and row.ended == "cancelled") or "cut" in (row.after or "")
    await outbox.aunpark_workspace(WS)
    for _ in range(12):
        if not await outbox.adeliver_once(WS, SES):
            break
    else:
        pytest.fail("the session never ran dry")
    later = agent.calls[sent_before:]
    assert (" ".join(later[0]) if later else None) == row.first
    resent = ("deliver", "a") in later
    assert resent is row.resent, later
    assert agent.transcript.count(a.id) <= 1, "the agent got a twice"
    if cut:
        assert ("deliver", "a") not in later, "a cut prompt was sent after its cut"
    if merged:
        assert ("deliver", "m") not in agent.calls, "a merge member was sent on its own"
    if row.meanwhile == "merge behind expired":  # never merged into a, never sent
        snap = await outbox.asnapshot(WS, SES)
        assert [e.how for e in snap.endings if e.entry_id == run.ids["m"]] == ["expired"]
        assert ("deliver", "m") not in agent.calls
    assert (await outbox.asnapshot(WS, SES)).lease is None


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
async def test_settle_table(amake, r, row):
    await _run_row(amake, r, row)


# -- how long until the entry is due again ---------------------------------------------------
#
# On an injected clock, so each wait is exact: the attempts before the row's are made at
# one-hour steps (each then due), and the row's ending is recorded at the clock's now.

T0 = 1_900_000_000.0  # seconds since the epoch


class Clock:
    """An injected clock (seconds since the epoch) that a test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


FAIL = _raises(RuntimeError("500"))
REFUSED = _raises(TRANSIENT)


def _hold(seconds: float):
    return _raises(HoldDeliveryError("429", retry_after=seconds))


BACKOFF = {"retry_backoff": 10, "max_backoff": 30, "verify_delay": 7, "verify_backoff": 5,
           "max_verify_backoff": 15, "hold_max": 60, "hold_floor": 1,
           "hold_max_total": 86400}  # fmt: skip


#: (what it shows, the attempts, the status after the last, its wait in seconds)
WAITS = [
    ("first failure waits RETRY_BACKOFF", [("deliver", FAIL)], "pending", 10),
    ("second failure waits double", [("deliver", FAIL)] * 2, "pending", 20),
    ("third failure is capped at MAX_BACKOFF", [("deliver", FAIL)] * 3, "pending", 30),
    ("first transient failure waits RETRY_BACKOFF", [("deliver", REFUSED)], "pending", 10),
    ("second transient failure waits double", [("deliver", REFUSED)] * 2, "pending", 20),
    ("third transient failure is capped", [("deliver", REFUSED)] * 3, "pending", 30),
    ("a transient failure counts its own backoff, not the attempts",
     [("deliver", FAIL), ("deliver", REFUSED)], "pending", 10),
    ("a hold waits the agent's Retry-After", [("deliver", _hold(20))], "pending", 20),
    ("an agent's wait above the floor is not doubled", [("deliver", _hold(20))] * 2,
     "pending", 20),
    ("a hold is capped at HOLD_MAX", [("deliver", _hold(90))], "pending", 60),
    ("Retry-After 0 waits HOLD_FLOOR", [("deliver", _hold(0))], "pending", 1),
    ("the floor doubles with each hold in a row", [("deliver", _hold(0))] * 3, "pending", 4),
    ("the floor is capped at HOLD_MAX", [("deliver", _hold(0))] * 8, "pending", 60),
    ("a failure ends the run: the floor starts again",
     [("deliver", _hold(0)), ("deliver", _hold(0)), ("deliver", FAIL), ("deliver", _hold(0))],
     "pending", 1),
    ("an unknown outcome is verified after VERIFY_DELAY",
     [("deliver", _raises(UNKNOWN))], "verifying", 7),
    ("first inconclusive check waits VERIFY_BACKOFF",
     [("deliver", _raises(UNKNOWN)), ("verify", _verdict(Verdict.INCONCLUSIVE))],
     "verifying", 5),
    ("second inconclusive check waits double",
     [("deliver", _raises(UNKNOWN)), *[("verify", _verdict(Verdict.INCONCLUSIVE))] * 2],
     "verifying", 10),
    ("third inconclusive check is capped at MAX_VERIFY_BACKOFF",
     [("deliver", _raises(UNKNOWN)), *[("verify", _verdict(Verdict.INCONCLUSIVE))] * 3],
     "verifying", 15),
    ("absent waits RETRY_BACKOFF like a failure",
     [("deliver", _raises(UNKNOWN)), ("verify", _verdict(None))], "pending", 10),
]  # fmt: skip


@pytest.mark.parametrize(
    "attempts, status, wait", [w[1:] for w in WAITS], ids=[_id(w[0]) for w in WAITS]
)
async def test_how_long_until_due_again(amake, r, attempts, status, wait):
    clock = Clock()
    agent = Agent()
    outbox = amake(deliverer=agent.deliver, verifier=agent.verify, clock=clock, **BACKOFF)
    run = Run(outbox, agent, {}, amake, r, {})
    a = await _accept(run, "a")
    await _accept(run, "b")
    for kind, does in attempts:
        clock.now += 3600  # whatever the last wait, the entry is due
        agent.once[kind] = lambda entry, does=does: does(run, entry)
        assert await outbox.adeliver_once(WS, SES)
        assert not agent.once, f"the {kind} call was not made"
    stored = {e.id: e for e in await outbox.alist(WS, SES)}[a.id]
    assert str(stored.status) == status
    assert stored.next_attempt_at is not None
    assert _parse(stored.next_attempt_at) - clock.now == pytest.approx(wait, abs=0.001)
    # Until then the session waits behind it (strict order): b is not sent either.
    clock.now += wait - 0.01
    assert not await outbox.adeliver_once(WS, SES)
    clock.now += 0.02
    assert await outbox.adeliver_once(WS, SES)
    assert agent.calls[-1] == ("verify" if status == "verifying" else "deliver", "a")


# -- a delivery settled together with the next claim (settle_next.lua) ----------------------


#: (what it shows, a and m merged, the prompts behind, what the claim made with the settle
#: answered: a merged message's members stay staged, their entry_delivered owed to it)
NEXT_CLAIMS = [
    ("delivered, the next prompt is claimed under the same lease", False, ["b"], "deliver b"),
    ("a merged message delivered, its member's signal is owed next", True, ["b"], "owed m"),
    ("delivered, nothing behind: the lease is released", False, [], "idle"),
    ("a merged message delivered, nothing behind: the member is owed", True, [], "owed m"),
]


@pytest.mark.parametrize(
    "merged, behind, claimed", [n[1:] for n in NEXT_CLAIMS], ids=[_id(n[0]) for n in NEXT_CLAIMS]
)
async def test_a_delivery_settled_with_the_next_claim(amake, r, merged, behind, claimed):
    from django_outbox.core.step import Claimed

    agent = Agent()
    outbox = amake(deliverer=agent.deliver, verifier=agent.verify)
    run = Run(outbox, agent, {}, amake, r, {})
    a = await _accept(run, "a", **({"if_busy": "merge"} if merged else {}))
    if merged:
        await _accept(run, "m", if_busy="merge")
    for text in behind:
        await _accept(run, text)
    took, carry = await outbox.astep(WS, SES, None, more=lambda: True)
    assert took and isinstance(carry, Claimed), carry
    kind, entry, _ = carry.answer
    if kind == "owed":
        assert f"{kind} {' '.join(e.text for e in entry)}" == claimed
    else:
        assert (f"{kind} {entry.text}" if entry is not None else kind) == claimed
    snap = await outbox.asnapshot(WS, SES)
    gone = [a.id] + ([run.ids["m"]] if merged else [])
    assert sorted(e.entry_id for e in snap.endings if e.how == "delivered") == sorted(gone)
    assert [(e.text, str(e.status)) for e in snap.entries if e.id in gone] == [], "still queued"
    if claimed == "idle":
        assert snap.lease is None
    else:
        assert snap.lease is not None
        took, carry = await outbox.astep(WS, SES, None, carry)
        assert took
        if carry is not None:
            await outbox.arelease(WS, SES, carry)
    for _ in range(5):
        if not await outbox.adeliver_once(WS, SES):
            break
    snap = await outbox.asnapshot(WS, SES)
    assert (snap.entries, snap.lease) == ([], None)
    assert agent.transcript.count(a.id) == 1
    assert [c for c in agent.calls if c[0] == "deliver"] == [("deliver", "a")] + [
        ("deliver", t) for t in behind
    ]


# -- ifBusy reject sees the prompt during its call and after its ending ----------------------


@pytest.mark.parametrize(
    "ending, busy_after",
    [
        ("delivered", False),
        ("transient", True),
        ("failed", True),
        ("failed_last", False),
        ("held", True),
        ("unknown_lost", True),
        ("unknown_no_verifier", False),
        ("found", False),
        ("absent", True),
        ("inconclusive", True),
        ("inconclusive_last", False),
    ],
    ids=lambda v: v if isinstance(v, str) else ("busy_after" if v else "free_after"),
)
async def test_if_busy_reject_during_and_after_each_ending(amake, r, ending, busy_after):
    """The session is busy while a prompt is in flight, being verified or waiting to be
    sent again, and free once it ended or waits for a person (docs/howto/steering.md)."""
    from django_outbox.errors import SessionBusy

    kind, end, settings, before = ENDINGS[ending]
    agent = Agent()
    options = {
        "deliverer": agent.deliver,
        "verifier": agent.verify,
        "aborter": agent.abort,
        "retry_backoff": 0,
        "verify_delay": 0,
        "verify_backoff": 0,
        **settings,
    }
    outbox = amake(**options)
    run = Run(outbox, agent, {}, amake, r, {})
    await _accept(run, "a")
    for step, does in before:
        agent.once[step] = lambda entry, does=does: does(run, entry)
        assert await outbox.adeliver_once(WS, SES)

    async def reject(text: str) -> str:
        try:
            await _accept(run, text, if_busy="reject")
        except SessionBusy:
            return "busy"
        return "accepted"

    async def attempt(entry: Entry) -> Any:
        run.notes.append(("during", await reject("during")))
        return await end(run, entry)

    agent.once[kind] = attempt
    assert await outbox.adeliver_once(WS, SES)
    assert run.notes == [("during", "busy")]
    assert await reject("after") == ("busy" if busy_after else "accepted")


# -- what retry does after each ending (docs/explanation/lifecycle.md, "What retry does") ----


#: (what it shows, the ending before the retry, extra settings, what happens meanwhile:
#: "expire" | "park" | "", the retry's result, the status after, its counters (attempts,
#: transientFails, holds, verifyAttempts), the worker's next step, at once)
RETRIES = [
    ("error max_attempts -> pending now, attempts kept", "failed_last", {}, "", "updated",
     "pending", (1, 0, 0, 0), "deliver a"),
    ("error transient_exhausted -> pending now, transient failures restart", "transient_last",
     {}, "", "updated", "pending", (0, 0, 0, 0), "deliver a"),
    ("error hold_exhausted -> pending now, holds restart", "held_last", {}, "", "updated",
     "pending", (0, 0, 0, 0), "deliver a"),
    ("error unverifiable with a verifier -> verifying now, checks restart", "inconclusive_last",
     {}, "", "updated", "verifying", (0, 0, 0, 0), "verify a"),
    ("error unverifiable without a verifier -> pending now", "unknown_no_verifier", {}, "",
     "updated", "pending", (0, 0, 0, 0), "deliver a"),
    ("pending in backoff -> due now, counters unchanged", "failed", {}, "", "updated",
     "pending", (1, 0, 0, 0), "deliver a"),
    ("pending after a transient failure -> due now, its count kept", "transient", {}, "",
     "updated", "pending", (0, 1, 0, 0), "deliver a"),
    ("verifying after its delay -> verified now", "unknown_lost", {}, "", "updated",
     "verifying", (0, 0, 0, 0), "verify a"),
    ("expired -> pending now without its expiry", "transient", {}, "expire", "updated",
     "pending", (0, 1, 0, 0), "deliver a"),
    ("parked -> busy, unchanged", "transient", {}, "park", "busy", "parked", (0, 1, 0, 0),
     None),
]  # fmt: skip


@pytest.mark.parametrize(
    "ending, settings, meanwhile, result, status, counts, first",
    [x[1:] for x in RETRIES],
    ids=[_id(x[0]) for x in RETRIES],
)
async def test_retry_after_each_ending(
    amake, r, ending, settings, meanwhile, result, status, counts, first
):
    kind, end, ending_settings, before = ENDINGS[ending]
    clock = Clock()
    agent = Agent()
    options = {"deliverer": agent.deliver, "verifier": agent.verify, "clock": clock,
               **BACKOFF, **ending_settings, **settings}  # fmt: skip
    outbox = amake(**options)
    run = Run(outbox, agent, {}, amake, r, options)
    a = await _accept(run, "a", **({"expires_after": 60} if meanwhile == "expire" else {}))
    for i, (step, does) in enumerate([*before, (kind, end)]):
        clock.now += 3600 if i else 0  # due again whatever the last wait
        agent.once[step] = lambda entry, does=does: does(run, entry)
        assert await outbox.adeliver_once(WS, SES)
        assert not agent.once
    if meanwhile == "expire":
        clock.now += 3600
        assert not await outbox.adeliver_once(WS, SES)  # the claim finds it expired
        assert str((await outbox.alist(WS, SES))[0].status) == "expired"
    elif meanwhile == "park":
        assert await outbox.apark_workspace(WS, "maintenance") == 1
    assert (await outbox.aretry(WS, SES, a.id)).value == result
    stored = (await outbox.alist(WS, SES))[0]
    assert (str(stored.status), _counts(stored)) == (status, counts)
    calls = len(agent.calls)
    stepped = await outbox.adeliver_once(WS, SES)  # the clock has not moved: due now?
    assert (" ".join(agent.calls[calls]) if stepped else None) == first
    if status != "parked":
        assert stored.next_attempt_at is None and stored.expires_at is None


# -- a settle whose reply was lost runs again and recognises its own write -----------------


#: (what it shows, the ending, what happened meanwhile, the script whose reply is lost,
#: the step's result, a's state after, the endings recorded for a, what the carried claim
#: staged: None when the delivery is not settled with the next claim)
LOST_REPLIES = [
    ("failed, its reply lost -> replayed, one attempt counted", "failed", "nothing", "settle",
     "replayed", "pending", [], None),
    ("cancelled cut, its reply lost -> replayed, cancelled once", "transient", "Stop",
     "settle", "replayed", None, ["cancelled"], None),
    ("unknown, its reply lost -> replayed, verifying", "unknown_lost", "nothing", "settle",
     "replayed", "verifying", [], None),
    ("delivered, its reply lost -> delivered once", "delivered", "nothing", "settle_delivered",
     "removed", None, ["delivered"], None),
    ("delivered with the next claim, its reply lost -> delivered once, the next claim replayed",
     "delivered", "nothing", "settle_next", "removed", None, ["delivered"], "deliver b"),
]  # fmt: skip


@pytest.mark.standalone  # a TCP proxy in front of one server
@pytest.mark.parametrize(
    "ending, meanwhile, script, result, after, ended, claimed",
    [x[1:] for x in LOST_REPLIES],
    ids=[_id(x[0]) for x in LOST_REPLIES],
)
async def test_a_settle_whose_reply_was_lost(
    amake, r, valkey, ending, meanwhile, script, result, after, ended, claimed
):
    from django_outbox.core.step import Claimed
    from tests.support.proxy import TcpProxy

    proxy = TcpProxy(int(valkey.rsplit(":", 1)[1].split("/")[0])).start()
    try:
        kind, end, settings, _ = ENDINGS[ending]
        agent = Agent()
        options = {
            "url": proxy.url,
            "deliverer": agent.deliver,
            "verifier": agent.verify,
            "aborter": agent.abort,
            "retry_backoff": 0,
            "verify_delay": 0,
            **settings,
        }
        outbox = amake(**options)
        run = Run(outbox, agent, {}, amake, r, options)
        a = await _accept(run, "a")
        await _accept(run, "b")
        await outbox.aload_scripts()
        meanwhile_does = MEANWHILE[meanwhile]

        async def attempt(entry: Entry) -> Any:
            await meanwhile_does(run)
            return await end(run, entry)

        agent.once[kind] = attempt
        results: list[str] = []
        outbox.step_listeners.append(lambda step, outcome, res, s: results.append(res))
        proxy.drop_reply_to(outbox.scripts[script].sha.encode())
        took, carry = await outbox.astep(WS, SES, None, more=lambda: claimed is not None)
        assert took and proxy.dropped == 1
        assert results == [result]
        snap = await outbox.asnapshot(WS, SES)
        assert _state({e.id: e for e in snap.entries}.get(a.id)) == after
        assert [e.how for e in snap.endings if e.entry_id == a.id] == ended
        if claimed is None:
            if carry is not None:
                await outbox.arelease(WS, SES, carry)
        else:
            assert isinstance(carry, Claimed)
            kind_, entry, _ = carry.answer
            assert f"{kind_} {entry.text}" == claimed
            took, carry = await outbox.astep(WS, SES, None, carry)
            if carry is not None:
                await outbox.arelease(WS, SES, carry)
        snap = await outbox.asnapshot(WS, SES)
        assert snap.lease is None, "the session's lease was not released"
        assert [e.how for e in snap.endings if e.entry_id == a.id] == ended, "recorded twice"
        assert agent.transcript.count(a.id) <= 1
    finally:
        proxy.close()
