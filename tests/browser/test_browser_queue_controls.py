"""The demo queue page's controls for steering the queue, in headless Chromium on a live demo
stack (docs/howto/steering.md, docs/howto/cutting.md): a user clicks ↓, Edit, Cancel and
Send now on the rows and sees the queue change, live, without a reload."""

from __future__ import annotations

import uuid

import pytest

from tests.support.browser import DEADLINE, browser_or_skip, start_chrome, text_at
from tests.support.demo import DemoProcess

#: The texts of the rows still in the queue (not ended), in the page's order.
QUEUE_JS = (
    "return [...document.querySelectorAll('#queue li[data-id]')]"
    ".filter(li => !['sent', 'cancelled', 'finished', 'dismissed'].includes(li.dataset.state))"
    ".map(li => li.querySelector('.text, textarea').value ?? li.querySelector('.text').innerText)"
)


def row(text: str) -> str:
    return f'//ol[@id="queue"]/li[@data-id][div[@class="text"][.="{text}"]]'


@pytest.mark.slow
def test_cancel_edit_move_and_send_now_on_the_queue_page(tmp_path):
    browser_or_skip()
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    # A turn that takes a minute: the first prompt stays in flight, the others wait.
    demo = DemoProcess(tmp_path, "--latency", "60").start()
    driver = start_chrome(tmp_path)
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    tag = uuid.uuid4().hex[:6]
    a, b, c, d = (f"{name} {tag}" for name in ("alpha", "bravo", "charlie", "delta"))
    edited = f"delta, edited {tag}"

    def click(xpath: str) -> None:
        """Click the element once it is clickable (the page re-renders every second)."""

        def clicked(drv) -> bool:
            try:
                ec.element_to_be_clickable((By.XPATH, xpath))(drv).click()
            except (StaleElementReferenceException, AttributeError):
                return False
            return True

        wait.until(clicked, message=f"nothing clickable at {xpath}")

    def queue_is(expected: list[str]) -> None:
        wait.until(
            lambda drv: drv.execute_script(QUEUE_JS) == expected,
            message=f"the queue never read {expected}",
        )

    try:
        driver.get(f"{demo.url}/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("demo")
        driver.find_element(By.ID, "id_password").send_keys("demo")
        driver.find_element(By.ID, "login-submit").click()
        prompt = wait.until(ec.element_to_be_clickable((By.ID, "prompt")))
        wait.until(ec.text_to_be_present_in_element((By.ID, "connection"), "live"))
        driver.execute_script("window.__samePage = true;")  # a reload would lose it
        prompt.send_keys(a)
        driver.find_element(By.ID, "send").click()
        wait.until(
            ec.presence_of_element_located((By.XPATH, f'{row(a)}[@data-state="delivering"]'))
        )
        for text in (b, c, d):
            driver.find_element(By.ID, "prompt").send_keys(text)
            driver.find_element(By.ID, "send").click()
            wait.until(
                ec.presence_of_element_located((By.XPATH, f'{row(text)}[@data-state="queued"]'))
            )
        queue_is([a, b, c, d])

        # ↓ on bravo: it goes after charlie, and says it moved.
        click(f'{row(b)}//button[contains(@class, "move-down")]')
        queue_is([a, c, b, d])
        wait.until(ec.presence_of_element_located((By.XPATH, f'{row(b)}[@data-change="moved"]')))

        # Edit delta inline and save: the row shows the new text, marked edited.
        click(f'{row(d)}//button[contains(@class, "edit")]')
        box = wait.until(
            ec.element_to_be_clickable((By.XPATH, '//li[@data-state="editing"]//textarea'))
        )
        box.clear()
        box.send_keys(edited)
        click('//li[@data-state="editing"]//button[.="Save"]')
        queue_is([a, c, b, edited])
        wait.until(
            ec.presence_of_element_located((By.XPATH, f'{row(edited)}[@data-change="edited"]'))
        )

        # Cancel charlie: it ends cancelled, never sent.
        click(f'{row(c)}//button[.="Cancel"]')
        wait.until(ec.presence_of_element_located((By.XPATH, f'{row(c)}[@data-state="cancelled"]')))
        queue_is([a, b, edited])

        # Send now on the edited delta: alpha's turn is cut, delta goes next, before bravo.
        click(f'{row(edited)}//button[.="Send now"]')
        cut = text_at(wait, f'{row(a)}[@data-state="sent"]')
        assert "its turn was cut" in cut, cut
        wait.until(
            ec.presence_of_element_located((By.XPATH, f'{row(edited)}[@data-state="delivering"]'))
        )
        queue_is([edited, b])
        assert not driver.find_element(By.ID, "queue-error").is_displayed()
        assert driver.execute_script("return window.__samePage === true;"), "the page reloaded"

        # The agent got alpha and the edited delta once each; charlie and the old text never.
        driver.find_element(By.ID, "refresh-transcript").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "transcript"), edited))
        lines = driver.execute_script(
            "return [...document.querySelectorAll('#transcript li')].map(li => li.innerText)"
        )
        assert [sum(text in line for line in lines) for text in (a, edited)] == [1, 1], lines
        assert not any(c in line or line.strip() == d for line in lines), lines
    except Exception:
        print(demo.log())
        raise
    finally:
        driver.quit()
        demo.stop()
