"""outbox.js in headless Chromium when the queue socket is refused (the client side).

A real server (uvicorn, ``tests/support/asgi/close_codes.py``) accepts the socket and closes it
with 4403 (refused) or 4400 (invalid ID), as the README promises: the client stops
reconnecting and sets ``view.error``; ``subscription.reconnect()`` asks once more. A
socket refused *before* it is accepted reaches the browser as close code 1006 (the
handshake got HTTP 403): indistinguishable from a dropped connection, so the client
keeps reconnecting; that is why the server must accept before closing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from example_project.stack import free_port
from tests.support.browser import DEADLINE, browser_or_skip, save_screenshot, start_chrome
from tests.support.demo import stop_group
from tests.support.paths import ROOT
from tests.support.valkey import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    browser_or_skip()
    port = free_port()
    log_path = tmp_path_factory.mktemp("close-codes") / "uvicorn.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "tests.support.asgi.close_codes:app",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--ws",
                "websockets",
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            with urllib.request.urlopen(url + "/connects", timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_until(up, 30, interval=0.1, message="uvicorn serving the close-code app")
        yield url
    finally:
        stop_group(proc)
        print(log_path.read_text("utf-8", errors="replace"))


@pytest.fixture
def driver(tmp_path):
    d = start_chrome(tmp_path)
    yield d
    d.quit()


def connects(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/connects", timeout=5) as response:
        return json.load(response)


def last_view(driver) -> dict | None:
    return driver.execute_script(
        "const v = window.views?.at(-1);"
        "return v ? {connected: v.connected, error: v.error, count: window.views.length} : null;"
    )


@pytest.mark.parametrize(("session", "code"), [("refused", "forbidden"), ("invalid", "invalid")])
def test_a_final_close_code_stops_reconnecting_and_sets_the_error(server, driver, session, code):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{server}/?session={session}")
    wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.05)
    wait.until(lambda d: (last_view(d) or {}).get("error"), "the view's error")
    view = last_view(driver)
    assert view["error"]["code"] == code, view
    assert view["error"]["closeCode"] == {"forbidden": 4403, "invalid": 4400}[code]
    assert view["connected"] is False
    before = connects(server)[session]
    time.sleep(1.5)  # reconnect backoff is 100-200 ms: several tries would have happened
    assert connects(server)[session] == before == 1
    # The page may ask again (e.g. after a login): one more connection, stopped again.
    driver.execute_script("window.subscription.reconnect();")
    wait_until(lambda: connects(server)[session] == 2, 10, message="the reconnect")
    time.sleep(1.0)
    assert connects(server)[session] == 2
    assert last_view(driver)["error"]["code"] == code
    # Becoming visible again (a phone waking) does not reopen a refused socket either.
    driver.execute_script("document.dispatchEvent(new Event('visibilitychange'));")
    time.sleep(0.5)
    assert connects(server)[session] == 2


def test_a_refusal_before_accepting_is_indistinguishable_from_a_drop(server, driver):
    """HTTP 403 on the handshake reaches the page as 1006: the client keeps retrying."""
    driver.get(f"{server}/?session=handshake")
    wait_until(lambda: connects(server).get("handshake", 0) >= 3, 15, message="reconnects")
    assert (last_view(driver) or {}).get("error") is None


def test_a_live_socket_shows_connected(server, driver):
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{server}/?session=live")
    WebDriverWait(driver, DEADLINE).until(lambda d: (last_view(d) or {}).get("connected"))
    save_screenshot(driver, "outbox-close-codes-live")
    assert connects(server)["live"] == 1


def test_acknowledgements_are_sent_and_4408_reconnects_with_a_fresh_snapshot(server, driver):
    """The page echoes every token (a snapshot's, a queue.current's); after 4408 (a socket
    that stayed behind) it reconnects at once and shows the fresh snapshot, no error."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(f"{server}/?session=behind")
    wait_until(lambda: connects(server).get("behind", 0) >= 2, 15, message="the reconnect")
    WebDriverWait(driver, DEADLINE, poll_frequency=0.05).until(
        lambda d: d.execute_script(
            "const v = window.views.at(-1); return v.connected && v.version === 2;"
        )
    )
    assert (last_view(driver) or {}).get("error") is None
    wait_until(lambda: len(received_frames(server)) >= 3, 10, message="the third ack")
    assert received_frames(server) == [
        {"type": "ack", "ack": "s1"},
        {"type": "ack", "ack": "c1"},
        {"type": "ack", "ack": "s2"},
    ]
    assert connects(server)["behind"] == 2


def received_frames(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/received", timeout=5) as response:
        return json.load(response).get("behind", [])
