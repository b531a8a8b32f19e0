"""outbox.js's side of cutting a turn, under Node (tests/support/node.py): ``stop()`` and
``sendNow()`` call ``interrupt/`` and ``send-now/``, a refusal throws ``OutboxError``, and
a live view ends a ``cancelled`` prompt and resyncs on a ``moved`` one
(docs/howto/cutting.md)."""

from __future__ import annotations

from tests.support.node import run_node

SCENARIO = r"""
{
  const log = [];
  const ob = make(
    [
      { status: 202, body: { result: "cut" } },
      { status: 202, body: { result: "cut" } },
      { status: 409, body: { code: "not_supported", detail: "no aborter" } },
      { status: 200, body: { result: "idle" } },
    ],
    log,
  );
  const stopped = await ob.stop("w", "ses 1");
  const now = await ob.sendNow("w", "ses 1", "e/2");
  let err = null;
  try { await ob.stop("w", "ses 1"); } catch (e) { err = [e.name, e.status, e.code]; }
  const sub = ob.subscribe("w", "ses 1", () => {});
  const viaSub = await sub.stop();
  results.calls = { stopped, now, err, viaSub, log: log.map((x) => [x.method, x.url, x.csrf]) };
  sub.close();
  ob.close();
}
{
  FakeWS.all = [];
  const views = [];
  const ob = make([], []);
  const sub = ob.subscribe("w", "s", (v) => views.push(v));
  const ws = FakeWS.all[0];
  const e = (id, status, extra = {}) => ({ id, status, text: id, clientMessageID: "c" + id,
    acceptedAt: "2026-01-01T00:00:00Z", ...extra });
  const up = (version, state, entry) => ws.frame({ type: "queue.update", version, state, entry });
  const cut = { interrupted: true };
  ws.frame({ type: "queue.snapshot", version: 1,
    entries: [e("e1", "delivering"), e("e2", "pending")] });
  up(2, "delivering", e("e1", "delivering", cut));
  up(3, "moved", e("e2", "pending"));
  const resyncs = ws.sent.length;
  up(4, "cancelled", e("e1", "verifying", cut));
  const last = views.at(-1);
  results.view = { entries: last.entries.map((r) => [r.id, r.state]), resyncs };
  sub.close();
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0);
"""


def test_outbox_js_stops_sends_now_and_follows_a_cut(tmp_path):
    r = run_node(tmp_path, SCENARIO)
    calls = r["calls"]
    assert calls["stopped"] == {"result": "cut"} and calls["now"] == {"result": "cut"}
    assert calls["err"] == ["OutboxError", 409, "not_supported"]
    assert calls["viaSub"] == {"result": "idle"}
    assert calls["log"] == [
        ["POST", "/outbox/api/workspaces/w/sessions/ses%201/interrupt/", "tok"],
        ["POST", "/outbox/api/workspaces/w/sessions/ses%201/messages/e%2F2/send-now/", "tok"],
        ["POST", "/outbox/api/workspaces/w/sessions/ses%201/interrupt/", "tok"],
        ["POST", "/outbox/api/workspaces/w/sessions/ses%201/interrupt/", "tok"],
    ]
    view = r["view"]
    assert view["entries"] == [["e1", "cancelled"], ["e2", "queued"]]  # the ended one first
    assert view["resyncs"] == 1  # a moved prompt's new place comes with a snapshot
