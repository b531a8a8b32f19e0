"""What the demo queue page shows after a user's own Stop, in headless Chromium on a live
demo stack (docs/howto/cutting.md): the row reads "stopping…" while the cut turn's outcome
is verified, then ends interrupted (the agent had it) or cancelled, and never reads as a
failed delivery at any moment in between (every text the row takes is recorded in the page
as it changes, so no state that lasts a moment is missed)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, start_chrome
from tests.support.demo import DemoProcess

#: Records every text the row of ``arguments[0]`` takes from now on in ``window.__seen``.
RECORD_JS = """
const text = arguments[0];
window.__seen = [];
const look = () => {
  for (const li of document.querySelectorAll('#queue li[data-id]')) {
    const t = li.querySelector('.text');
    if (t && t.innerText === text) {
      const seen = `${li.dataset.state} | ${li.innerText}`;
      if (window.__seen.at(-1) !== seen) window.__seen.push(seen);
    }
  }
};
new MutationObserver(look).observe(document.getElementById('queue'),
  { subtree: true, childList: true, characterData: true, attributes: true });
look();
"""


def row(text: str) -> str:
    return f'//ol[@id="queue"]/li[@data-id][div[@class="text"][.="{text}"]]'


@pytest.mark.slow
def test_after_stop_the_row_reads_stopping_then_interrupted_never_failed(tmp_path):
    browser_or_skip()
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "60").start()  # a turn that runs a minute
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    text = f"stop me {uuid.uuid4().hex[:6]}"

    def clicked(drv) -> bool:
        try:
            ec.element_to_be_clickable((By.XPATH, f'{row(text)}//button[.="Stop"]'))(drv).click()
        except (StaleElementReferenceException, AttributeError):
            return False
        return True

    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        prompt.send_keys(text)
        driver.find_element(By.ID, "send").click()
        wait.until(
            ec.presence_of_element_located((By.XPATH, f'{row(text)}[@data-state="delivering"]'))
        )
        driver.execute_script(RECORD_JS, text)
        wait.until(clicked, message="no Stop button on the prompt in flight")
        ended = wait.until(
            ec.presence_of_element_located(
                (By.XPATH, f'{row(text)}[@data-state="sent" or @data-state="cancelled"]')
            ),
            message="the stopped prompt never ended",
        )
        final = f"{ended.get_attribute('data-state')} | {ended.text}"
        seen = driver.execute_script("return window.__seen;")

        assert any("stopping…" in s for s in seen), seen
        assert not any("fail" in s.lower() or "error" in s.lower() for s in seen), seen
        assert final.startswith("sent") and "interrupted" in final, final
        assert not driver.find_element(By.ID, "queue-error").is_displayed()
    except Exception:
        print(demo.log())
        raise
    finally:
        driver.quit()
        demo.stop()
