"""A page that was not connected while its prompts ended says how each ended once it is back,
in headless Chromium on a live demo stack (docs/reference/websocket.md#how-prompts-ended,
docs/howto/frontend.md).

The demo's queue page watches a session; its WebSocket is taken down (a wrapper installed
before the page's scripts closes it and sends every reconnect to a port nothing listens on,
as a dead network would) while, through the REST API, one prompt is delivered by the
worker, one is cancelled and one expires unsent. Back online, the reconnect's snapshot no
longer lists the first two: its record of recent endings says how they ended, so the rows
say delivered and cancelled (not "ended" with no way to tell), and the expired one says
expired.
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from django_outbox.core.entry import parse_time
from tests.support.browser import browser_or_skip, save_screenshot, start_chrome
from tests.support.demo import DemoProcess, worker_pid
from tests.support.valkey import wait_until

pytestmark = pytest.mark.slow

DEADLINE = 60.0

#: Installed before any page script: WebSockets the test can take down. While
#: ``__ws.offline`` is set, every new socket goes to a port nothing listens on (it closes at
#: once); ``__ws.down()`` closes the open ones too.
WS_JS = r"""
(() => {
  const Real = window.WebSocket;
  const net = { offline: false, sockets: [] };
  net.down = () => {
    net.offline = true;
    for (const socket of net.sockets) socket.close();
    net.sockets = [];
  };
  window.__ws = net;
  window.WebSocket = class extends Real {
    constructor(url, protocols) {
      super(net.offline ? "ws://127.0.0.1:9/" : url, protocols);
      net.sockets.push(this);
    }
  };
})();
"""

#: Each queue row's text, state, ending, badge and detail, read in one go.
ROWS_JS = """
return [...document.querySelectorAll('#queue li')].map((li) => ({
  text: li.querySelector('.text')?.textContent, state: li.dataset.state,
  ended: li.dataset.ended || '', badge: li.querySelector('.badge')?.textContent,
  detail: li.querySelector('.detail')?.textContent || ''}));
"""

#: ``fetch`` from the page (its cookies and CSRF token): arguments method, path, body
#: (or null); answers ``{status, body}``.
FETCH_JS = """
const [method, path, body, done] = arguments;
const token = (document.cookie.split('; ').find((c) => c.startsWith('csrftoken=')) || '')
  .slice('csrftoken='.length) || document.querySelector('[name=csrfmiddlewaretoken]')?.value;
fetch(path, {method, credentials: 'same-origin',
  headers: {'Content-Type': 'application/json', 'X-CSRFToken': token || ''},
  body: body === null ? undefined : JSON.stringify(body)})
  .then(async (r) => done({status: r.status, body: await r.json().catch(() => null)}))
  .catch((e) => done({status: 0, body: String(e)}));
"""


def test_a_page_back_online_says_how_each_prompt_ended_while_it_was_away(tmp_path):
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "0.2").start()
    driver = start_chrome(tmp_path)
    driver.set_script_timeout(DEADLINE)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WS_JS})
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.1)
    tag = uuid.uuid4().hex[:8]
    texts = {"sent": f"sent {tag}", "dropped": f"dropped {tag}", "late": f"late {tag}"}
    frozen = None

    def rows():
        return {r["text"]: r for r in driver.execute_script(ROWS_JS)}

    def call(method, path, body=None):
        return driver.execute_async_script(FETCH_JS, method, path, body)

    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        page = driver.execute_script(
            "return JSON.parse(document.getElementById('outbox-page').textContent)"
        )
        messages = (
            f"{page['apiBase']}api/workspaces/{page['workspace']}"
            f"/sessions/{page['session']}/messages/"
        )

        # The worker stops (its process stays), so the three wait in the queue.
        frozen = worker_pid(demo.proc.pid)
        os.kill(frozen, signal.SIGSTOP)
        ids = {}
        for name, extra in (("sent", {}), ("dropped", {}), ("late", {"expiresAfter": 2})):
            body = {"clientMessageID": f"{name}-{tag}", "text": texts[name], **extra}
            answer = call("POST", messages, body)
            assert answer["status"] == 202, answer
            ids[name] = answer["body"]["id"]
        expires_at = parse_time(answer["body"]["expiresAt"]) / 1e6
        wait.until(
            lambda _: (
                {t: r["state"] for t, r in rows().items() if t in texts.values()}
                == dict.fromkeys(texts.values(), "queued")
            )
        )

        # The page goes offline; meanwhile one prompt is cancelled, one delivered and one
        # expires (the worker, thawed once the last one's time has passed, finds it late).
        driver.execute_script("window.__ws.down()")
        wait.until(lambda d: d.find_element(By.ID, "connection").text != "live")
        assert call("POST", f"{messages}{ids['dropped']}/cancel/")["status"] == 204
        wait_until(lambda: time.time() > expires_at + 0.5, DEADLINE, 0.1, "the prompt's expiry")
        os.kill(frozen, signal.SIGCONT)
        frozen = None

        def stored():
            return {e["id"]: e["status"] for e in call("GET", messages)["body"]["entries"]}

        wait_until(lambda: stored() == {ids["late"]: "expired"}, DEADLINE, 0.2, "the endings")
        assert rows()[texts["sent"]]["state"] == "queued"  # the page has heard nothing yet

        driver.execute_script(
            "window.__ws.offline = false; document.dispatchEvent(new Event('visibilitychange'));"
        )
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        wait.until(lambda _: rows()[texts["sent"]]["state"] != "queued")
        shown = rows()
        save_screenshot(driver, "queue-endings-after-reconnect")
        got = {name: (shown[text]["ended"], shown[text]["badge"]) for name, text in texts.items()}
        assert got == {
            "sent": ("delivered", "delivered"),
            "dropped": ("cancelled", "cancelled (never sent)"),
            "late": ("expired", "expired (never sent)"),
        }
        for name in ("sent", "dropped"):
            assert "while this page was not connected" in shown[texts[name]]["detail"]
    except Exception:
        print(demo.log())
        raise
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        driver.quit()
        demo.stop()
