"""outbox.js in headless Chromium never builds a URL from an unchecked ID (an ID of ".." had turned
a dismiss into DELETE of the workspace).

``dismiss("wsZ", "..", "..")`` once fetched ``DELETE .../workspaces/wsZ/sessions/../
messages/../``, which the browser normalised to ``DELETE /outbox/api/workspaces/wsZ/``: a
workspace cleanup. Every method of the client now checks each workspace, session and entry
ID against the server's rule (``IDENTIFIER_RE`` in django_outbox/core/rules.py) before it
builds a URL, and refuses with ``OutboxError`` ``invalid_identifier`` (status 0) and no
request: a rejected promise, or a throw from ``subscribe()``.

The page and outbox.js are served by a small HTTP server in this module that records every
request it receives (a WebSocket handshake included). In the page, ``window.fetch`` and
``window.WebSocket`` are wrapped to record each call as outbox.js makes it. Each test calls
one method with each bad ID in each position, then once with good IDs as a control, which
must reach the server with the URL expected.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, start_chrome
from tests.support.paths import OUTBOX_JS

pytestmark = pytest.mark.slow

PAGE = b"""<!doctype html>
<meta charset="utf-8"><title>outbox.js IDs</title><link rel="icon" href="data:,">
<script type="module">
import * as client from "/static/outbox.js";
window.client = client;
</script>
"""

#: IDs the server's rule refuses, each of which must make no request (JSON values; the
#: page adds ``undefined``). ``%2e%2e`` and ``..%2f`` are what a page may get decoded once.
BAD_IDS = [
    "..",
    ".",
    "../..",
    "a/b",
    "/",
    "",
    "x" * 129,
    "%2e%2e",
    "..%2f",
    "%2F",
    ".x",
    "-x",
    "_x",
    "a b",
    "a?b",
    "a#b",
    "a\\b",
    "ok\n",
    "é",
    None,
    7,
    ["a"],
]


class Recorder(BaseHTTPRequestHandler):
    """Serves the page and outbox.js; records and answers every other request."""

    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def _answer(self) -> None:
        if self.command == "GET" and self.path == "/":
            self._send(200, "text/html", PAGE)
            return
        if self.command == "GET" and self.path == "/static/outbox.js":
            self._send(200, "text/javascript", OUTBOX_JS.read_bytes())
            return
        if self.command == "GET" and self.path == "/favicon.ico":  # the browser's own
            self._send(404, "text/plain", b"")
            return
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.lock:
            self.seen.append((self.command, self.path))
        body = {"id": "e1", "text": "t", "status": "pending", "result": "idle", "alive": True}
        self._send(202 if self.command == "POST" else 200, "application/json", json.dumps(body))

    def _send(self, status: int, kind: str, body: bytes | str) -> None:
        data = body.encode() if isinstance(body, str) else body
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = _answer


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    browser_or_skip()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def driver(server, tmp_path_factory):
    d = start_chrome(tmp_path_factory.mktemp("ids-browser"))
    yield d
    d.quit()


#: The calls of each method with (workspace, session, entry) in its place: ``ob`` the
#: client, ``sub`` a subscription to wsZ/s1 made before (its calls take the entry only).
#: ``cancel`` and ``stop`` with three arguments are the server's cancel and a Stop that
#: names its entry (an undefined third argument included).
CALLS = r"""
const CALLS = {
  retry: (ob, sub, w, s, e) => ob.retry(w, s, e),
  dismiss: (ob, sub, w, s, e) => ob.dismiss(w, s, e),
  edit: (ob, sub, w, s, e) => ob.edit(w, s, e, { text: "new" }),
  move: (ob, sub, w, s, e) => ob.move(w, s, e, { to: "last" }),
  "move before": (ob, sub, w, s, e) => ob.move(w, s, "e1", { before: e }),
  cancel: (ob, sub, w, s, e) => ob.cancel(w, s, e),
  stop: (ob, sub, w, s, e) => ob.stop(w, s, e),
  "stop without an entry": (ob, sub, w, s, e) => ob.stop(w, s),
  sendNow: (ob, sub, w, s, e) => ob.sendNow(w, s, e),
  send: (ob, sub, w, s, e) => ob.send(w, s, "hello"),
  subscribe: (ob, sub, w, s, e) => ob.subscribe(w, s, () => {}),
  "sub.retry": (ob, sub, w, s, e) => sub.retry(e),
  "sub.dismiss": (ob, sub, w, s, e) => sub.dismiss(e),
  "sub.edit": (ob, sub, w, s, e) => sub.edit(e, { text: "new" }),
  "sub.move": (ob, sub, w, s, e) => sub.move(e, { to: "last" }),
  "sub.cancel": (ob, sub, w, s, e) => sub.cancel(e),
  "sub.stop": (ob, sub, w, s, e) => sub.stop(e),
  "sub.sendNow": (ob, sub, w, s, e) => sub.sendNow(e),
};
"""

#: Which of (workspace, session, entry) each method takes from its arguments.
POSITIONS = {
    "retry": ("workspace", "session", "entry"),
    "dismiss": ("workspace", "session", "entry"),
    "edit": ("workspace", "session", "entry"),
    "move": ("workspace", "session", "entry"),
    "move before": ("entry",),
    "cancel": ("workspace", "session", "entry"),
    "stop": ("workspace", "session", "entry"),
    "stop without an entry": ("workspace", "session"),
    "sendNow": ("workspace", "session", "entry"),
    "send": ("workspace", "session"),
    "subscribe": ("workspace", "session"),
    "sub.retry": ("entry",),
    "sub.dismiss": ("entry",),
    "sub.edit": ("entry",),
    "sub.move": ("entry",),
    "sub.cancel": ("entry",),
    "sub.stop": ("entry",),
    "sub.sendNow": ("entry",),
}

API = "/outbox/api/workspaces/wsZ/sessions/s1/"
#: The request each method makes with good IDs (wsZ, s1, e1): the control.
CONTROL = {
    "retry": ("POST", f"{API}messages/e1/retry/"),
    "dismiss": ("DELETE", f"{API}messages/e1/"),
    "edit": ("PATCH", f"{API}messages/e1/"),
    "move": ("POST", f"{API}messages/e1/move/"),
    "move before": ("POST", f"{API}messages/e1/move/"),
    "cancel": ("POST", f"{API}messages/e1/cancel/"),
    "stop": ("POST", f"{API}interrupt/"),
    "stop without an entry": ("POST", f"{API}interrupt/"),
    "sendNow": ("POST", f"{API}messages/e1/send-now/"),
    "send": ("POST", f"{API}messages/"),
    "subscribe": ("GET", "/ws/outbox/workspaces/wsZ/sessions/s1/"),
    "sub.retry": ("POST", f"{API}messages/e1/retry/"),
    "sub.dismiss": ("DELETE", f"{API}messages/e1/"),
    "sub.edit": ("PATCH", f"{API}messages/e1/"),
    "sub.move": ("POST", f"{API}messages/e1/move/"),
    "sub.cancel": ("POST", f"{API}messages/e1/cancel/"),
    "sub.stop": ("POST", f"{API}interrupt/"),
    "sub.sendNow": ("POST", f"{API}messages/e1/send-now/"),
}

SCRIPT = (
    CALLS
    + r"""
const [method, positions, bad, done] = arguments;
(async () => {
  const requests = []; // every fetch and WebSocket outbox.js starts, as it starts it
  const realFetch = window.fetch.bind(window);
  window.fetch = (url, init) => {
    requests.push([init?.method || "GET", String(url)]);
    return realFetch(url, init);
  };
  const RealWebSocket = window.WebSocket;
  window.WebSocket = class extends RealWebSocket {
    constructor(url, ...rest) {
      requests.push(["WEBSOCKET", String(url)]);
      super(url, ...rest);
    }
  };
  const events = [];
  const ob = window.client.createOutbox({
    user: "u1", csrfToken: "tok", baseURL: "/outbox/", storageKey: `ids-${method}`,
    workerCheck: 0, reconnect: { initial: 600000, max: 600000 },
    onEvent: (event) => { if (event.type === "rejected") events.push(event.error?.code); },
  });
  // A subscription for the sub.* methods (its own socket comes first).
  const sub = method.startsWith("sub.") ? ob.subscribe("wsZ", "s1", () => {}) : null;
  const setup = requests.length;
  const good = { workspace: "wsZ", session: "s1", entry: "e1" };
  const outcomes = [];
  for (const position of positions) {
    for (const value of [...bad, undefined]) {
      const ids = { ...good, [position]: value };
      let out;
      try {
        const returned = CALLS[method](ob, sub, ids.workspace, ids.session, ids.entry);
        try {
          await returned;
          out = { how: "resolved" };
        } catch (e) {
          out = { how: "rejected", name: e.name, code: e.code, status: e.status };
        }
      } catch (e) {
        out = { how: "threw", name: e.name, code: e.code, status: e.status };
      }
      outcomes.push({ position, value: value === undefined ? "(undefined)" : value, ...out });
    }
  }
  const made = requests.slice(setup);
  const stored = Object.keys(localStorage).filter((k) => k.startsWith(`ids-${method}:pending:`));
  // The control: good IDs make the request they should.
  let control;
  try {
    await CALLS[method](ob, sub, "wsZ", "s1", "e1");
    control = "ok";
  } catch (e) {
    control = `${e.name} ${e.code} ${e.message}`;
  }
  return { outcomes, made, stored, events, control, controlRequests: requests.slice(setup) };
})().then(done, (e) => done({ crash: String(e && e.stack || e) }));
"""
)


def open_page(driver, server: str) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{server}/")
    WebDriverWait(driver, DEADLINE, poll_frequency=0.05).until(
        lambda d: d.execute_script("return Boolean(window.client);"), "outbox.js loaded"
    )


def seen_since(start: int) -> list[tuple[str, str]]:
    with Recorder.lock:
        return list(Recorder.seen[start:])


@pytest.mark.parametrize("method", list(POSITIONS))
def test_no_request_is_made_for_an_id_the_server_would_refuse(server, driver, method):
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(driver, server)
    start = len(Recorder.seen)
    driver.set_script_timeout(DEADLINE)
    result = driver.execute_async_script(SCRIPT, method, list(POSITIONS[method]), BAD_IDS)
    assert "crash" not in result, result.get("crash")

    # Every bad ID in every position: refused with invalid_identifier, nothing requested.
    how = "threw" if method == "subscribe" else "rejected"
    refusal = {"how": how, "name": "OutboxError", "code": "invalid_identifier", "status": 0}
    wrong = [o for o in result["outcomes"] if {k: o.get(k) for k in refusal} != refusal]
    assert not wrong, wrong
    assert len(result["outcomes"]) == len(POSITIONS[method]) * (len(BAD_IDS) + 1)
    assert result["made"] == [], result["made"]
    if method == "send":  # never stored, each reported as a rejected send
        assert result["stored"] == []
        assert result["events"] == ["invalid_identifier"] * len(result["outcomes"])

    # The control reaches the server; nothing else of the page's calls did.
    assert result["control"] == "ok" or method == "subscribe", result["control"]
    expected = CONTROL[method]
    WebDriverWait(driver, DEADLINE, poll_frequency=0.05).until(
        lambda d: expected in seen_since(start), f"the control request {expected}"
    )
    setup_socket = ("GET", "/ws/outbox/workspaces/wsZ/sessions/s1/")
    assert [r for r in seen_since(start) if r not in (expected, setup_socket)] == []
    kind = "WEBSOCKET" if method == "subscribe" else expected[0]
    assert [r[0] for r in result["controlRequests"]] == [kind]


RESUMED = r"""
const [done] = arguments;
const requests = [];
const realFetch = window.fetch.bind(window);
window.fetch = (url, init) => {
  requests.push([init?.method || "GET", String(url)]);
  return realFetch(url, init);
};
const prefix = "ids-resume:pending:";
for (const [n, workspace, session] of [[1, "wsZ", ".."], [2, "..", "s1"], [3, "wsZ", "a/b"]]) {
  const item = { workspace, session, text: `left ${n}`, clientMessageID: `left-${n}`,
    createdAt: n, user: "u1" };
  localStorage.setItem(prefix + item.clientMessageID, JSON.stringify(item));
}
const events = [];
const ob = window.client.createOutbox({
  user: "u1", csrfToken: "tok", baseURL: "/outbox/", storageKey: "ids-resume", workerCheck: 0,
  onEvent: (event) => { if (event.type === "rejected") events.push(event.error?.code); },
});
const left = Object.keys(localStorage).filter((k) => k.startsWith(prefix));
ob.close();
done({ requests, events, left });
"""


def test_prompts_left_in_storage_with_bad_ids_are_refused_not_sent(server, driver):
    """A prompt that an earlier version (or another page) left in localStorage with an ID
    the server refuses is reported as rejected and removed when the client starts; it is
    never POSTed."""
    open_page(driver, server)
    start = len(Recorder.seen)
    result = driver.execute_async_script(RESUMED)
    assert result["requests"] == []
    assert result["events"] == ["invalid_identifier"] * 3
    assert result["left"] == []
    assert seen_since(start) == []


def test_the_reported_dismiss_makes_no_request(server, driver):
    """The case as reported: ``dismiss("wsZ", "..", "..")`` is refused before any URL
    exists; the browser never sends ``DELETE /outbox/api/workspaces/wsZ/``."""
    open_page(driver, server)
    start = len(Recorder.seen)
    result = driver.execute_async_script(
        """
        const [done] = arguments;
        const ob = window.client.createOutbox({ user: "u1", csrfToken: "tok",
          baseURL: "/outbox/", storageKey: "ids-case", workerCheck: 0 });
        ob.dismiss("wsZ", "..", "..").then(
          () => done({ resolved: true }),
          (e) => done({ name: e.name, code: e.code, status: e.status, detail: e.detail }),
        );
        """
    )
    driver.execute_async_script(
        "const [done] = arguments; fetch('/outbox/api/marker/').then(() => done());"
    )
    # What the browser sent (before the fix: DELETE /outbox/api/workspaces/wsZ/).
    assert seen_since(start) == [("GET", "/outbox/api/marker/")]
    assert (result["name"], result["code"], result["status"]) == (
        "OutboxError",
        "invalid_identifier",
        0,
    ), result
    assert 'Invalid session ID ".."' in result["detail"]
    assert "No request was made" in result["detail"]
