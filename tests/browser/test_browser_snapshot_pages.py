"""outbox.js in headless Chromium receives a snapshot in pages (README "Live updates
(WebSocket)"): twelve full-size prompts (1.2 MB of text) come from the real consumer
under uvicorn as pages of at most ``WS_MAX_FRAME_BYTES`` (768 KiB), and the page shows
all twelve, in order, once the last page arrived."""

from __future__ import annotations

import pytest

from django_outbox.outbox import Outbox
from tests.support.browser import DEADLINE, browser_or_skip, save_screenshot, start_chrome
from tests.support.live_server import serve

pytestmark = [pytest.mark.slow, pytest.mark.standalone]


async def test_a_paged_snapshot_shows_every_prompt_in_order(valkey, tmp_path):
    browser_or_skip()
    from selenium.webdriver.support.ui import WebDriverWait

    core = Outbox(url=valkey, user_max_queued=0, user_accepts_per_minute=0)
    ids = [
        (
            await core.aaccept(
                "alice", "s1", user_id="u", client_message_id=f"k{i}", text=chr(97 + i) * 102_400
            )
        ).id
        for i in range(12)
    ]
    await core.aclose()
    core.close()
    with serve(
        "uvicorn", valkey, tmp_path / "server", app="tests.support.asgi.snapshot_pages:application"
    ) as server:
        base = server.ws.replace("ws://", "http://")
        driver = start_chrome(tmp_path)
        try:
            driver.get(base)
            driver.add_cookie({"name": "sessionid", "value": server.session_key, "path": "/"})
            driver.get(base)
            wait = WebDriverWait(driver, DEADLINE, poll_frequency=0.1)
            wait.until(
                lambda d: d.execute_script(
                    "const v = window.views.at(-1); return v && v.connected && v.entries.length;"
                ),
                "the snapshot shown",
            )
            shown = driver.execute_script("return window.views.at(-1).entries.map((r) => r.id);")
            pages = driver.execute_script("return window.pages;")
            views = driver.execute_script("return window.views.length;")
            save_screenshot(driver, "outbox-paged-snapshot")
        finally:
            driver.quit()
    assert shown == ids
    assert len(pages) >= 2 and [p["page"] for p in pages] == list(range(1, len(pages) + 1))
    assert all(p["pages"] == len(pages) for p in pages)
    assert all(p["bytes"] <= 768 * 1024 for p in pages)
    assert views == 1  # nothing rendered from a partial snapshot
