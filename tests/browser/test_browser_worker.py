"""The demo's queue page says when no worker is alive and how each prompt ended, in
headless Chromium on a live demo stack (docs/howto/frontend.md, "Is a worker running?").

The demo's worker is frozen (SIGSTOP: its process stays, its heartbeat stops, as a worker
that hangs or a host that sleeps): within the heartbeat's 15 s and one check the page says
no worker is running and how many prompts wait; a prompt cancelled meanwhile (its
Cancel button: a waiting prompt is never sent) says it ended cancelled. Thawed (SIGCONT),
the worker beats again, the notice goes, and the waiting prompt ends delivered.
"""

from __future__ import annotations

import os
import signal
import uuid

import pytest

from tests.support.browser import browser_or_skip, save_screenshot, start_chrome
from tests.support.demo import DemoProcess, worker_pid

pytestmark = pytest.mark.slow

#: The heartbeat's TTL (15 s) plus one check of the page (10 s), with room.
NOTICE_DEADLINE = 60.0

#: Each queue row's text, state and ending, read in one go.
ROWS_JS = """
return [...document.querySelectorAll('#queue li')].map((li) => ({
  text: li.querySelector('.text')?.textContent, state: li.dataset.state,
  ended: li.dataset.ended || '', badge: li.querySelector('.badge')?.textContent}));
"""


def test_the_page_says_no_worker_is_running_and_how_each_prompt_ended(tmp_path):
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "0.2").start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, NOTICE_DEADLINE, poll_frequency=0.1)
    tag = uuid.uuid4().hex[:8]
    waits, dropped = f"waits {tag}", f"dropped {tag}"
    frozen = None

    def rows():
        return {r["text"]: r for r in driver.execute_script(ROWS_JS)}

    def send(text):
        driver.find_element(By.ID, "prompt").send_keys(text)
        driver.find_element(By.ID, "send").click()

    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        # The demo's worker may not have beaten yet when the page first asks: then the
        # page says so, and stops saying it at its next check.
        wait.until(lambda d: not d.find_element(By.ID, "worker-status").is_displayed())

        frozen = worker_pid(demo.proc.pid)
        os.kill(frozen, signal.SIGSTOP)
        send(waits)
        send(dropped)
        wait.until(lambda _: {waits, dropped} <= set(rows()))
        wait.until(lambda _: driver.find_element(By.ID, "worker-status").is_displayed())
        notice = driver.find_element(By.ID, "worker-status").text
        assert notice.startswith("No worker is running"), notice
        assert "2 prompt(s) wait" in notice and "outbox_worker" in notice, notice
        assert rows()[waits]["state"] == "queued"

        row = driver.find_element(By.XPATH, f'//ol[@id="queue"]/li[div[@class="text"]="{dropped}"]')
        row.find_element(By.CSS_SELECTOR, "button.cancel").click()
        wait.until(lambda _: rows()[dropped]["ended"] == "cancelled")
        assert rows()[dropped]["badge"] == "cancelled (never sent)"
        save_screenshot(driver, "queue-no-worker")

        os.kill(frozen, signal.SIGCONT)
        frozen = None
        wait.until(lambda _: rows()[waits]["ended"] == "delivered")
        assert rows()[waits]["badge"] == "delivered"
        wait.until(lambda _: not driver.find_element(By.ID, "worker-status").is_displayed())
    except Exception:
        print(demo.log())
        print(driver.get_log("browser") if hasattr(driver, "get_log") else "")
        raise
    finally:
        if frozen is not None:
            os.kill(frozen, signal.SIGCONT)
        driver.quit()
        demo.stop()
