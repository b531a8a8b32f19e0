"""outbox.js's side of cutting a turn, under Node (tests/support/node.py): ``stop()`` and
``sendNow()`` call ``interrupt/`` and ``send-now/``, a Stop names the entry it stops, a
refusal throws ``OutboxError``, and a live view ends a ``cancelled`` prompt and resyncs on
a ``moved`` one (docs/howto/cutting.md)."""

from __future__ import annotations

from tests.support.node import run_node

SCENARIO = r"""
{
  FakeWS.all = [];
  const log = [];
  const ob = make(
    [
      { status: 202, body: { result: "cut" } },
      { status: 202, body: { result: "cut" } },
      { status: 409, body: { code: "not_in_flight", detail: "its turn ended" } },
      { status: 409, body: { code: "not_supported", detail: "no aborter" } },
      { status: 200, body: { result: "idle" } },
      { status: 202, body: { result: "cut" } },
      { status: 202, body: { result: "already" } },
      { status: 202, body: { result: "cut" } },
      { status: 409, body: { code: "not_in_flight", detail: "its turn ended" } },
    ],
    log,
  );
  const failure = async (promise) => {
    try { await promise; return null; } catch (e) { return [e.name, e.status, e.code]; }
  };
  const stopped = await ob.stop("w", "ses_1", "e1");
  const now = await ob.sendNow("w", "ses_1", "e.2");
  const gone = await failure(ob.stop("w", "ses_1", "e1"));
  const err = await failure(ob.stop("w", "ses_1"));
  const old = await ob.stop("w", "ses_1"); // the 2-argument call: no entry named
  const sub = ob.subscribe("w", "ses_1", () => {});
  const ws = FakeWS.all[0];
  const e = (id, status) => ({ id, status, text: id, clientMessageID: "c" + id,
    acceptedAt: `2026-01-01T00:00:0${id.slice(1)}Z` });
  const up = (version, state, entry) => ws.frame({ type: "queue.update", version, state, entry });
  const calls = () => log.length;
  const before = calls();
  const nothingShown = await failure(sub.stop()); // no snapshot yet: nothing shown in flight
  const asked = calls() - before;
  ws.frame({ type: "queue.snapshot", version: 1,
    entries: [e("e2", "delivering"), e("e3", "pending")] });
  const viaSub = [await sub.stop()]; // names e2, the one shown delivering
  up(2, "verifying", e("e2", "verifying"));
  viaSub.push(await sub.stop()); // e2, being verified: its turn may still run
  up(3, "sent", e("e2", "verifying"));
  up(4, "delivering", e("e3", "delivering"));
  viaSub.push(await sub.stop()); // e3 now
  up(5, "sent", e("e3", "delivering"));
  const idle = await failure(sub.stop()); // nothing shown in flight: no request
  const named = await failure(sub.stop("e9")); // a name given wins
  results.calls = {
    stopped, now, gone, err, old, nothingShown, asked, viaSub, idle, named,
    log: log.map((x) => [x.method, x.url, x.csrf, x.body]),
  };
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


def test_outbox_js_stops_the_entry_it_shows_sends_now_and_follows_a_cut(tmp_path):
    """``stop(ws, ses, entryID)`` sends ``{"entryID"}`` (a Stop names what it
    stops), the 2-argument call still sends none; a 409 ``not_in_flight`` throws
    ``OutboxError``. ``sub.stop()`` names the entry its view shows in flight (being
    delivered, else being verified) and, with none shown, refuses without a request."""
    r = run_node(tmp_path, SCENARIO)
    calls = r["calls"]
    assert calls["stopped"] == {"result": "cut"} and calls["now"] == {"result": "cut"}
    assert calls["gone"] == ["OutboxError", 409, "not_in_flight"]
    assert calls["err"] == ["OutboxError", 409, "not_supported"]
    assert calls["old"] == {"result": "idle"}
    assert calls["nothingShown"] == ["OutboxError", 0, "not_in_flight"]
    assert calls["asked"] == 0
    assert calls["viaSub"] == [{"result": "cut"}, {"result": "already"}, {"result": "cut"}]
    assert calls["idle"] == ["OutboxError", 0, "not_in_flight"]
    assert calls["named"] == ["OutboxError", 409, "not_in_flight"]
    stop = "/outbox/api/workspaces/w/sessions/ses_1/interrupt/"
    assert calls["log"] == [
        ["POST", stop, "tok", {"entryID": "e1"}],
        ["POST", "/outbox/api/workspaces/w/sessions/ses_1/messages/e.2/send-now/", "tok", None],
        ["POST", stop, "tok", {"entryID": "e1"}],
        ["POST", stop, "tok", None],
        ["POST", stop, "tok", None],
        ["POST", stop, "tok", {"entryID": "e2"}],
        ["POST", stop, "tok", {"entryID": "e2"}],
        ["POST", stop, "tok", {"entryID": "e3"}],
        ["POST", stop, "tok", {"entryID": "e9"}],
    ]
    view = r["view"]
    assert view["entries"] == [["e1", "cancelled"], ["e2", "queued"]]  # the ended one first
    assert view["resyncs"] == 1  # a moved prompt's new place comes with a snapshot


INTERRUPTING_SEND = r"""
{
  const log = [];
  const answers = [
    { status: 202, body: { id: "e1", text: "now", status: "pending", mode: "interrupt" } },
    { status: 409, body: { code: "not_supported", detail: "no aborter is configured" } },
  ];
  const fetch = async (url, init) => {
    log.push([init.method, url, JSON.parse(init.body)]);
    const a = answers.shift() || { status: 500, body: {} };
    return {
      status: a.status, ok: a.status < 300, redirected: false,
      headers: { get: () => null },
      json: async () => a.body,
    };
  };
  const events = [];
  const ob = createOutbox({ ...fast, storage: newStorage(), fetch,
    onEvent: (e) => events.push(e.type) });
  const sent = await ob.send("w", "s", "now", { ifBusy: "interrupt" });
  let refused = null;
  try {
    await ob.send("w", "s", "again", { ifBusy: "interrupt" });
  } catch (e) {
    refused = [e.status, e.code];
  }
  await new Promise((r) => setTimeout(r, 30)); // a resend would come within the backoff
  results.sent = [sent.status, sent.id];
  results.refused = refused;
  results.calls = log.map(([m, u, b]) => [m, u, b.ifBusy, b.text]);
  results.events = events;
  ob.close();
}
console.log(JSON.stringify(results));
process.exit(0);
"""


def test_an_interrupting_send_posts_if_busy_and_a_409_not_supported_is_final(tmp_path):
    r = run_node(tmp_path, INTERRUPTING_SEND)
    base = "/outbox/api/workspaces/w/sessions/s/messages/"
    assert r["sent"][1] == "e1"
    assert r["refused"] == [409, "not_supported"]
    assert r["calls"] == [["POST", base, "interrupt", "now"], ["POST", base, "interrupt", "again"]]
    assert "rejected" in r["events"]
