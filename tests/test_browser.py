"""The browser side: outbox.js and the demo's queue page.

``test_queue_page_shows_a_prompt_delivered_live`` is the one real browser test: headless
Chromium from Debian (``apt-get install -y chromium chromium-driver``: the binaries
``/usr/bin/chromium`` and ``/usr/bin/chromedriver``) driven by Selenium, on a live demo
stack. Skipped, with the reason printed, when either is missing; it installs nothing.

``test_outbox_js_logic`` runs ``django_outbox/static/django_outbox/outbox.js`` under
Node with a scripted ``fetch``, a fake ``WebSocket`` and an in-memory ``localStorage``:
resends, final refusals, per-session order, resume, versions, gaps and resyncs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from .test_demo import DemoProcess

CHROMIUM = os.environ.get("OUTBOX_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("OUTBOX_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
DEADLINE = 30.0  # seconds for each wait in the browser

OUTBOX_JS = Path(__file__).resolve().parent.parent / "django_outbox/static/django_outbox/outbox.js"

#: The browser's own queue of unacknowledged sends (outbox.js keeps it in localStorage).
PENDING_JS = (
    "return Object.keys(localStorage).filter(k => k.endsWith(':pending'))"
    ".map(k => localStorage.getItem(k));"
)
#: Leave two sends behind as a page killed mid-send would: the first was POSTed (the
#: server stored it) but its answer never arrived, the second never left the browser.
RESUME_SETUP = """
const [textA, textB, done] = arguments;
const page = JSON.parse(document.getElementById("outbox-page").textContent);
const item = (text) => ({workspace: page.workspace, session: page.session, text,
  clientMessageID: crypto.randomUUID(), createdAt: Date.now(), attempts: 0, nextAt: 0,
  lastError: ""});
const a = item(textA), b = item(textB);
const csrf = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).slice(10);
fetch(`${page.apiBase}api/workspaces/${page.workspace}/sessions/${page.session}/messages/`, {
  method: "POST", credentials: "same-origin",
  headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
  body: JSON.stringify({clientMessageID: a.clientMessageID, text: a.text}),
}).then((r) => {
  if (r.status !== 202) throw new Error("setup POST answered " + r.status);
  localStorage.setItem(`django-outbox:${page.userID}:pending`, JSON.stringify([a, b]));
  done();
});
"""


def _browser_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        reason = (
            f"no headless browser: {', '.join(missing)} missing "
            "(apt-get install -y chromium chromium-driver)"
        )
        print(reason)
        pytest.skip(reason)
    return pytest.importorskip("selenium.webdriver", reason="selenium is not installed")


@pytest.mark.slow
def test_queue_page_shows_a_prompt_delivered_live(tmp_path):
    webdriver = _browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "0.5").start()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(
        options=options,
        service=webdriver.ChromeService(
            executable_path=CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")
        ),
    )
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    text = f"browser prompt {uuid.uuid4().hex[:8]} <b>not bold</b>"
    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        driver.execute_script("window.__samePage = true;")  # a reload would lose it

        prompt.send_keys(text)
        driver.find_element(By.ID, "send").click()

        sent = f'//ol[@id="queue"]/li[@data-state="sent"]/div[@class="text"][.="{text}"]'
        wait.until(ec.presence_of_element_located((By.XPATH, sent)))
        assert driver.execute_script("return window.__samePage === true;"), "the page reloaded"
        # The text was rendered as text, not markup.
        assert not driver.find_elements(By.XPATH, '//ol[@id="queue"]//b[.="not bold"]')
        # Nothing is left waiting in the browser's own queue (localStorage).
        pending = driver.execute_script(PENDING_JS)
        assert pending == [], pending
        # And the agent got it exactly once.
        wait.until(ec.text_to_be_present_in_element((By.ID, "transcript"), text))
        lines = transcript_lines(driver)
        assert lines.count(text) == 1, lines

        # The page dies mid-send: prompt A's POST reached the server but its answer was
        # lost, prompt B never left; both sit in localStorage. The reloaded page resends
        # both with their keys: A answers 200 (kept once), B 202.
        lost_reply, never_sent = f"{text} A", f"{text} B"
        driver.execute_async_script(RESUME_SETUP, lost_reply, never_sent)
        driver.refresh()
        sent_b = sent.replace(f'.="{text}"', f'.="{never_sent}"')
        wait.until(ec.presence_of_element_located((By.XPATH, sent_b)))
        wait.until(lambda d: d.execute_script(PENDING_JS) == [])
        driver.find_element(By.ID, "refresh-transcript").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "transcript"), never_sent))
        lines = transcript_lines(driver)
        assert [lines.count(t) for t in (text, lost_reply, never_sent)] == [1, 1, 1], lines
        assert lines.index(lost_reply) < lines.index(never_sent), lines
    except Exception:
        print(demo.log())
        print(driver.get_log("browser") if hasattr(driver, "get_log") else "")
        raise
    finally:
        driver.quit()
        demo.stop()


def transcript_lines(driver):
    """The transcript's lines read in one script call (the list may re-render meanwhile)."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#transcript li')].map(li => li.innerText.trim())"
    )


# -- outbox.js under Node ------------------------------------------------------------------

NODE_SCRIPT = r"""
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
class Storage {
  constructor() { this.m = new Map(); }
  getItem(k) { return this.m.has(k) ? this.m.get(k) : null; }
  setItem(k, v) { this.m.set(k, String(v)); }
  removeItem(k) { this.m.delete(k); }
}
// fetch answering from a script: an Error is thrown (network), else {status, headers, body}.
function scriptedFetch(answers, log) {
  return async (url, init) => {
    const body = init.body ? JSON.parse(init.body) : null;
    log.push({ url, method: init.method, body, csrf: init.headers["X-CSRFToken"] });
    const a = answers.shift();
    if (a === undefined) throw new Error("no more answers");
    if (a instanceof Error) throw a;
    return {
      status: a.status,
      ok: a.status < 300,
      headers: { get: (h) => (a.headers || {})[h] || null },
      json: async () => a.body ?? null,
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
globalThis.location = { protocol: "http:", host: "example.test" };
const { createOutbox, OutboxError } = await import(OUTBOX);
const fast = {
  backoff: { initial: 1, max: 4 },
  reconnect: { initial: 1, max: 2 },
  gapWait: 20,
  csrfToken: "tok",
  storageKey: "k",
  WebSocket: FakeWS,
};
const make = (answers, log, extra = {}) =>
  createOutbox({ ...fast, storage: new Storage(), fetch: scriptedFetch(answers, log), ...extra });

// 1. resent with the same key until 202; in localStorage before the first POST
{
  const storage = new Storage();
  const log = [];
  const answers = [
    new TypeError("network down"),
    { status: 503, headers: { "Retry-After": "0" }, body: { code: "unavailable" } },
    { status: 429, body: { code: "outbox_full" } },
    { status: 408 },
    { status: 202, body: { id: "e1", text: "hi" } },
  ];
  let storedFirst = null;
  const post = scriptedFetch(answers, log);
  const fetch = async (url, init) => {
    storedFirst ??= JSON.parse(storage.getItem("k:pending"))[0].text;
    return post(url, init);
  };
  const ob = createOutbox({ ...fast, storage, fetch, baseURL: "/outbox" });
  const result = await ob.send("w", "ses_1", "hi");
  results.retried = {
    result,
    posts: log.length,
    keys: new Set(log.map((x) => x.body.clientMessageID)).size,
    url: log[0].url,
    csrf: log[0].csrf,
    storedFirst,
    left: storage.getItem("k:pending"),
  };
  ob.close();
}
// 2. another 4xx is final: reported and dropped
{
  const storage = new Storage();
  const log = [];
  const events = [];
  const answers = [{ status: 413, body: { code: "too_large", detail: "big" } }];
  const ob = createOutbox({
    ...fast, storage, fetch: scriptedFetch(answers, log), onEvent: (e) => events.push(e.type),
  });
  let err = null;
  try {
    await ob.send("w", "ses_1", "x");
  } catch (e) {
    err = e;
  }
  results.final = {
    isOutboxError: err instanceof OutboxError,
    status: err.status,
    code: err.code,
    posts: log.length,
    left: storage.getItem("k:pending"),
    events,
  };
  ob.close();
}
// 3. one session's sends go oldest first; another session is not held up
{
  const log = [];
  const ok = (id) => ({ status: 202, body: { id } });
  const ob = make([new TypeError("x"), ok("o"), new TypeError("y"), ok("a"), ok("b")], log);
  await Promise.all([ob.send("w", "s1", "a"), ob.send("w", "s1", "b"), ob.send("w", "s2", "o")]);
  results.fifo = log.filter((x) => x.url.includes("/s1/")).map((x) => x.body.text);
  ob.close();
}
// 4. what a dead page left behind is resent, with its own key, when a page loads
{
  const storage = new Storage();
  const log = [];
  const left = { workspace: "w", session: "s1", text: "left", clientMessageID: "cm-1",
    createdAt: 1, attempts: 3, nextAt: 0, sending: true };
  storage.setItem("k:pending", JSON.stringify([left]));
  const answers = [{ status: 200, body: { id: "e9", duplicate: true } }];
  const ob = createOutbox({ ...fast, storage, fetch: scriptedFetch(answers, log) });
  await until(() => storage.getItem("k:pending") === null);
  results.resume = log.map((x) => x.body.clientMessageID);
  ob.close();
}
// 5. the WebSocket: versions, same-version batches, out-of-order updates, gaps, resync
{
  FakeWS.all = [];
  const views = [];
  const ob = make([], []);
  const sub = ob.subscribe("w", "ses_1", (v) => views.push(v));
  const ws = FakeWS.all[0];
  const e = (id, status, extra = {}) => ({
    id, status, text: id, clientMessageID: "c" + id,
    acceptedAt: `2026-01-01T00:00:0${id.slice(1)}Z`, ...extra,
  });
  const up = (version, state, entry) => ws.frame({ type: "queue.update", version, state, entry });
  const states = () => Object.fromEntries(views.at(-1).entries.map((r) => [r.id, r.state]));
  const backingOff = e("e2", "pending", { attempts: 1, nextAttemptAt: "2026-01-01T00:00:09Z" });
  ws.frame({ type: "queue.snapshot", version: 5, entries: [e("e1", "pending"), backingOff] });
  results.snap = states();
  up(6, "delivering", e("e1", "delivering"));
  results.blocked = views.at(-1).entries.find((r) => r.id === "e2").blockedByInFlight;
  up(6, "queued", e("e3", "pending")); // the same version: one mutation, several entries
  up(4, "error", e("e1", "error")); // stale
  up(8, "delivering", e("e2", "delivering")); // ahead of 7
  results.held = states();
  up(7, "sent", e("e1", "delivering")); // 7 arrives late: 7 then 8 apply
  results.filled = { states: states(), version: views.at(-1).version, resyncs: ws.sent.length };
  up(10, "sent", e("e2", "delivering")); // 9 never comes
  await until(() => ws.sent.length === 1);
  results.resync = ws.sent;
  ws.frame({ type: "queue.snapshot", version: 11, entries: [e("e3", "error")] });
  results.afterResync = { states: states(), version: views.at(-1).version };
  ws.drop(1006);
  await until(() => FakeWS.all.length === 2);
  results.reconnected = FakeWS.all[1].url;
  FakeWS.all[1].drop(4403);
  await sleep(20);
  const last = views.at(-1);
  results.forbidden = {
    sockets: FakeWS.all.length, error: last.error?.code, connected: last.connected,
  };
  sub.close();
  ob.close();
}
// 6. retry and dismiss
{
  const log = [];
  const busy = { status: 409, body: { code: "busy", detail: "busy" } };
  const ob = make([{ status: 200, body: { id: "e1" } }, busy], log);
  const ok = await ob.retry("w", "ses_1", "e1");
  let err = null;
  try {
    await ob.dismiss("w", "ses_1", "e1");
  } catch (e) {
    err = e;
  }
  const calls = log.map((x) => [x.method, x.url, x.csrf]);
  results.ops = { ok, calls, err: [err.status, err.code] };
  ob.close();
}
console.log(JSON.stringify(results));
"""


def test_outbox_js_logic(tmp_path):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    script = tmp_path / "outbox_test.mjs"
    script.write_text(NODE_SCRIPT)
    proc = subprocess.run(
        [node, str(script), OUTBOX_JS.as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    # Network error, 503, 429 and 408 are resent with the same key until the 202.
    assert r["retried"]["result"] == {
        "status": "accepted",
        "id": "e1",
        "entry": {"id": "e1", "text": "hi"},
    }
    assert r["retried"]["posts"] == 5 and r["retried"]["keys"] == 1
    assert r["retried"]["url"] == "/outbox/api/workspaces/w/sessions/ses_1/messages/"
    assert r["retried"]["csrf"] == "tok"
    assert r["retried"]["storedFirst"] == "hi"  # in localStorage before the first POST
    assert r["retried"]["left"] is None
    # Another 4xx is final: reported, dropped, never resent.
    assert r["final"] == {
        "isOutboxError": True,
        "status": 413,
        "code": "too_large",
        "posts": 1,
        "left": None,
        "events": ["queued", "rejected"],
    }
    # One session's sends go oldest first: b waits until a is acknowledged.
    assert r["fifo"] == ["a", "a", "a", "b"]
    # What a dead page left is resent with its own key when a page loads.
    assert r["resume"] == ["cm-1"]
    # Snapshot, then updates by version; same-version batches apply, stale ones do not.
    assert r["snap"] == {"e1": "queued", "e2": "pending"}
    assert r["blocked"] is True
    assert r["held"] == {"e1": "delivering", "e2": "pending", "e3": "queued"}
    # An update ahead of a missing version waits for it; no resync when it turns up.
    assert r["filled"] == {
        "states": {"e1": "sent", "e2": "delivering", "e3": "queued"},
        "version": 8,
        "resyncs": 0,
    }
    # A version that never arrives: one resync, and the fresh snapshot wins.
    assert r["resync"] == [{"type": "resync"}]
    assert r["afterResync"] == {
        "states": {"e1": "sent", "e2": "finished", "e3": "error"},
        "version": 11,
    }
    # Reconnects after a dropped socket, not after 4403.
    assert r["reconnected"] == "ws://example.test/ws/outbox/workspaces/w/sessions/ses_1/"
    assert r["forbidden"] == {"sockets": 2, "error": "forbidden", "connected": False}
    assert r["ops"]["calls"] == [
        ["POST", "/outbox/api/workspaces/w/sessions/ses_1/messages/e1/retry/", "tok"],
        ["DELETE", "/outbox/api/workspaces/w/sessions/ses_1/messages/e1/", "tok"],
    ]
    assert r["ops"]["err"] == [409, "busy"]
