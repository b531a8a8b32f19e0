"""The admin dashboard in headless Chromium: on a live demo stack (uvicorn, the
worker, the fake agent, an embedded Valkey), prompts sent from the queue page are charted
from the history the worker writes, and the page refreshes itself. The screenshot is
saved to ``$OUTBOX_TEST_SCREENSHOTS/dashboard.png`` when that is set (the docs' picture)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, save_screenshot, start_chrome
from tests.support.demo import DemoProcess

PROMPTS = 3
#: The tiles as {label: value}, read in one go.
READ_TILES = """
return Object.fromEntries([...document.querySelectorAll(".outbox-tiles div")].map(
  (d) => [d.querySelector("dt").textContent.trim().toLowerCase(),
          d.querySelector("dd").textContent.trim()]));
"""
#: What the assertions need of the charts and tables, read in one go.
READ_CHARTS = """
const sizes = {};
for (const name of ["throughput", "latency", "depth", "overdue"]) {
  const r = document.querySelector(`#chart-${name} svg`).getBoundingClientRect();
  sizes[name] = [r.width, r.height];
}
const line = document.querySelector('#chart-throughput [data-series="delivered"]');
return {sizes, delivered: line ? line.getAttribute("points") : "",
        p50: document.querySelectorAll("#chart-latency .s-p50").length,
        workers: document.getElementById("outbox-workers").textContent};
"""


def login(driver, wait, url: str, username: str, password: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec

    driver.delete_all_cookies()
    driver.get(url)
    wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys(username)
    driver.find_element(By.ID, "id_password").send_keys(password)
    driver.find_element(By.CSS_SELECTOR, "[type=submit]").click()


@pytest.mark.slow
def test_the_dashboard_charts_real_deliveries_and_refreshes(tmp_path):
    browser_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    demo = DemoProcess(tmp_path, "--latency", "0.2").start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.1)
    try:
        login(driver, wait, f"{demo.url}/", "demo", "demo")
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        for n in range(PROMPTS):
            text = f"dashboard prompt {n} {uuid.uuid4().hex[:6]}"
            prompt.send_keys(text)
            driver.find_element(By.ID, "send").click()
            sent = f'//ol[@id="queue"]/li[@data-state="sent"]/div[@class="text"][.="{text}"]'
            wait.until(ec.presence_of_element_located((By.XPATH, sent)))

        # Staff reach it from the queue page's header.
        login(driver, wait, f"{demo.url}/admin/login/?next=/", "admin", "admin")
        wait.until(ec.element_to_be_clickable((By.ID, "dashboard-link"))).click()
        wait.until(ec.presence_of_element_located((By.ID, "chart-throughput")))
        assert driver.title.startswith("Outbox dashboard")

        # The page swaps its body every 10 s: read it in one script, never through
        # element references a refresh may have replaced.
        def delivered_tile(d) -> int:
            tiles = d.execute_script(READ_TILES)
            return int(tiles.get("delivered", "-1").replace(",", ""))

        # The worker writes its counts every 2 s; the page refreshes every 10 s.
        wait.until(lambda d: delivered_tile(d) >= PROMPTS)
        wait.until(
            lambda d: d.find_element(By.ID, "outbox-dashboard").get_attribute("data-refreshed")
        )
        page = driver.execute_script(READ_CHARTS)
        assert delivered_tile(driver) >= PROMPTS

        # Each chart is drawn, at a visible size, with its series.
        for chart in ("throughput", "latency", "depth", "overdue"):
            width, height = page["sizes"][chart]
            assert width > 300 and height > 60, chart
        ys = [float(p.split(",")[1]) for p in page["delivered"].split()]
        assert min(ys) < max(ys), "the delivered line rises above zero somewhere"
        assert page["p50"], "the latency chart has its p50 series"
        assert "ago" in page["workers"]  # the demo's worker, with its heartbeat

        driver.set_window_size(1400, 1300)
        save_screenshot(driver, "dashboard")
        driver.save_screenshot(str(tmp_path / "dashboard.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000

        # The admin session expires: the refresh is redirected to the login page, which
        # must not be swapped into the dashboard; the last reading stays, with a note.
        driver.delete_cookie("sessionid")
        wait.until(
            lambda d: "signed out" in d.find_element(By.CSS_SELECTOR, ".outbox-read-at").text
        )
        box = driver.find_element(By.ID, "outbox-dashboard")
        assert not box.find_elements(By.ID, "id_username")
        assert box.find_elements(By.CSS_SELECTOR, "#chart-throughput svg")
    finally:
        driver.quit()
        demo.stop()
