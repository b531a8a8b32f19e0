"""outbox.js in a real browser across logins and tabs, on a live demo stack.

Headless Chromium driven by Selenium (see ``tests/browser/test_browser.py`` for what it needs).
Each test opens the demo's queue page in one or two tabs of one browser: the tabs share
cookies and localStorage, as a real user's tabs do.

- a login that expired keeps the prompt, says so, and the prompt is sent once the same
  user logs in again (from another tab);
- two tabs sending at once lose nothing, with tab A's copy of localStorage lagging behind
  tab B's writes (how Chromium's per-tab storage cache behaves under load), and both
  ``send()`` promises settle;
- a second user logging in on the same browser never sends the first user's prompt,
  neither from the second user's page nor from the first user's still-open tab; the
  first user's prompt is sent when they log in again.

Each tab's ``fetch`` is wrapped before the page's scripts run (``NET_JS``, installed with
the DevTools command ``Page.addScriptToEvaluateOnNewDocument``): it logs every POST of a
prompt and lets the test take the tab offline or hold the server's answer. Set
``OUTBOX_TEST_SCREENSHOTS=/some/dir`` to keep screenshots of the pages.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, save_screenshot, start_chrome
from tests.support.demo import DemoProcess

pytestmark = pytest.mark.slow

#: Installed in a tab before any page script: wraps fetch to log each POST of a prompt
#: (``window.__net.log``), fail it while the tab is offline (``window.__net.offline`` or
#: ``sessionStorage["test:offline"] === "1"``, which survives navigations of the tab), and
#: hold the server's answer while ``window.__net.hold`` is set (``holdReplies()`` /
#: ``release()``).
NET_JS = r"""
(() => {
  const real = window.fetch.bind(window);
  const net = { log: [], offline: false, hold: null, release: () => {} };
  net.holdReplies = () => {
    net.hold = new Promise((resolve) => {
      net.release = () => { net.hold = null; resolve(); };
    });
  };
  window.__net = net;
  window.fetch = async (url, init = {}) => {
    const post = (init.method || "GET").toUpperCase() === "POST" &&
      /\/outbox\/api\/workspaces\/[^/]+\/sessions\/[^/]+\/messages\/$/.test(String(url));
    if (!post) return real(url, init);
    let body = {};
    try { body = JSON.parse(init.body); } catch {}
    const row = { at: Date.now(), cmid: body.clientMessageID, text: body.text, status: null };
    net.log.push(row);
    if (net.offline || sessionStorage.getItem("test:offline") === "1") {
      row.status = "offline";
      throw new TypeError("Failed to fetch (the test took this tab offline)");
    }
    const response = await real(url, init);
    row.status = response.status;
    if (net.hold) await net.hold;
    return response;
  };
})();
"""

#: The texts of the prompts this browser holds unacknowledged (any user, any layout).
PENDING_TEXTS_JS = """
return Object.keys(localStorage).filter((k) => k.includes(":pending"))
  .flatMap((k) => {
    try { return [JSON.parse(localStorage.getItem(k))].flat(); } catch { return []; }
  })
  .filter((x) => x && !x.outcome).map((x) => x.text);
"""

#: Tab A's view of localStorage stops taking in other tabs' writes (its own still apply):
#: Chromium keeps a per-tab copy of localStorage that learns other tabs' writes
#: asynchronously; this holds that lag open until ``window.__thaw()``.
FREEZE_JS = """
const P = Storage.prototype;
const real = { get: P.getItem, set: P.setItem, remove: P.removeItem, key: P.key,
  length: Object.getOwnPropertyDescriptor(P, "length") };
const view = new Map();
for (let i = 0; i < localStorage.length; i++) {
  const k = localStorage.key(i);
  view.set(k, localStorage.getItem(k));
}
const mine = (s) => s === localStorage;
P.getItem = function (k) {
  if (!mine(this)) return real.get.call(this, k);
  return view.has(k) ? view.get(k) : null;
};
P.setItem = function (k, v) {
  if (mine(this)) view.set(k, String(v));
  return real.set.call(this, k, v);
};
P.removeItem = function (k) {
  if (mine(this)) view.delete(k);
  return real.remove.call(this, k);
};
P.key = function (i) {
  return mine(this) ? ([...view.keys()][i] ?? null) : real.key.call(this, i);
};
Object.defineProperty(P, "length", { configurable: true,
  get() { return mine(this) ? view.size : real.length.get.call(this); } });
window.__thaw = () => {
  Object.assign(P, { getItem: real.get, setItem: real.set, removeItem: real.remove });
  P.key = real.key;
  Object.defineProperty(P, "length", real.length);
};
"""

ACCEPTED_NOTES = ("accepted", "already accepted earlier")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    browser_or_skip()
    process = DemoProcess(tmp_path_factory.mktemp("demo"), "--latency", "0.2").start()
    yield process
    process.stop()


class Browser:
    """One headless Chromium (one profile) and the helpers the tests drive it with."""

    def __init__(self, tmp_path, demo):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait

        self.By = By
        self.demo = demo
        self.driver = start_chrome(tmp_path)
        self.wait = WebDriverWait(self.driver, DEADLINE, poll_frequency=0.05)
        self.tabs: dict[str, str] = {}

    # -- tabs -----------------------------------------------------------------------

    def open_tab(self, name: str, path: str = "/") -> None:
        """Open ``path`` in a new tab called ``name`` (the first one reuses the window)."""
        if self.tabs:
            self.driver.switch_to.new_window("tab")
        self.tabs[name] = self.driver.current_window_handle
        self.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": NET_JS})
        self.driver.get(self.demo.url + path)

    def on(self, name: str) -> Browser:
        if self.driver.current_window_handle != self.tabs[name]:
            self.driver.switch_to.window(self.tabs[name])
        return self

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def until(self, predicate, message: str = ""):
        return self.wait.until(lambda _: predicate(), message)

    # -- the demo's pages ----------------------------------------------------------------

    def log_in(self, username: str, password: str) -> None:
        """On the login page: log in, and wait for the queue page's socket to be live."""
        By = self.By
        self.until(lambda: self.driver.find_elements(By.ID, "id_username"), "the login form")
        self.driver.find_element(By.ID, "id_username").send_keys(username)
        self.driver.find_element(By.ID, "id_password").send_keys(password)
        self.driver.find_element(By.ID, "login-submit").click()
        self.until(lambda: self.driver.find_elements(By.ID, "prompt"), "the queue page")
        self.until(lambda: self.text("connection") == "live", "the queue socket")

    def log_out(self) -> None:
        """On the queue page: the header's "log out" button (a real form POST)."""
        self.driver.find_element(self.By.CSS_SELECTOR, 'form[action$="/logout/"] button').click()
        self.until(lambda: self.driver.find_elements(self.By.ID, "id_username"), "logged out")

    def send(self, text: str) -> None:
        box = self.driver.find_element(self.By.ID, "prompt")
        box.send_keys(text)
        self.driver.find_element(self.By.ID, "send").click()

    def text(self, element_id: str) -> str:
        found = self.driver.find_elements(self.By.ID, element_id)
        return found[0].text.strip() if found else ""

    def shown(self, element_id: str) -> bool:
        found = self.driver.find_elements(self.By.ID, element_id)
        return bool(found) and found[0].is_displayed()

    def row_state(self, text: str) -> str | None:
        """The state of the queue row (server entry or local prompt) showing ``text``."""
        return self.js(
            "const li = [...document.querySelectorAll('#queue li')]"
            ".find((li) => li.querySelector('.text')?.textContent === arguments[0]);"
            "return li ? li.dataset.state : null;",
            text,
        )

    def pending_texts(self) -> list[str]:
        return self.js(PENDING_TEXTS_JS)

    def posts(self, text: str | None = None) -> list[dict]:
        rows = self.js("return window.__net.log;")
        return [r for r in rows if text is None or r["text"] == text]

    def transcript(self) -> list[str]:
        self.driver.find_element(self.By.ID, "refresh-transcript").click()
        time.sleep(0.3)
        return self.js(
            "return [...document.querySelectorAll('#transcript li')].map(li => li.innerText.trim())"
        )

    def quit(self) -> None:
        self.driver.quit()

    def dump(self) -> None:
        print(self.demo.log())
        for name in self.tabs:
            try:
                self.on(name)
                print(name, self.driver.current_url, self.driver.get_log("browser"))
                print(name, "POSTs:", self.js("return window.__net && window.__net.log;"))
                print(name, "localStorage:", self.js("return {...localStorage};"))
            except Exception as exc:  # the dump must not hide the failure
                print(name, "no browser log:", exc)


@pytest.fixture
def browser(tmp_path, demo):
    b = Browser(tmp_path, demo)
    yield b
    b.quit()


def run(browser: Browser, scenario) -> None:
    try:
        scenario()
    except Exception:
        browser.dump()
        raise


def test_a_prompt_survives_an_expired_login_and_is_sent_after_logging_in_again(browser):
    b = browser
    text = f"after the login expired {uuid.uuid4().hex[:8]}"

    def scenario():
        b.open_tab("one")
        b.log_in("demo", "demo")
        b.driver.delete_cookie("sessionid")  # the login expired
        b.send(text)
        b.until(lambda: [r["status"] for r in b.posts(text)] == [403], "the refused POST")
        # Not a verdict on the prompt: it stays in this browser, and the page says why.
        assert b.pending_texts() == [text]
        b.until(lambda: b.shown("queue-hold"), "the login notice")
        assert "log in" in b.text("queue-hold").lower(), b.text("queue-hold")
        assert b.row_state(text) == "held"
        time.sleep(1.5)  # nothing is resent while logged out (it would only be refused)
        assert len(b.posts(text)) == 1, b.posts(text)
        assert b.text("send-note") == ""  # send() has not settled: the prompt is not decided
        save_screenshot(b.driver, "outbox-login-expired")

        # The same user logs in again in another tab: the prompt is sent, once.
        b.open_tab("two")
        b.log_in("demo", "demo")
        b.until(lambda: b.row_state(text) == "sent", "the prompt delivered")
        save_screenshot(b.driver, "outbox-after-login")
        b.on("one")
        b.until(lambda: b.text("send-note") in ACCEPTED_NOTES, "tab one's send() settled")
        b.until(lambda: not b.shown("queue-hold"), "tab one's notice gone")
        assert b.pending_texts() == []
        assert b.on("two").transcript().count(text) == 1

    run(b, scenario)


def test_two_tabs_sending_at_once_lose_nothing(browser):
    b = browser
    tag = uuid.uuid4().hex[:8]
    text_a, text_b = f"tab A {tag}", f"tab B {tag}"

    def scenario():
        b.open_tab("A")
        b.log_in("demo", "demo")
        b.open_tab("B")
        b.until(lambda: b.text("connection") == "live", "tab B's socket")
        b.js("window.__net.offline = true;")  # B cannot answer for A's prompt meanwhile

        # Tab A's storage view lags (it will not see B's prompt) and A's 202 is held.
        b.on("A").js(FREEZE_JS)
        b.js("window.__net.holdReplies();")
        b.send(text_a)
        b.until(lambda: [r["status"] for r in b.posts(text_a)] == [202], "A's POST answered")

        # Tab B, offline, sends while A's answer is on its way.
        b.on("B").until(lambda: text_a in b.pending_texts(), "B sees A's prompt")
        b.send(text_b)
        b.until(lambda: sorted(b.pending_texts()) == sorted([text_a, text_b]), "B's prompt stored")
        b.until(lambda: b.posts(), "B tried to send")

        # A's 202 lands; A tidies its stored prompts from its stale view.
        b.on("A").js("window.__net.release();")
        b.until(lambda: b.text("send-note") in ACCEPTED_NOTES, "A's send() settled")
        b.js("window.__thaw();")

        # B comes back online: its prompt is still there and goes out; its send() settles.
        b.on("B").js("window.__net.offline = false; window.dispatchEvent(new Event('online'));")
        b.until(lambda: b.text("send-note") in ACCEPTED_NOTES, "B's send() settled")
        b.until(lambda: b.row_state(text_b) == "sent", "B's prompt delivered")
        b.until(lambda: b.pending_texts() == [], "nothing left in localStorage")
        lines = b.transcript()
        assert [lines.count(t) for t in (text_a, text_b)] == [1, 1], lines
        assert lines.index(text_a) < lines.index(text_b), lines

    run(b, scenario)


def test_a_second_user_on_the_same_browser_never_sends_the_first_users_prompt(browser):
    b = browser
    tag = uuid.uuid4().hex[:8]
    text_a, text_b = f"user A's prompt {tag}", f"user B's prompt {tag}"

    def scenario():
        # A sends while offline: the prompt waits, unacknowledged, in A's storage.
        b.open_tab("A")
        b.log_in("demo", "demo")
        b.js("window.__net.offline = true;")
        b.send(text_a)
        b.until(lambda: b.posts(text_a), "A's first try")
        assert b.pending_texts() == [text_a]

        # In a second tab (offline too), A logs out and B logs in.
        b.open_tab("second", "/accounts/login/")
        b.js("sessionStorage.setItem('test:offline', '1');")
        b.driver.get(b.demo.url + "/")
        b.until(lambda: b.text("connection") == "live", "A's page in the second tab")
        b.log_out()
        b.js("sessionStorage.removeItem('test:offline');")
        b.log_in("admin", "admin")  # staff: the access policy would accept A's prompt from B
        # B's page does not send A's prompt, or list it.
        b.send(text_b)
        b.until(lambda: b.text("send-note") in ACCEPTED_NOTES, "B's own prompt accepted")
        assert [r["text"] for r in b.posts()] == [text_b]
        assert b.row_state(text_a) is None

        # A's still-open tab, back online, does not resend A's prompt with B's cookie.
        b.on("A")
        switched = b.js("return Date.now();")
        b.js("window.__net.offline = false; window.dispatchEvent(new Event('online'));")
        time.sleep(2.0)
        late = [r for r in b.posts() if r["at"] >= switched]
        assert late == [], late
        assert text_a in b.pending_texts()
        b.until(lambda: b.shown("queue-hold"), "A's tab says another user logged in")
        assert b.text("connection") == "paused"  # no longer watching the queue as A
        save_screenshot(b.driver, "outbox-other-user")
        assert text_a not in b.on("second").transcript()
        assert b.row_state(text_a) is None

        # A logs in again: A's prompt is sent once, and A's first tab's send() settles.
        b.log_out()
        b.log_in("demo", "demo")
        b.until(lambda: b.row_state(text_a) == "sent", "A's prompt delivered")
        b.on("A").until(lambda: b.text("send-note") in ACCEPTED_NOTES, "A's send() settled")
        b.until(lambda: not b.shown("queue-hold"), "A's notice gone")
        b.until(lambda: b.text("connection") == "live", "A's tab watching again")
        lines = b.on("second").transcript()
        assert [lines.count(t) for t in (text_a, text_b)] == [1, 1], lines
        assert b.pending_texts() == []

    run(b, scenario)
