"""The browser side: outbox.js and the demo's queue page, in a real browser.

``test_queue_page_shows_a_prompt_delivered_live`` drives headless Chromium from Debian
(``apt-get install -y chromium chromium-driver``: the binaries ``/usr/bin/chromium`` and
``/usr/bin/chromedriver``) with Selenium, on a live demo stack. Skipped, with the reason
printed, when either is missing; it installs nothing (tests/support/browser.py). The other
browser tests: logins and tabs in ``test_browser_tabs.py``, close codes in
``test_browser_close_codes.py``; outbox.js's logic under Node is in ``test_browser_logic.py``.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, start_chrome, text_at
from tests.support.demo import DemoProcess

#: The browser's own queue of unacknowledged sends (outbox.js keeps one localStorage key
#: per prompt: ``<storageKey>:pending:<clientMessageID>``).
PENDING_JS = (
    "return Object.keys(localStorage).filter(k => k.includes(':pending'))"
    ".map(k => localStorage.getItem(k));"
)
#: Leave two sends behind as a page killed mid-send would: the first was POSTed (the
#: server stored it) but its answer never arrived, the second never left the browser.
RESUME_SETUP = """
const [textA, textB, done] = arguments;
const page = JSON.parse(document.getElementById("outbox-page").textContent);
const item = (text, at) => ({workspace: page.workspace, session: page.session, text,
  clientMessageID: crypto.randomUUID(), createdAt: at, user: page.userID});
const a = item(textA, Date.now()), b = item(textB, Date.now() + 1);
const csrf = document.cookie.split("; ").find((c) => c.startsWith("csrftoken=")).slice(10);
fetch(`${page.apiBase}api/workspaces/${page.workspace}/sessions/${page.session}/messages/`, {
  method: "POST", credentials: "same-origin",
  headers: {"Content-Type": "application/json", "X-CSRFToken": csrf},
  body: JSON.stringify({clientMessageID: a.clientMessageID, text: a.text}),
}).then((r) => {
  if (r.status !== 202) throw new Error("setup POST answered " + r.status);
  for (const x of [a, b]) {
    const key = `django-outbox:${page.userID}:pending:${x.clientMessageID}`;
    localStorage.setItem(key, JSON.stringify(x));
  }
  done();
});
"""


@pytest.mark.slow
def test_queue_page_shows_a_prompt_delivered_live(tmp_path):
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "0.5").start()
    driver = start_chrome(tmp_path)
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


@pytest.mark.slow
def test_stop_on_the_queue_page_cuts_the_agent_s_turn(tmp_path):
    """A turn that would take a minute: the user finds Stop on the prompt being delivered,
    clicks it, and the prompt ends sent with its turn cut (verified in the transcript)."""
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "60").start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    text = f"stop me {uuid.uuid4().hex[:8]}"
    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        prompt.send_keys(text)
        driver.find_element(By.ID, "send").click()

        row = f'//ol[@id="queue"]/li[div[@class="text"][.="{text}"]]'
        stop = wait.until(
            ec.element_to_be_clickable(
                (By.XPATH, f'{row}[@data-state="delivering"]//button[.="Stop"]')
            )
        )
        stop.click()
        sent = text_at(wait, f'{row}[@data-state="sent"]')
        assert "its turn was cut" in sent, sent
        assert not driver.find_element(By.ID, "queue-error").is_displayed()
        wait.until(ec.text_to_be_present_in_element((By.ID, "transcript"), text))
        assert transcript_lines(driver).count(text) == 1
    except Exception:
        print(demo.log())
        raise
    finally:
        driver.quit()
        demo.stop()


#: The queue of the page's session as the server has it: ``{text: interrupted}``.
SERVER_QUEUE_JS = """
const [done] = arguments;
const page = JSON.parse(document.getElementById("outbox-page").textContent);
fetch(`${page.apiBase}api/workspaces/${page.workspace}/sessions/${page.session}/messages/`, {
  credentials: "same-origin", headers: {Accept: "application/json"},
}).then((r) => r.json()).then((data) => done(
  Object.fromEntries(data.entries.map((e) => [e.text, Boolean(e.interrupted)]))));
"""


@pytest.mark.slow
def test_a_stop_pressed_as_its_turn_ended_cuts_nothing_on_the_queue_page(tmp_path):
    """A stale Stop on the demo page: a Stop press that lands after the turn it was aimed at
    has ended (its button still on the screen as the next prompt starts) names that
    prompt: the server cuts nothing (409 not_in_flight), the page says so, and the next
    prompt's turn runs on. The press is the first prompt's own Stop button, clicked again
    once the next prompt is being delivered."""
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "60").start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    first, second = (f"{n} {uuid.uuid4().hex[:8]}" for n in ("first", "second"))
    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        for text in (first, second):
            prompt.send_keys(text)
            driver.find_element(By.ID, "send").click()

        def row(text: str) -> str:
            return f'//ol[@id="queue"]/li[div[@class="text"][.="{text}"]]'

        stop = wait.until(
            ec.element_to_be_clickable(
                (By.XPATH, f'{row(first)}[@data-state="delivering"]//button[.="Stop"]')
            )
        )
        driver.execute_script("window.__staleStop = arguments[0];", stop)
        stop.click()  # the first prompt's turn is cut (and verified) ...
        wait.until(
            ec.presence_of_element_located((By.XPATH, f'{row(second)}[@data-state="delivering"]'))
        )
        # ... the second prompt is in flight; a press on the first one's Stop lands now.
        driver.execute_script("window.__staleStop.click();")
        error = wait.until(ec.visibility_of_element_located((By.ID, "queue-error")))
        assert "nothing was cut" in error.text, error.text
        queue = driver.execute_async_script(SERVER_QUEUE_JS)
        assert queue == {second: False}, queue
        detail = text_at(wait, f'{row(second)}[@data-state="delivering"]')
        assert "its turn is being cut" not in detail, detail
    except Exception:
        print(demo.log())
        raise
    finally:
        driver.quit()
        demo.stop()
