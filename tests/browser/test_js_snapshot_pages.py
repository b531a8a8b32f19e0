"""outbox.js under Node: paged snapshots and the 4429 close (README "Live updates
(WebSocket)"). The same harness as tests/browser/test_browser_logic.py; the real browser test of
a paged snapshot is in tests/browser/test_browser_snapshot_pages.py."""

from __future__ import annotations

from tests.support.node import run_node

PAGES = r"""
{
  FakeWS.all = [];
  const views = [];
  const ob = make([], []);
  const sub = ob.subscribe("w", "s", (v) => views.push(v));
  const ws = FakeWS.all[0];
  const e = (n) => ({ id: "e" + n, status: "pending", text: "t" + n, clientMessageID: "c" + n,
    acceptedAt: `2026-01-01T00:00:0${n}Z` });
  const snap = (version, page, pages, ids) =>
    ws.frame({ type: "queue.snapshot", version, page, pages, entries: ids.map(e) });
  const done = new Set(["finished", "sent", "dismissed"]);
  const ids = () => views.at(-1).entries.filter((r) => !done.has(r.state)).map((r) => r.id);
  snap(5, 1, 3, [1, 2]);
  results.afterFirstPage = { views: views.length };
  ws.frame({ type: "queue.update", version: 6, state: "queued", entry: e(6) }); // mid-snapshot
  snap(5, 2, 3, [3, 4]);
  results.beforeLast = { views: views.length };
  snap(5, 3, 3, [5]);
  results.whole = { ids: ids(), version: views.at(-1).version, connected: views.at(-1).connected };
  // A new snapshot starts before the last one finished: the unfinished set is dropped.
  snap(9, 1, 2, [7]);
  snap(10, 1, 1, [8]);
  results.restarted = { ids: ids(), version: views.at(-1).version };
  // A page that does not follow: the set is dropped and a fresh snapshot asked for.
  snap(11, 1, 3, [9]);
  snap(11, 3, 3, [9]);
  results.broken = { ids: ids(), version: views.at(-1).version, sent: ws.sent };
  // A server that does not page (no page fields) still works.
  ws.frame({ type: "queue.snapshot", version: 12, entries: [e(1)] });
  results.unpaged = { ids: ids(), version: views.at(-1).version };
  // 4429 (too many resyncs) is transient: the client reconnects.
  ws.drop(4429);
  await until(() => FakeWS.all.length === 2);
  results.after4429 = { sockets: FakeWS.all.length, error: views.at(-1).error };
  sub.close();
  ob.close();
}
console.log(JSON.stringify(results));
"""


def test_outbox_js_collects_snapshot_pages_and_reconnects_after_4429(tmp_path):
    r = run_node(tmp_path, PAGES)
    assert r["afterFirstPage"] == {"views": 0}  # nothing shown from a partial snapshot
    assert r["beforeLast"] == {"views": 0}
    # All pages in order, then the update that came meanwhile (version 6).
    assert r["whole"] == {
        "ids": ["e1", "e2", "e3", "e4", "e5", "e6"],
        "version": 6,
        "connected": True,
    }
    assert r["restarted"] == {"ids": ["e8"], "version": 10}
    assert r["broken"]["ids"] == ["e8"] and r["broken"]["version"] == 10
    assert r["broken"]["sent"] == [{"type": "resync"}]
    assert r["unpaged"] == {"ids": ["e1"], "version": 12}
    assert r["after4429"] == {"sockets": 2, "error": None}


MIXED_AND_WAITS = r"""
{
  FakeWS.all = [];
  const views = [];
  const ob = make([], []);
  const sub = ob.subscribe("w", "s", (v) => views.push(v));
  const ws = FakeWS.all[0];
  const e = (n) => ({ id: "e" + n, status: "pending", text: "t" + n, clientMessageID: "c" + n,
    acceptedAt: `2026-01-01T00:00:0${n}Z` });
  ws.frame({ type: "queue.snapshot", version: 20, page: 1, pages: 2, entries: [e(1)] });
  ws.frame({ type: "queue.snapshot", version: 21, page: 2, pages: 2, entries: [e(2)] });
  results.mixed = { views: views.length, sent: ws.sent };
  sub.close();
  ob.close();
}
// How long after a close the socket is reopened, with the given reconnect backoff.
async function reopenAfter(code, reconnect) {
  FakeWS.all = [];
  const ob = make([], [], { reconnect });
  const sub = ob.subscribe("w", "s", () => {});
  const started = Date.now();
  FakeWS.all[0].drop(code);
  await until(() => FakeWS.all.length === 2, 10000);
  const waited = Date.now() - started;
  sub.close();
  ob.close();
  return waited;
}
results.after4429 = await reopenAfter(4429, { initial: 100, max: 10000 });
results.capped = await reopenAfter(4429, { initial: 1000, max: 60 });
console.log(JSON.stringify(results));
"""


def test_outbox_js_drops_pages_of_two_versions_and_waits_longer_after_4429(tmp_path):
    r = run_node(tmp_path, MIXED_AND_WAITS)
    # page 2 of another version does not complete page 1: nothing shown, a resync asked
    assert r["mixed"] == {"views": 0, "sent": [{"type": "resync"}]}
    # 4429: the first reconnect starts at backoff step 3 (100 ms * 4, jittered 50-100 %)
    assert r["after4429"] >= 190
    # and never waits past the backoff's max (60 ms here, not 4 s)
    assert r["capped"] < 1000
