"""outbox.js in headless Chromium against the real consumer under uvicorn.

The page of ``tests/support/asgi/close_codes.py``, served by
``tests/support/asgi/refusals.py`` with the real
:class:`~django_outbox.ws.consumer.OutboxConsumer` behind the logging origin validator: a
refusal reaches the browser as 4403 (not 1006), so the client stops and says why (an
invalid ID never reaches the consumer: outbox.js refuses it first);
4429 (too many sockets for the user) is transient: the client keeps trying, with backoff,
and connects once a socket of the user closes.
"""

from __future__ import annotations

import asyncio

import pytest
from websockets.asyncio.client import connect

from tests.support.browser import DEADLINE, browser_or_skip, start_chrome
from tests.support.refusals_server import MAX_SOCKETS, asgi_server, open_sockets, path

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(valkey, tmp_path_factory):
    browser_or_skip()
    log = tmp_path_factory.mktemp("ws-wire-browser") / "uvicorn.log"
    with asgi_server("uvicorn", valkey, log) as address:
        yield f"http://{address}", log


@pytest.fixture
def driver(tmp_path):
    d = start_chrome(tmp_path)
    yield d
    d.quit()


def last_view(driver) -> dict:
    return driver.execute_script(
        "const v = window.views?.at(-1);"
        "return v ? {connected: v.connected, error: v.error, count: window.views.length} : {};"
    )


def open_page(driver, url: str, session: str, user: str | None = None) -> None:
    driver.get(f"{url}/?session=none")  # a page of the origin, to set its cookie
    if user is not None:
        driver.add_cookie({"name": "user", "value": user, "path": "/"})
    driver.get(f"{url}/?session={session}")


@pytest.mark.parametrize(
    ("session", "user", "code", "close_code"), [("s1", "alice", "forbidden", 4403)]
)
def test_the_real_consumer_s_refusals_stop_the_client(
    server, driver, session, user, code, close_code
):
    from selenium.webdriver.support.ui import WebDriverWait

    url, _ = server
    open_page(driver, url, session, user)
    WebDriverWait(driver, DEADLINE, poll_frequency=0.05).until(
        lambda d: last_view(d).get("error"), "the view's error"
    )
    view = last_view(driver)
    assert view["error"]["code"] == code and view["error"]["closeCode"] == close_code, view
    assert view["connected"] is False


def test_an_id_the_consumer_would_refuse_is_refused_by_the_client_without_a_socket(server, driver):
    """Session ``-x`` breaks the ID rule: the real consumer would close its socket with
    4400 (tests/django/ws), but outbox.js checks the ID first (an ID of ".." had turned a dismiss
    into DELETE of the workspace): ``subscribe()``
    throws ``OutboxError`` ``invalid_identifier`` and no socket is opened."""
    from selenium.webdriver.support.ui import WebDriverWait

    url, log = server
    open_page(driver, url, "-x", "ws1")
    refused = WebDriverWait(driver, DEADLINE, poll_frequency=0.05).until(
        lambda d: d.execute_script("return window.refused;"), "subscribe() refused"
    )
    assert refused == {"name": "OutboxError", "code": "invalid_identifier", "status": 0}
    assert driver.execute_script("return [window.subscription, window.views.length];") == [
        None,
        0,
    ]
    assert "/sessions/-x/" not in log.read_text(errors="replace")


def test_too_many_sockets_is_transient(server, driver, valkey):
    from selenium.webdriver.support.ui import WebDriverWait

    url, log = server
    address = url.removeprefix("http://")

    async def hold_then_release() -> None:
        held = []
        for i in range(MAX_SOCKETS):
            ws = await connect(
                f"ws://{address}{path('ws1', f'h{i}')}",
                origin=url,
                additional_headers={"Cookie": "user=ws1"},
            )
            await ws.recv()
            held.append(ws)
        assert open_sockets(valkey, "ws1") == MAX_SOCKETS
        await asyncio.to_thread(open_page, driver, url, "s1", "ws1")
        # The page is refused with 4429 several times, and keeps trying without an error.
        deadline = asyncio.get_running_loop().time() + DEADLINE
        while log.read_text().count("closed with 4429") < 3:
            assert asyncio.get_running_loop().time() < deadline, log.read_text()
            await asyncio.sleep(0.05)
        view = await asyncio.to_thread(last_view, driver)
        assert view.get("error") is None and not view.get("connected"), view
        await held.pop().close()
        try:
            await asyncio.to_thread(
                WebDriverWait(driver, DEADLINE, poll_frequency=0.05).until,
                lambda d: last_view(d).get("connected"),
                "connected once a socket closed",
            )
        finally:
            for ws in held:
                await ws.close()

    asyncio.run(hold_then_release())
