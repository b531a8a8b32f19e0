"""outbox.js with a CSRF cookie JavaScript cannot read (``CSRF_COOKIE_HTTPONLY = True``, as
cookiecutter-django sets it), in headless Chromium on the live demo (docs/howto/frontend.md,
"The CSRF token").

- The demo's queue page renders ``{% csrf_token %}`` (its logout form): outbox.js takes the
  token from that input, and a prompt is accepted and delivered.
- A page with no token anywhere: the refused POST is held with code ``csrf_missing``, whose
  detail names the setting and what to render or pass, and the prompt is kept.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, save_screenshot, start_chrome
from tests.support.demo import DemoProcess

pytestmark = pytest.mark.slow

#: A second client on the same page after every token the page rendered is removed: what
#: a page without ``{% csrf_token %}`` gives outbox.js. Resolves with its first hold.
NO_TOKEN_JS = """
const [text, done] = arguments;
const page = JSON.parse(document.getElementById("outbox-page").textContent);
for (const input of document.querySelectorAll("[name=csrfmiddlewaretoken]")) input.remove();
import("/static/django_outbox/outbox.js").then(({ createOutbox }) => {
  const outbox = createOutbox({
    baseURL: page.apiBase, user: page.userID, storageKey: "test-no-token",
    onEvent(event) {
      if (event.type === "held") {
        const kept = Object.keys(localStorage).filter((k) => k.startsWith("test-no-token"));
        done({ hold: event.hold, kept: kept.length });
      }
    },
  });
  outbox.send(page.workspace, page.session, text);
});
"""


def test_an_http_only_csrf_cookie_takes_the_page_token_or_says_what_to_pass(tmp_path):
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "0.2", env={"DEMO_CSRF_COOKIE_HTTPONLY": "1"}).start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    text = f"http-only csrf {uuid.uuid4().hex[:8]}"
    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        # The cookie really is out of JavaScript's reach.
        assert "csrftoken=" not in driver.execute_script("return document.cookie;")

        prompt.send_keys(text)
        driver.find_element(By.ID, "send").click()
        sent = f'//ol[@id="queue"]/li[@data-state="sent"]/div[@class="text"][.="{text}"]'
        wait.until(ec.presence_of_element_located((By.XPATH, sent)))
        assert driver.find_element(By.ID, "queue-hold").get_attribute("hidden") is not None
        save_screenshot(driver, "csrf-http-only-sent")

        seen = driver.execute_async_script(NO_TOKEN_JS, f"{text} without a token")
        assert seen["hold"]["code"] == "csrf_missing", seen
        assert seen["hold"]["status"] == 403, seen
        for words in ("CSRF_COOKIE_HTTPONLY", "{% csrf_token %}", "csrfToken"):
            assert words in seen["hold"]["detail"], seen
        assert seen["kept"] == 1, seen
    except Exception:
        print(demo.log())
        print(driver.get_log("browser") if hasattr(driver, "get_log") else "")
        raise
    finally:
        driver.quit()
        demo.stop()
