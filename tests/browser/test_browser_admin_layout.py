"""The outbox admin's entry list fits the window on every Django version the package
supports (5.2 lays a changelist out on ``#changelist``, 6.0 on its
``.changelist-form-container``): headless Chromium on a live demo stack, at a desktop and a
laptop width, with long prompts in the list. The list and its filter sit side by side with
no horizontal scroll of the page; a screenshot of each width is kept in the test artifacts
(``build/test-artifacts/django-<version>/``, tests/support/browser.py)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, save_artifact, start_chrome
from tests.support.demo import DemoProcess

pytestmark = pytest.mark.slow

#: The boxes that matter, in CSS pixels, read in one go.
LAYOUT_JS = """
const box = (sel) => {
  const el = document.querySelector(sel);
  if (!el) return null;
  const r = el.getBoundingClientRect();
  return {left: r.left, right: r.right, top: r.top, bottom: r.bottom, width: r.width};
};
return {window: document.documentElement.clientWidth,
        page: document.documentElement.scrollWidth,
        list: box("#changelist-form"), table: box("#result_list"),
        filter: box("#changelist-filter"), toolbar: box("#toolbar")};
"""


def test_the_entry_list_and_its_filter_fit_the_window(tmp_path):
    browser_or_skip()
    import django
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    # The demo's worker delivers within 0.1 s; 120 s of thinking keeps the prompts listed.
    demo = DemoProcess(tmp_path, "--latency", "120").start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.1)
    tag = uuid.uuid4().hex[:8]
    texts = [f"{tag} " + "a rather long prompt that wraps " * 12, f"{tag}-" + "x" * 300]
    version = f"{django.VERSION[0]}.{django.VERSION[1]}"
    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        for text in texts:
            driver.find_element(By.ID, "prompt").send_keys(text)
            driver.find_element(By.ID, "send").click()
        wait.until(lambda d: d.find_element(By.ID, "send-note").text == "accepted")

        driver.delete_all_cookies()
        driver.get(f"{demo.url}/admin/login/?next=/admin/django_outbox/outboxentry/%3Fstatus%3Dall")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("admin")
        driver.find_element(By.ID, "id_password").send_keys("admin")
        driver.find_element(By.CSS_SELECTOR, "[type=submit]").click()
        wait.until(ec.presence_of_element_located((By.ID, "result_list")))
        assert tag in driver.find_element(By.ID, "result_list").text

        for width in (1400, 1100):
            driver.set_window_size(width, 900)
            wait.until(lambda d, w=width: d.execute_script(LAYOUT_JS)["window"] <= w)
            layout = driver.execute_script(LAYOUT_JS)
            shot = save_artifact(driver, f"admin-entry-list-{width}")
            print(f"Django {version}, {width}px: {layout}; screenshot {shot}")
            # Nothing sticks out of the window: no horizontal scroll of the page.
            assert layout["page"] <= layout["window"], layout
            # The filter sits to the right of the list, beside it, not below it.
            list_, filter_ = layout["list"], layout["filter"]
            assert filter_["left"] >= list_["right"] - 1, layout
            assert filter_["top"] < list_["bottom"], layout
            assert filter_["right"] <= layout["window"] + 1, layout
            # The table stays inside its column (its own scroller takes what is left).
            assert layout["table"]["left"] >= list_["left"] - 1, layout
    except Exception:
        print(demo.log())
        raise
    finally:
        driver.quit()
        demo.stop()
