"""Headless Chromium for the browser tests, driven by Selenium: Debian's binaries
(``apt-get install -y chromium chromium-driver``: ``/usr/bin/chromium`` and
``/usr/bin/chromedriver``, or ``OUTBOX_TEST_CHROMIUM`` / ``OUTBOX_TEST_CHROMEDRIVER``). A
test without them is skipped with the reason printed; nothing is installed."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("OUTBOX_TEST_CHROMIUM", "/usr/bin/chromium")


CHROMEDRIVER = os.environ.get("OUTBOX_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")


DEADLINE = 30.0  # seconds for each wait in the browser


def browser_or_skip():
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        reason = (
            f"no headless browser: {', '.join(missing)} missing "
            "(apt-get install -y chromium chromium-driver)"
        )
        print(reason)
        pytest.skip(reason)
    return pytest.importorskip("selenium.webdriver", reason="selenium is not installed")


def start_chrome(tmp_path: Path, name: str = "chromium"):
    """A headless Chromium with its own profile under ``tmp_path / name`` (skips without one).

    Background tabs are not throttled, so a test can drive two tabs of one browser (they
    share cookies and localStorage, as two tabs of a real user do).
    """
    webdriver = browser_or_skip()
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--disable-background-timer-throttling",
        "--disable-renderer-backgrounding",
        "--disable-backgrounding-occluded-windows",
        "--window-size=1400,900",
        f"--user-data-dir={tmp_path / (name + '-profile')}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(
        options=options,
        service=webdriver.ChromeService(
            executable_path=CHROMEDRIVER, log_output=str(tmp_path / f"{name}-chromedriver.log")
        ),
    )


def save_screenshot(driver, name: str) -> None:
    """Save a PNG of the current tab to ``$OUTBOX_TEST_SCREENSHOTS/<name>.png`` when set."""
    folder = os.environ.get("OUTBOX_TEST_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"{name}.png"))


def artifacts_dir() -> Path:
    """Where browser tests keep what CI saves after a run: ``$OUTBOX_TEST_ARTIFACTS`` or
    ``build/test-artifacts/`` under the checkout (git-ignored), one folder per Django
    version (``django-6.0``), so the matrix's runs do not overwrite each other."""
    import django

    from tests.support.paths import ROOT

    base = Path(os.environ.get("OUTBOX_TEST_ARTIFACTS") or ROOT / "build" / "test-artifacts")
    folder = base / f"django-{django.VERSION[0]}.{django.VERSION[1]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def save_artifact(driver, name: str) -> Path:
    """Save a PNG of the current tab as ``<artifacts_dir()>/<name>.png``; return its path."""
    path = artifacts_dir() / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def text_at(wait, xpath: str) -> str:
    """The text of the element at ``xpath`` (found by XPath) once it is there and has
    text, waited for with ``wait`` (a ``WebDriverWait``). The queue page re-renders its
    rows on every update, so an element found may be replaced before its text is read: it
    is then found and read again, instead of failing on a stale reference."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    def read(driver) -> str | bool:
        try:
            return driver.find_element(By.XPATH, xpath).text or False
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    return wait.until(read, message=f"nothing with text at {xpath}")
