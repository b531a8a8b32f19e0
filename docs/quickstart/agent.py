"""mysite/agent.py: a toy agent for the quickstart. Its "transcript" is a file,
agent-inbox.jsonl beside manage.py, one JSON line per prompt it received."""

import json
from pathlib import Path

from django_outbox import Verdict

INBOX = Path(__file__).resolve().parent.parent / "agent-inbox.jsonl"


def deliver(entry, *, workspace_id, session_id, attempt):
    """Hand one prompt to the agent. Returning means delivered; raising means it failed
    (see "Write a deliverer and a verifier" for the exceptions that mean more)."""
    line = {"id": entry.id, "session": session_id, "attempt": attempt, "text": entry.text}
    with INBOX.open("a", encoding="utf-8") as inbox:
        inbox.write(json.dumps(line) + "\n")


def verify(entry, *, workspace_id, session_id):
    """Asked when an attempt's outcome is unknown: did the agent get this prompt?"""
    if not INBOX.exists():
        return Verdict.ABSENT
    with INBOX.open(encoding="utf-8") as inbox:
        received = any(json.loads(line)["id"] == entry.id for line in inbox)
    return Verdict.DELIVERED if received else Verdict.ABSENT
