"""outbox.js's steering calls under Node: send() options, edit, move, cancel
(docs/howto/steering.md); the harness is tests/support/node.py."""

from __future__ import annotations

from tests.support.node import run_node

STEERING = r"""
{
  const log = [];
  const answers = [
    { status: 202, body: { id: "e1", text: "hi", mode: "reject" } },
    { status: 200, body: { id: "e1", text: "better" } },
    { status: 200, body: { id: "e1" } },
    { status: 204 },
    { status: 412, body: { code: "version_mismatch", detail: "stale" } },
  ];
  const fetch = async (url, init) => {
    log.push([init.method, url, init.body ? JSON.parse(init.body) : null,
              init.headers["If-Match"] || null]);
    const a = answers.shift();
    return {
      status: a.status, ok: a.status < 300, redirected: false,
      headers: { get: () => null },
      json: async () => a.body ?? null,
    };
  };
  const ob = createOutbox({ ...fast, storage: newStorage(), fetch });
  await ob.send("w", "s", "hi", { ifBusy: "reject", expiresAfter: 30 });
  await ob.edit("w", "s", "e1", { text: "better" }, { version: 41 });
  await ob.move("w", "s", "e1", { to: "next" });
  await ob.cancel("w", "s", "e1");
  let err = null;
  try {
    await ob.edit("w", "s", "e1", { text: "x" }, { version: 1 });
  } catch (e) {
    err = [e.status, e.code];
  }
  results.calls = log;
  results.err = err;
  ob.close();
}
// A subscription shows the queue's order: a move asks for a snapshot, which carries it.
{
  const views = [];
  const ob = createOutbox({ ...fast, storage: newStorage(), fetch: async () => ({}) });
  ob.subscribe("w", "s", (v) => views.push(v));
  const ws = FakeWS.all.at(-1);
  const e = (id, extra = {}) => ({
    id, status: "pending", text: id, clientMessageID: "c" + id,
    acceptedAt: `2026-01-01T00:00:0${id.slice(1)}Z`, ...extra,
  });
  const order = () => views.at(-1).entries.map((r) => r.id);
  ws.frame({ type: "queue.snapshot", version: 5, entries: [e("e1"), e("e2"), e("e3")] });
  results.before = order();
  ws.frame({ type: "queue.update", version: 6, state: "moved", entry: e("e3") });
  results.asked = ws.sent;
  results.meanwhile = order();
  ws.frame({ type: "queue.snapshot", version: 6, entries: [e("e3"), e("e1"), e("e2")] });
  results.after = order();
  ws.frame({ type: "queue.update", version: 7, state: "edited", entry: e("e1", { text: "x" }) });
  ws.frame({ type: "queue.update", version: 8, state: "queued", entry: e("e4") });
  ws.frame({ type: "queue.update", version: 9, state: "cancelled", entry: e("e2") });
  results.later = views.at(-1).entries.map((r) => [r.id, r.state, r.text]);
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0);
"""


def test_outbox_js_sends_options_and_steers_queued_prompts(tmp_path):
    r = run_node(tmp_path, STEERING)
    base = "/outbox/api/workspaces/w/sessions/s/messages/"
    [accept, edit, move, cancel, stale] = r["calls"]
    assert accept[0:2] == ["POST", base]
    assert (accept[2]["ifBusy"], accept[2]["expiresAfter"]) == ("reject", 30)
    assert edit == ["PATCH", f"{base}e1/", {"text": "better"}, '"41"']
    assert move == ["POST", f"{base}e1/move/", {"to": "next"}, None]
    assert cancel == ["POST", f"{base}e1/cancel/", None, None]
    assert stale[3] == '"1"' and r["err"] == [412, "version_mismatch"]


def test_a_subscription_follows_moves_edits_and_cancels(tmp_path):
    r = run_node(tmp_path, STEERING)
    assert r["before"] == ["e1", "e2", "e3"]
    assert r["asked"] == [{"type": "resync"}] and r["meanwhile"] == ["e1", "e2", "e3"]
    assert r["after"] == ["e3", "e1", "e2"]
    # An edit keeps the row's place and shows its status; a cancelled row has ended.
    assert r["later"] == [
        ["e2", "cancelled", "e2"],
        ["e3", "queued", "e3"],
        ["e1", "queued", "x"],
        ["e4", "queued", "e4"],
    ]
