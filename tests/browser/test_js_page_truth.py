"""outbox.js under Node (the harness of tests/browser/test_browser_logic.py): what a view says
right after a 202 and about the worker (docs/howto/frontend.md, "Watching" and "Is a worker
running?").

- A 202 whose entry is stored parked (its workspace is parked) shows the row as ``parked``
  before any live update arrives, not ``queued``.
- ``view.worker`` is null until the first answer of ``.../worker/``, then follows it; a failed
  check leaves it as it was. A row ended by a live update says how (``ended``).
"""

from __future__ import annotations

from tests.support.node import run_node

SCRIPT = r"""
{
  FakeWS.all = [];
  const views = [];
  const parked = { id: "e1", status: "parked", reason: "maint", parkedFrom: "pending",
    text: "held", clientMessageID: "c1", acceptedAt: "2026-01-01T00:00:01Z" };
  const log = [];
  // The subscription's first worker check, then the send's 202, then two more checks.
  const answers = [
    { status: 200, body: { alive: false, lastSeen: null } },
    { status: 202, body: parked },
    { status: 200, body: { alive: true, lastSeen: "2026-01-01T00:00:02.000000Z" } },
    new Error("offline"),
  ];
  const ob = make(answers, log, { workerCheck: 30 });
  const sub = ob.subscribe("w", "s", (v) => views.push(v));
  results.before = views.length ? views.at(-1).worker : null;
  await until(() => views.at(-1)?.worker !== null && views.at(-1)?.worker !== undefined);
  results.first = views.at(-1).worker;
  const ws = FakeWS.all[0];
  ws.frame({ type: "queue.snapshot", version: 1, entries: [] });
  await ob.send("w", "s", "held", { clientMessageID: "c1" });
  const row = views.at(-1).entries.find((r) => r.id === "e1");
  results.adopted = { state: row.state, ended: row.ended };
  await until(() => views.at(-1).worker?.alive === true);
  results.second = views.at(-1).worker;
  await until(() => log.length >= 4);
  await new Promise((r) => setTimeout(r, 50));
  results.afterFailure = views.at(-1).worker.alive;
  ws.frame({ type: "queue.update", version: 2, state: "dismissed", entry: parked });
  results.ended = views.at(-1).entries.find((r) => r.id === "e1").ended;
  results.urls = log.map((x) => `${x.method || "GET"} ${x.url}`);
  sub.close();
  ob.close();
}
console.log(JSON.stringify(results));
"""


def test_a_parked_202_shows_parked_and_the_view_follows_the_worker_check(tmp_path):
    results = run_node(tmp_path, SCRIPT)
    assert results["first"]["alive"] is False and results["first"]["lastSeen"] is None
    assert results["adopted"] == {"state": "parked", "ended": None}
    assert results["second"]["alive"] is True
    assert results["second"]["lastSeen"] == "2026-01-01T00:00:02.000000Z"
    assert results["afterFailure"] is True  # a failed check changes nothing
    assert results["ended"] == "dismissed"
    assert results["urls"][0] == "GET /outbox/api/workspaces/w/sessions/s/worker/"
    assert results["urls"][1] == "POST /outbox/api/workspaces/w/sessions/s/messages/"
