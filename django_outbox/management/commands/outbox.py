"""``manage.py outbox``: look at the queue and act on it from a shell
(docs/reference/commands.md#outbox).

Subcommands, each through the same :class:`~django_outbox.Outbox` methods as the admin:

- ``status [--json]``: totals, entries by status, the most overdue session, workers.
- ``inspect <workspace> [<session>] [--json]``: a workspace's sessions, or one session's
  entries and lease.
- ``retry <workspace> <session> <entry>``, ``dismiss <workspace> <session> <entry>``.
- ``edit <workspace> <session> <entry> [--text T] [--model JSON] [--if-version N]``,
  ``move <workspace> <session> <entry> (--before ID | --to next|last)``,
  ``cancel <workspace> <session> <entry>`` (docs/howto/steering.md).
- ``park <workspace> --reason CODE``, ``unpark <workspace> [--reason CODE]``.
- ``cleanup <workspace> [--yes]``: asks for confirmation unless ``--yes``.
- ``owed <workspace> <session> <entry> --retry|--skip``: an owed ``entry_delivered`` held
  after ``MAX_RECEIVER_ATTEMPTS`` failed firings: fire it again, or record the opted-in
  receivers as done without running them (docs/reference/signals.md#a-receiver-that-keeps-failing).
- ``claim [--force]``, ``release``: this project's claim on the key space
  (docs/howto/valkey.md#one-project-per-key-space).
- ``interrupt <workspace> <session> [--entry ID]``: "Stop", cut the session's running
  turn; with ``--entry`` only that entry's, refused (exit 2, nothing cut) once it is not
  the one in flight (docs/howto/cutting.md; refused, exit 2, without ``OUTBOX["ABORTER"]``).

An edit, move, cancel or Stop from here is recorded on the entry as made by
``cli:<login>``, the operating system login running the command
(docs/explanation/storage.md#who-changed-an-entry).

Exit codes scripts can rely on: 0 done, 1 not found (no such entry, session or
workspace), 2 refused (busy under a live lease, bad input, a cleanup not confirmed, a
key space another project claimed), 3 Valkey unavailable.
"""

from __future__ import annotations

import json
import sys
import time
import unicodedata
from argparse import ArgumentParser
from datetime import UTC, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from django_outbox import receipts
from django_outbox.core.actors import cli_actor
from django_outbox.core.entry import (
    CancelResult,
    DismissResult,
    EditResult,
    InterruptResult,
    MoveResult,
    RetryResult,
)
from django_outbox.core.history import summary
from django_outbox.core.owner import ClaimResult
from django_outbox.core.redaction import redact
from django_outbox.core.rules import UNPRINTABLE_CATEGORIES
from django_outbox.errors import (
    InvalidContent,
    InvalidIdentifier,
    KeySpaceClaimed,
    OutboxUnavailable,
)
from django_outbox.outbox import Outbox, get_outbox
from django_outbox.signals import entry_delivered

OK, NOT_FOUND, REFUSED, UNAVAILABLE = 0, 1, 2, 3


def _exit(message: str, code: int) -> CommandError:
    """The error that ends a run with a documented exit code (docs/reference/commands.md#outbox)."""
    return CommandError(message, returncode=code)


def printable(text: str) -> str:
    """``text`` safe for a terminal: every control, format or line/paragraph-separator
    character (:data:`~django_outbox.core.rules.UNPRINTABLE_CATEGORIES`: ESC, BEL, a C1 CSI,
    a right-to-left override...) is written as a ``\\xNN``/``\\uNNNN`` escape, so an agent's
    error text or a stored park reason can neither drive the terminal nor read differently
    from what is stored. Every human-readable line of this command goes through it;
    ``--json`` does not (it prints the stored values exactly).
    docs/reference/commands.md#outbox
    """
    out: list[str] = []
    for ch in text:
        if unicodedata.category(ch) in UNPRINTABLE_CATEGORIES:
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _when(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def _ago(epoch: float | None, now: float) -> str:
    if epoch is None:
        return "—"
    seconds = max(0.0, now - epoch)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}min"
    return f"{seconds / 3600:.1f}h"


def _minutes_arg(text: Any) -> int:
    """``--minutes``: checked here, not by argparse, so a bad value exits 2 from
    ``call_command`` too (argparse's own errors are 1 there)."""
    try:
        # call_command may pass anything: only digits (or an int) are a whole number.
        if isinstance(text, bool) or not isinstance(text, (int, str)):
            raise TypeError(text)
        value = int(text)
    except (TypeError, ValueError):
        value = 0
    if not 1 <= value <= 44_640:
        raise _exit("--minutes must be a whole number from 1 to 44640 (31 days)", REFUSED)
    return value


def _minutes(n: int) -> str:
    if n % 1440 == 0:
        return "day" if n == 1440 else f"{n // 1440} days"
    if n % 60 == 0:
        return "hour" if n == 60 else f"{n // 60} hours"
    return f"{n} minutes"


def _seconds(bound: float | str) -> str:
    return "> 1h" if bound == "+Inf" else f"<= {bound:g}s"


class Command(BaseCommand):
    help = (
        "Look at the outbox and act on it: status, inspect, retry, dismiss, edit, move, cancel, "
        "owed, park, unpark, cleanup, claim, release, interrupt. Exit codes: 0 done, 1 not "
        "found, 2 refused (busy, bad input, not confirmed, not supported), 3 Valkey unavailable."
    )
    # The outbox's own checks would refuse to run while Valkey is unreachable or evicting;
    # an operator needs this command exactly then.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)

        status = sub.add_parser(
            "status", help="totals, entries by status, overdue, workers, the last hour"
        )
        status.add_argument("--json", action="store_true", help="print one JSON object")
        status.add_argument(
            "--minutes",
            default="60",
            help="minutes of history summed under 'recent' (1-44640; default 60)",
        )

        inspect = sub.add_parser("inspect", help="a workspace's sessions or a session's entries")
        inspect.add_argument("workspace")
        inspect.add_argument("session", nargs="?")
        inspect.add_argument("--json", action="store_true", help="print one JSON object")

        for name, what in (("retry", "re-arm an entry now"), ("dismiss", "remove an entry")):
            one = sub.add_parser(name, help=what)
            one.add_argument("workspace")
            one.add_argument("session")
            one.add_argument("entry")

        edit = sub.add_parser("edit", help="change the text or model of a waiting prompt")
        move = sub.add_parser("move", help="reorder a queued prompt")
        cancel = sub.add_parser("cancel", help="remove a queued prompt (not the one in flight)")
        for one in (edit, move, cancel):
            one.add_argument("workspace")
            one.add_argument("session")
            one.add_argument("entry")
        edit.add_argument("--text", help="the new prompt text")
        edit.add_argument("--model", help="the new model selector, a JSON object")
        edit.add_argument(
            "--if-version", type=int, help="refuse unless the session is at this version"
        )
        where = move.add_mutually_exclusive_group(required=True)
        where.add_argument("--before", help="put it right before this queued entry")
        where.add_argument("--to", choices=["next", "last"])
        owed = sub.add_parser(
            "owed", help="an entry_delivered held after MAX_RECEIVER_ATTEMPTS failures"
        )
        owed.add_argument("workspace")
        owed.add_argument("session")
        owed.add_argument("entry")
        choice = owed.add_mutually_exclusive_group(required=True)
        choice.add_argument("--retry", action="store_true", help="fire it again")
        choice.add_argument(
            "--skip",
            action="store_true",
            help="record its opted-in receivers as done without running them",
        )

        park = sub.add_parser("park", help="pause a workspace (parks what is queued)")
        park.add_argument("workspace")
        park.add_argument("--reason", required=True, help="a machine code, e.g. maintenance")

        unpark = sub.add_parser("unpark", help="end a workspace's pause")
        unpark.add_argument("workspace")
        unpark.add_argument("--reason", help="only entries parked with this reason")

        cleanup = sub.add_parser("cleanup", help="delete every key of a workspace")
        cleanup.add_argument("workspace")
        cleanup.add_argument("--yes", action="store_true", help="do not ask for confirmation")

        claim = sub.add_parser(
            "claim", help="claim the key space (KEY_PREFIX in this database) for this project"
        )
        claim.add_argument(
            "--force",
            action="store_true",
            help="take it over from another project (its running workers stop and its web "
            "processes refuse accepts within about 2 s)",
        )
        sub.add_parser("release", help="give up this project's claim on the key space")

        interrupt = sub.add_parser(
            "interrupt", help="Stop: cut a session's running turn (docs/howto/cutting.md)"
        )
        interrupt.add_argument("workspace")
        interrupt.add_argument("session")
        interrupt.add_argument(
            "--entry",
            metavar="ID",
            help="the entry whose turn to stop (the one you saw in flight): refused, nothing "
            "cut, once it is not in flight; without it, whatever turn runs now is cut",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        outbox = get_outbox()
        run = getattr(self, f"_{options['subcommand']}")
        try:
            run(outbox, options)
        except OutboxUnavailable as exc:
            raise _exit(str(exc), UNAVAILABLE) from exc
        except (InvalidIdentifier, InvalidContent) as exc:
            raise _exit(str(exc), REFUSED) from exc
        except KeySpaceClaimed as exc:
            raise _exit(
                f"Nothing was done: {exc}. 'manage.py check' says how to fix it; "
                "'manage.py outbox claim --force' takes the key space over.",
                REFUSED,
            ) from exc

    # -- reading ------------------------------------------------------------------------

    def _status(self, outbox: Outbox, options: dict[str, Any]) -> None:
        totals = outbox.index_totals()
        counts = outbox.entry_counts()
        overdue = outbox.most_overdue()
        workers = outbox.workers()
        recent = summary(outbox.history(_minutes_arg(options["minutes"])))
        now = time.time()
        if options["json"]:
            self._json(
                {
                    "workspaces": totals.workspaces,
                    "sessions": totals.sessions,
                    "attention": totals.attention,
                    "entries": counts,
                    "mostOverdue": None
                    if overdue is None
                    else {
                        "workspaceID": overdue.workspace_id,
                        "sessionID": overdue.session_id,
                        "dueAt": _when(overdue.due_at),
                        "overdueSeconds": round(max(0.0, now - overdue.due_at), 3),
                    },
                    "workers": [
                        {
                            "id": w.id,
                            "live": w.live,
                            "host": w.host,
                            "pid": w.pid,
                            "inFlight": w.in_flight,
                            "concurrency": w.concurrency,
                            "lastSeen": _when(w.last_seen),
                            "started": _when(w.started),
                        }
                        for w in workers
                    ],
                    "recent": recent,
                }
            )
            return
        out = self._say
        out(
            f"Workspaces {totals.workspaces} · sessions {totals.sessions} · "
            f"needing attention {totals.attention}"
        )
        by_status = ", ".join(f"{status} {n}" for status, n in sorted(counts.items()))
        out(f"Entries: {by_status or 'none'}")
        if overdue is None:
            out("Overdue: nothing")
        else:
            out(
                f"Most overdue: {overdue.workspace_id}/{overdue.session_id}, due "
                f"{_ago(overdue.due_at, now)} ago ({_when(overdue.due_at)})"
            )
        latency = ", ".join(
            f"{q} {_seconds(v)}" for q, v in recent["latencySeconds"].items() if v is not None
        )
        out(
            f"Last {_minutes(recent['minutes'])}: accepted {recent['accepted']}, "
            f"delivered {recent['delivered']}, failed attempts {recent['failedAttempts']}, "
            f"unknown outcomes {recent['unknownOutcomes']}, "
            f"stopped turns {recent['cutTurns']}, cancelled {recent['cancelled']}, "
            f"moved to error {recent['movedToError']}, parked {recent['parked']}"
            + (f"; latency {latency}" if latency else "")
        )
        live = [w for w in workers if w.live]
        out(f"Workers: {len(live)} live, {len(workers) - len(live)} silent")
        for w in workers:
            state = "live" if w.live else "silent"
            load = "" if w.in_flight is None else f", in flight {w.in_flight}/{w.concurrency}"
            where = "" if w.host is None else f" on {w.host} pid {w.pid}"
            out(f"  {w.id}{where}: {state}, seen {_ago(w.last_seen, now)} ago{load}")

    def _inspect(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ws, ses = options["workspace"], options["session"]
        if ses is None:
            (summary,) = outbox.workspace_summaries([ws])
            if not summary.sessions:
                raise _exit(f"No sessions in workspace {ws}.", NOT_FOUND)
            if options["json"]:
                self._json(
                    {
                        "workspaceID": ws,
                        "sessions": [
                            {"sessionID": s.session_id, "entries": s.entries, "leased": s.leased}
                            for s in summary.sessions
                        ],
                    }
                )
                return
            self._say(
                f"Workspace {ws}: {len(summary.sessions)} sessions, "
                f"{summary.entry_count} entries, {summary.leased} being delivered"
            )
            for s in summary.sessions:
                held = " (lease held)" if s.leased else ""
                self._say(f"  {s.session_id}: {s.entries} entries{held}")
            return
        snapshot = outbox.snapshot(ws, ses)
        if not snapshot.entries and snapshot.lease is None:
            (summary,) = outbox.workspace_summaries([ws])
            if ses not in {s.session_id for s in summary.sessions}:
                raise _exit(f"No session {ws}/{ses}.", NOT_FOUND)
        if options["json"]:
            self._json(
                {
                    "workspaceID": ws,
                    "sessionID": ses,
                    "version": snapshot.version,
                    "lease": None
                    if snapshot.lease is None
                    else {
                        "owner": snapshot.lease.owner,
                        "acquiredAt": snapshot.lease.acquired_at,
                        "entryID": snapshot.lease.entry_id,
                        "heldFor": round(snapshot.lease.held_for, 3),
                    },
                    "entries": [entry.to_dict() for entry in snapshot.entries],
                    "owedFailures": outbox.owed_failures(ws, ses),
                }
            )
            return
        out = self._say
        out(f"Session {ws}/{ses}: version {snapshot.version}, {len(snapshot.entries)} entries")
        if snapshot.lease is not None:
            lease = snapshot.lease
            out(f"  lease: {lease.owner} on {lease.entry_id or '—'} for {lease.held_for:.1f}s")
        for entry in snapshot.entries:
            error = f" — {entry.last_error[:80]}" if entry.last_error else ""
            reason = f" ({entry.reason})" if entry.reason else ""
            out(
                f"  {entry.id} {entry.status}{reason}, attempts {entry.attempts}, "
                f"accepted {entry.accepted_at}{error}"
            )
        self._say_owed(outbox, ws, ses)

    # -- acting -------------------------------------------------------------------------

    def _retry(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ref = self._ref(options)
        result = outbox.retry(options["workspace"], options["session"], options["entry"])
        if result is RetryResult.NOT_FOUND:
            raise _exit(f"Not found: {ref} (delivered, dismissed or cleaned up).", NOT_FOUND)
        if result is RetryResult.BUSY:
            raise _exit(
                f"Busy, not retried: {ref} is being delivered or verified under a live lease, "
                "or parked (unpark the workspace instead).",
                REFUSED,
            )
        self._say(f"Re-armed {ref}: due now.")

    def _dismiss(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ref = self._ref(options)
        result = outbox.dismiss(options["workspace"], options["session"], options["entry"])
        if result is DismissResult.NOT_FOUND:
            raise _exit(f"Not found: {ref} (delivered, dismissed or cleaned up).", NOT_FOUND)
        if result is DismissResult.BUSY:
            raise _exit(
                f"Busy, not dismissed: {ref} is being delivered or verified under a live lease.",
                REFUSED,
            )
        self._say(f"Dismissed {ref}: it will never be delivered.")

    def _owed(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ws, ses, entry_id = options["workspace"], options["session"], options["entry"]
        ref = self._ref(options)
        owed = outbox.owed_entry(ws, ses, entry_id)
        if owed is None:
            raise _exit(f"Not found: {ref} has no entry_delivered owed.", NOT_FOUND)
        if options["skip"]:
            names = entry_delivered.once_receivers()
            done = receipts.skip_owed(entry_id, owed.delivered_at or "", names)
            skipped = ", ".join(done) or "none (each had run already)"
            what = f"Skipped the opted-in receivers of {ref}: {skipped}; "
        else:
            what = f"Firing the entry_delivered of {ref} again; "
        outbox.reset_owed_failures(ws, ses, entry_id)
        self._say(f"{what}the session's next claim, within LOCK_TTL, fires it.")

    def _say_owed(self, outbox: Outbox, ws: str, ses: str) -> None:
        bound = outbox.config.max_receiver_attempts
        for entry_id, n in sorted(outbox.owed_failures(ws, ses).items()):
            held = (
                f": held, the session waits — 'manage.py outbox owed {ws} {ses} {entry_id} "
                "--retry' or '--skip'"
                if n >= bound
                else f" (held at {bound})"
            )
            self._say(f"  {entry_id}: entry_delivered failed {n} times{held}")

    def _edit(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ref = self._ref(options)
        model = None
        if options["model"] is not None:
            try:
                model = json.loads(options["model"])
            except ValueError as exc:
                raise _exit(f"--model is not JSON: {exc}", REFUSED) from exc
        result = outbox.edit(
            options["workspace"],
            options["session"],
            options["entry"],
            text=options["text"],
            model=model,
            if_version=options["if_version"],
            actor=cli_actor(),
        )
        if result is EditResult.NOT_FOUND:
            raise _exit(f"Not found: {ref} (delivered, dismissed or cleaned up).", NOT_FOUND)
        if result is EditResult.BUSY:
            raise _exit(f"Busy, not edited: {ref} is being delivered or verified.", REFUSED)
        if result is EditResult.VERSION_MISMATCH:
            raise _exit("Not edited: the session is no longer at the version given.", REFUSED)
        self.stdout.write(f"Edited {ref}.")

    def _move(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ref = self._ref(options)
        result = outbox.move(
            options["workspace"],
            options["session"],
            options["entry"],
            before=options["before"],
            to=options["to"],
            actor=cli_actor(),
        )
        if result is MoveResult.NOT_FOUND:
            raise _exit(f"Not found: {ref}, or the entry to go before, is not queued.", NOT_FOUND)
        if result is MoveResult.BUSY:
            raise _exit(
                f"Busy, not moved: {ref} or the place asked for is in flight or being verified.",
                REFUSED,
            )
        self.stdout.write(f"Moved {ref}.")

    def _cancel(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ref = self._ref(options)
        result = outbox.cancel(
            options["workspace"], options["session"], options["entry"], actor=cli_actor()
        )
        if result is CancelResult.NOT_FOUND:
            raise _exit(f"Not found: {ref} (delivered, dismissed or cleaned up).", NOT_FOUND)
        if result is CancelResult.IN_FLIGHT:
            raise _exit(f"In flight, not cancelled: {ref} is being delivered or verified.", REFUSED)
        self.stdout.write(f"Cancelled {ref}: it will never be delivered.")

    def _park(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ws = options["workspace"]
        count = outbox.park_workspace(ws, options["reason"])
        self._say(
            f"Parked workspace {ws} ({options['reason']}): {count} entries now; what is "
            "accepted into it is held until unpark."
        )

    def _unpark(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ws = options["workspace"]
        count = outbox.unpark_workspace(ws, options["reason"])
        self._say(f"Unparked workspace {ws}: {count} entries released in accept order.")

    def _cleanup(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ws = options["workspace"]
        (summary,) = outbox.workspace_summaries([ws])
        if not summary.sessions:
            raise _exit(f"No sessions in workspace {ws}: nothing to clean up.", NOT_FOUND)
        what = (
            f"workspace {ws}: {len(summary.sessions)} sessions, {summary.entry_count} entries "
            f"({summary.leased} being delivered)"
        )
        if not options["yes"]:
            if not sys.stdin.isatty():
                raise _exit(f"Not confirmed (no terminal): pass --yes to delete {what}.", REFUSED)
            answer = input(f"Delete every key of {what}? Type the workspace ID to confirm: ")
            if answer.strip() != ws:
                raise _exit("Not confirmed: nothing was deleted.", REFUSED)
        removed = outbox.cleanup_workspace(ws)
        self._say(
            f"Cleaned up workspace {ws}: {summary.entry_count} entries, {removed} keys removed."
        )

    # -- the key space ------------------------------------------------------------------

    def _claim(self, outbox: Outbox, options: dict[str, Any]) -> None:
        space = self._space(outbox)
        before = outbox.key_space_claim() if options["force"] else None
        result = outbox.claim_key_space(force=options["force"])
        assert result is not None  # get_outbox passes this project's key_space_owner
        if result is ClaimResult.UNWRITTEN:
            raise _exit(
                f"The claim on {space} was not written (Valkey refused the write: full or "
                "read-only). Nobody else holds it; try again later.",
                UNAVAILABLE,
            )
        message = {
            ClaimResult.CLAIMED: f"Claimed {space} for this project.",
            ClaimResult.OWNED: f"This project already holds {space}.",
            ClaimResult.RENEWED: f"Renewed this project's claim on {space}: it was made with "
            "a key of SECRET_KEY_FALLBACKS and now names the current SECRET_KEY.",
            ClaimResult.TAKEN_OVER: f"Took {space} over from "
            f"{before.describe() if before else 'another project'}: that project's running "
            "workers stop and its web processes refuse accepts within about 2 s, and its "
            "workers refuse to start here from now on.",
        }
        self._say(message[result])

    def _release(self, outbox: Outbox, options: dict[str, Any]) -> None:
        space = self._space(outbox)
        if not outbox.release_key_space():
            raise _exit(f"No claim on {space}: nothing to release.", NOT_FOUND)
        self._say(
            f"Released {space}: the next accept, cleanup or worker start of a project "
            "claims it again."
        )

    def _interrupt(self, outbox: Outbox, options: dict[str, Any]) -> None:
        ws, ses, named = options["workspace"], options["session"], options.get("entry")
        result = outbox.interrupt(ws, ses, entry_id=named, actor=cli_actor())
        if result is InterruptResult.NOT_SUPPORTED:
            raise _exit(
                "Not supported: no OUTBOX['ABORTER'] is configured, so a running turn cannot "
                "be cut.",
                REFUSED,
            )
        if result is InterruptResult.NOT_IN_FLIGHT:
            raise _exit(
                f"Not cut: {ws}/{ses} {named} is not in flight (delivered, gone or queued, or "
                "another prompt is in flight now); nothing was cut.",
                REFUSED,
            )
        if result is InterruptResult.IDLE:
            self.stdout.write(f"Nothing to cut: {ws}/{ses} has no prompt in flight.")
            return
        again = " (it was cut before)" if result is InterruptResult.ALREADY else ""
        target = f"{ws}/{ses} {named}" if named else f"{ws}/{ses}"
        self.stdout.write(
            f"Cutting the running turn of {target}{again}: the worker aborts it; the prompt "
            "ends sent (interrupted) or cancelled, as the verifier finds."
        )

    @staticmethod
    def _space(outbox: Outbox) -> str:
        return f"key space {outbox.keys.prefix!r} at {redact(outbox.url)}"

    # -- helpers ------------------------------------------------------------------------

    @staticmethod
    def _ref(options: dict[str, Any]) -> str:
        return f"{options['workspace']}/{options['session']}/{options['entry']}"

    def _say(self, line: str) -> None:
        """Write one human-readable line, escaped by :func:`printable`."""
        self.stdout.write(printable(line))

    def _json(self, value: Any) -> None:
        self.stdout.write(json.dumps(value, ensure_ascii=False, indent=2, default=str))
