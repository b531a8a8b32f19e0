"""outbox.js under Node: a reconnect's snapshot tells a view how the prompts that left the
queue while its socket was down ended (docs/reference/websocket.md#how-prompts-ended,
docs/howto/frontend.md "Watching").

Rows the record names take the state and ``ended`` their update would have given them, and
``endedAt``; a row it does not name (it ended longer ago, or its ending was trimmed) is
``finished`` with ``ended`` null; an entry's newest ending wins; an expired row still in the
queue says ``ended: "expired"``; a snapshot split into pages carries the record on its last.
"""

from __future__ import annotations

from tests.support.node import run_node

SCRIPT = r"""
{
  FakeWS.all = [];
  const views = [];
  const entry = (id, status = "pending") => ({ id, status, text: id, clientMessageID: id,
    acceptedAt: "2026-01-01T00:00:01Z" });
  const ob = make([], []);
  const sub = ob.subscribe("w", "s", (v) => views.push(v));
  const first = FakeWS.all[0];
  first.frame({ type: "queue.snapshot", version: 1, page: 1, pages: 1,
    entries: ["sent", "dropped", "gone", "again", "unseen", "late"].map((id) => entry(id)) });
  first.drop(1006);
  await until(() => FakeWS.all.length === 2);
  const at = "2026-01-01T00:00:09.000000Z";
  const ended = [
    { id: "again", how: "delivered", at },  // newest first: retried, then delivered
    { id: "late", how: "expired", at },
    { id: "dropped", how: "cancelled", at },
    { id: "gone", how: "dismissed", at },
    { id: "sent", how: "delivered", at },
    { id: "again", how: "expired", at },
  ];
  const second = FakeWS.all[1];
  second.frame({ type: "queue.snapshot", version: 9, page: 1, pages: 2, entries: [] });
  second.frame({ type: "queue.snapshot", version: 9, page: 2, pages: 2, ack: "t", ended,
    entries: [entry("late", "expired")] });
  const rows = views.at(-1).entries;
  results.rows = Object.fromEntries(rows.map((r) => [r.id, [r.state, r.ended, r.endedAt ?? null]]));
  sub.close();
  ob.close();
}
console.log(JSON.stringify(results));
"""


def test_a_reconnects_snapshot_says_how_the_missed_prompts_ended(tmp_path):
    results = run_node(tmp_path, SCRIPT)
    at = "2026-01-01T00:00:09.000000Z"
    assert results["rows"] == {
        "sent": ["sent", "delivered", at],
        "dropped": ["cancelled", "cancelled", at],
        "gone": ["dismissed", "dismissed", at],
        "again": ["sent", "delivered", at],
        "unseen": ["finished", None, None],
        "late": ["expired", "expired", None],
    }
