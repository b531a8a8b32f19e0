"""outbox.js under Node (18+): :func:`run_node` runs a scenario script after ``PRELUDE``,
which gives it a ``fetch`` that answers from the script, a ``WebSocket`` the script drives
and one origin's ``localStorage`` shared by several "tabs" (each with its own window, where
``storage`` events for the other tabs' writes arrive asynchronously, as in a browser)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.paths import OUTBOX_JS

PRELUDE = r"""
const OUTBOX = process.argv[2];
const results = {};
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
async function until(pred, ms = 2000) {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) throw new Error("timeout: " + pred);
    await sleep(1);
  }
}
// One origin's localStorage, shared by tabs. A write fires a "storage" event on the
// *other* tabs' windows, later (a task), like a browser.
class Origin {
  constructor() { this.m = new Map(); this.tabs = []; }
  tab() {
    const tab = { win: new EventTarget(), storage: null };
    tab.storage = new TabStorage(this, tab);
    this.tabs.push(tab);
    return tab;
  }
  notify(from, key, oldValue, newValue) {
    for (const tab of this.tabs) {
      if (tab === from) continue;
      setTimeout(() => {
        const event = new Event("storage");
        Object.assign(event, { key, oldValue, newValue, storageArea: tab.storage });
        tab.win.dispatchEvent(event);
      }, 0);
    }
  }
}
class TabStorage {
  constructor(origin, tab) { this.o = origin; this.tab = tab; }
  get length() { return this.o.m.size; }
  key(i) { return [...this.o.m.keys()][i] ?? null; }
  getItem(k) { return this.o.m.has(k) ? this.o.m.get(k) : null; }
  setItem(k, v) {
    const old = this.getItem(k);
    this.o.m.set(k, String(v));
    this.o.notify(this.tab, k, old, String(v));
  }
  removeItem(k) {
    if (!this.o.m.has(k)) return;
    const old = this.getItem(k);
    this.o.m.delete(k);
    this.o.notify(this.tab, k, old, null);
  }
}
const newStorage = () => new Origin().tab().storage;
// The unacknowledged prompts a storage holds under a prefix (what outbox.js resends).
const pendingIn = (storage, prefix = "k:pending:") => {
  const out = [];
  for (let i = 0; i < storage.length; i++) {
    const k = storage.key(i);
    if (k.startsWith(prefix)) out.push(JSON.parse(storage.getItem(k)));
  }
  return out.filter((x) => !x.outcome);
};
// fetch answering from a script: an Error is thrown (network), "hang" never answers,
// else {status, headers, body} (body "html" makes .json() fail).
function scriptedFetch(answers, log) {
  return async (url, init) => {
    const body = init.body ? JSON.parse(init.body) : null;
    log.push({ url, method: init.method, body, csrf: init.headers["X-CSRFToken"] });
    const a = answers.shift();
    if (a === undefined) throw new Error("no more answers");
    if (a instanceof Error) throw a;
    if (a === "hang") return new Promise(() => {});
    return {
      status: a.status,
      ok: a.status < 300,
      redirected: Boolean(a.redirected),
      headers: { get: (h) => (a.headers || {})[h] || null },
      json: async () => {
        if (a.body === "html") throw new SyntaxError("not JSON");
        return a.body ?? null;
      },
    };
  };
}
class FakeWS {
  static all = [];
  constructor(url) { this.url = url; this.sent = []; this.readyState = 1; FakeWS.all.push(this); }
  send(d) { this.sent.push(JSON.parse(d)); }
  close() { this.readyState = 3; }
  frame(m) { this.onmessage({ data: JSON.stringify(m) }); }
  drop(code) { this.readyState = 3; this.onclose({ code }); }
}
// A promise's state without waiting for it.
function watch(promise) {
  const w = { state: "pending", value: null };
  promise.then(
    (v) => { w.state = "resolved"; w.value = v; },
    (e) => { w.state = "rejected"; w.value = { status: e.status, code: e.code, name: e.name }; },
  );
  return w;
}
globalThis.location = { protocol: "http:", host: "example.test" };
const { createOutbox, OutboxError } = await import(OUTBOX);
const fast = {
  backoff: { initial: 1, max: 4 },
  reconnect: { initial: 1, max: 2 },
  gapWait: 20,
  csrfToken: "tok",
  user: "u1",
  storageKey: "k",
  WebSocket: FakeWS,
  window: new EventTarget(),
  workerCheck: 0, // the scripted answers are the POSTs' (a test of the check turns it on)
};
const make = (answers, log, extra = {}) =>
  createOutbox({ ...fast, storage: newStorage(), fetch: scriptedFetch(answers, log), ...extra });
"""


def run_node(tmp_path: Path, script: str) -> dict:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    path = tmp_path / "outbox_test.mjs"
    path.write_text(PRELUDE + script)
    proc = subprocess.run(
        [node, str(path), OUTBOX_JS.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)
