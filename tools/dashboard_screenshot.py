"""A reproducible screenshot of the admin dashboard for the docs (``make screenshot``).

    .venv/bin/python tools/dashboard_screenshot.py --out docs/_static/dashboard.png
    .venv/bin/python tools/dashboard_screenshot.py --out a.png --out-day b.png

1. Starts a throwaway valkey-server (``django_outbox.testing.ValkeyServer``, a free
   loopback port, data in a temp folder).
2. Fills the last hour of per-minute history through the real core API: an
   ``Outbox`` on that Valkey with an injected clock set to each minute in turn accepts
   a daily-traffic-like curve of prompts (with a burst, a quiet spell, an agent outage
   in one workspace and a maintenance park in another) and delivers them with
   ``adeliver_once`` through deliverers that sometimes fail or are ambiguous (a verifier
   then answers delivered); it writes the counts after each minute
   (``aflush_history``) and samples depth once a minute (``asample_history``). A few
   entries are left pending (backing off) and in error. Seeded: the same traffic each
   run, only the wall-clock minutes differ.
3. Starts the demo (``python -m example_project.run``) on a free port with
   ``OUTBOX_VALKEY_URL`` pointing at that Valkey, logs into the admin as admin / admin in
   headless Chromium (``/usr/bin/chromium`` and ``chromedriver``; override with
   ``OUTBOX_TEST_CHROMIUM`` / ``OUTBOX_TEST_CHROMEDRIVER``), opens the dashboard, waits
   for the charts and saves a PNG of the whole page.

Everything it starts is stopped at the end, with bounded waits. Exit status 0 on
success, 1 (with the demo's log) when a step fails.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from django_outbox.core.entry import Verdict  # noqa: E402
from django_outbox.core.errors import AmbiguousError, OutboxFull  # noqa: E402
from django_outbox.core.service import Outbox  # noqa: E402
from django_outbox.testing import ValkeyServer  # noqa: E402
from tests.support.demo import DemoProcess  # noqa: E402

CHROMIUM = os.environ.get("OUTBOX_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("OUTBOX_TEST_CHROMEDRIVER", "/usr/bin/chromedriver")
DASHBOARD = "/admin/django_outbox/outboxentry/dashboard/"
WIDTH = 1180  # two charts side by side; the height follows the page
SEED = 17
MAX_PROMPTS = 1_900
FILL_DEADLINE = 60.0  # seconds
MINUTES = 60
TICK = 5.0  # seconds between two rounds of accepts and deliveries inside a minute
STEPS_PER_TICK = 6  # the simulated worker's capacity: 72 deliveries a minute

#: Workspace -> sessions (the busier workspaces have more).
WORKSPACES = {"acme": 6, "globex": 4, "initech": 3}
TEXTS = (
    "Summarise the failing tests in ci/run-4411",
    "Rename the settings module and fix the imports",
    "Why does the worker log 'lease lost' at 03:00?",
    "Draft release notes for 2.3",
    "Add a retry to the webhook sender",
    "Explain this stack trace",
    "Write a migration for the new index",
    "Review the diff of PR 318",
)


class Clock:
    """The injected clock: seconds since the epoch, moved by the fill."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@dataclass
class Traffic:
    """What the fill did, for the summary line."""

    accepted: int = 0
    refused: int = 0
    steps: int = 0
    minutes: int = 0
    by_workspace: dict[str, int] = field(default_factory=dict)


def prompts_in(i: int, rng: random.Random) -> int:
    """Prompts accepted in minute ``i`` of the hour (0 = oldest): a daily-traffic-like
    swell compressed into the hour, a quiet spell (minutes 14-19) and a burst (36-38)."""
    base = 16 + 12 * math.sin(math.pi * (i - 4) / 40) + rng.uniform(-4, 4)
    if 14 <= i <= 19:
        base = rng.choice((0, 1, 1, 2))
    burst = {36: 95, 37: 70, 38: 35}.get(i, 0)
    return max(0, int(base) + burst)


def outage(ws: str, i: int) -> bool:
    """globex's agent is down in minutes 43-47 and again from minute 57 (it is backing
    off when the picture is taken)."""
    return ws == "globex" and (43 <= i <= 47 or i >= 57)


def parked(ws: str, i: int) -> bool:
    """initech is parked for maintenance in minutes 50-53."""
    return ws == "initech" and 50 <= i <= 53


async def fill(url: str, now: float, log: Any = print) -> Traffic:
    """Fill ``MINUTES`` minutes of history, the last ending at ``now`` (epoch seconds, the
    minute of ``now`` included up to ``now``), on the Valkey at ``url``."""
    rng = random.Random(SEED)
    clock = Clock(now)
    outbox = Outbox(
        url,
        clock=clock,
        max_attempts=4,
        retry_backoff=10,
        max_backoff=120,
        verify_delay=3,
        user_max_queued=0,
        user_accepts_per_minute=0,
    )
    sessions = [(ws, f"s{n}") for ws, count in WORKSPACES.items() for n in range(count)]
    weights = [3 if ws == "acme" else 2 if ws == "globex" else 1 for ws, _ in sessions]
    traffic = Traffic()
    minute_now = int(now) // 60
    first = minute_now - MINUTES + 1
    started = time.monotonic()
    state: dict[str, Any] = {"i": 0, "end": now}

    async def deliver(entry: Any, *, workspace_id: str, session_id: str, **kw: Any) -> None:
        i = state["i"]
        # The agent thinks for a while; the clock moves with it (the latency buckets).
        think = min(rng.lognormvariate(0.0, 0.8), 4.5)
        clock.now = min(clock.now + think, state["end"] - 0.3)
        roll = rng.random()
        if outage(workspace_id, i) or roll < 0.03:
            raise RuntimeError("agent answered 502")
        if roll < 0.06:
            raise AmbiguousError("the connection dropped after the prompt was sent")

    async def verify(entry: Any, *, workspace_id: str, session_id: str) -> Verdict:
        clock.now = min(clock.now + 0.2, state["end"] - 0.3)
        return Verdict.DELIVERED

    outbox.verifier = verify
    was_parked: set[str] = set()
    try:
        for i in range(MINUTES):
            minute = first + i
            start = minute * 60.0
            end = min(start + 60.0, time.time() - 0.5) if minute == minute_now else start + 60.0
            state["i"], state["end"] = i, end
            for ws in WORKSPACES:
                if parked(ws, i) and ws not in was_parked:
                    clock.now = start + 1
                    await outbox.apark_workspace(ws, reason="maintenance")
                    was_parked.add(ws)
                elif not parked(ws, i) and ws in was_parked:
                    clock.now = start + 1
                    outbox.unpark_workspace(ws, reason="maintenance")
                    was_parked.discard(ws)
            wanted = min(prompts_in(i, rng), MAX_PROMPTS - traffic.accepted - traffic.refused)
            ticks = [start + 2 + TICK * k for k in range(12) if start + 2 + TICK * k < end - 1]
            if not ticks:  # the current minute has only just begun
                break
            share = [wanted // len(ticks) + (k < wanted % len(ticks)) for k in range(len(ticks))]
            rng.shuffle(share)
            # One sample a minute, at a tick of its own (after that tick's accepts,
            # before its deliveries), as the worker that claims the minute would.
            sample_at = rng.randrange(len(ticks))
            for k, (tick, count) in enumerate(zip(ticks, share, strict=True)):
                for n in range(count):
                    clock.now = tick + n * 0.01
                    ws, ses = rng.choices(sessions, weights)[0]
                    try:
                        await outbox.aaccept(
                            ws,
                            ses,
                            user_id=f"{ws}-user{rng.randint(1, 4)}",
                            client_message_id=f"m{minute}-{n}-{rng.getrandbits(32):08x}",
                            text=rng.choice(TEXTS),
                        )
                    except OutboxFull:
                        traffic.refused += 1
                        continue
                    traffic.accepted += 1
                    traffic.by_workspace[ws] = traffic.by_workspace.get(ws, 0) + 1
                if k == sample_at:
                    clock.now = tick + 0.2
                    await outbox.asample_history("screenshot")
                # The worker: up to STEPS_PER_TICK sessions stepped in parallel, each
                # starting at the tick (the deliverer moves the clock by its think time).
                order = sessions[:]
                rng.shuffle(order)
                budget = STEPS_PER_TICK
                for j, (ws, ses) in enumerate(order):
                    if budget <= 0:
                        break
                    clock.now = tick + 0.3 + j * 0.01
                    if await outbox.adeliver_once(ws, ses, deliver):
                        budget -= 1
                        traffic.steps += 1
            clock.now = max(start + 58.0 if minute != minute_now else end - 0.3, clock.now)
            await outbox.aflush_history(outbox.history_counter)
            traffic.minutes += 1
            if time.monotonic() - started > FILL_DEADLINE:
                raise RuntimeError(f"the fill took over {FILL_DEADLINE:.0f} s (minute {i})")
        counts = outbox.entry_counts()
        log(
            f"screenshot: filled {traffic.minutes} minutes: {traffic.accepted} accepted, "
            f"{traffic.refused} refused (full), {traffic.steps} delivery steps; "
            f"now {counts} ({time.monotonic() - started:.1f} s)"
        )
        return traffic
    finally:
        await outbox.aclose()
        outbox.close()


# -- the demo -------------------------------------------------------------------------------


# -- the browser ----------------------------------------------------------------------------


def start_chrome(folder: Path) -> Any:
    """A headless Chromium with its own profile under ``folder``."""
    from selenium import webdriver

    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not shutil.which(p)]
    if missing:
        raise RuntimeError(
            f"no headless browser: {', '.join(missing)} missing "
            "(apt-get install -y chromium chromium-driver)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={WIDTH},900",
        f"--user-data-dir={folder / 'chromium-profile'}",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(
        options=options,
        service=webdriver.ChromeService(
            executable_path=CHROMEDRIVER, log_output=str(folder / "chromedriver.log")
        ),
    )


def shoot(driver: Any, base: str, window: str, out: Path, timeout: float = 30.0) -> None:
    """Open the dashboard's ``window`` (hour or day), wait for its charts, fit the window
    to the page and save a PNG to ``out``."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout, poll_frequency=0.1)
    driver.get(f"{base}{DASHBOARD}?window={window}")

    def accepted(d: Any) -> bool:
        for tile in d.find_elements(By.CSS_SELECTOR, ".outbox-tiles div"):
            if tile.find_element(By.TAG_NAME, "dt").text.lower() == "accepted":
                return int(tile.find_element(By.TAG_NAME, "dd").text.replace(",", "")) > 0
        return False

    wait.until(accepted)
    for chart in ("throughput", "latency", "depth", "overdue"):
        wait.until(lambda d, c=chart: d.find_elements(By.CSS_SELECTOR, f"#chart-{c} polyline"))
    # Fit the window to the page: the height the page needs, plus the window's chrome,
    # until the viewport holds all of it (a resize takes effect asynchronously).
    page_js = "return [document.documentElement.scrollHeight, window.innerHeight]"

    def fitted(d: Any) -> bool:
        height, inner = d.execute_script(page_js)
        if inner >= height:
            return True
        outer = d.get_window_size()["height"]
        d.set_window_size(WIDTH, int(height) + max(0, outer - int(inner)))
        return False

    WebDriverWait(driver, timeout, poll_frequency=0.3).until(fitted)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not driver.save_screenshot(str(out)):
        raise RuntimeError(f"could not save {out}")
    print(f"screenshot: {window} -> {out} ({out.stat().st_size:,} bytes)", flush=True)


def login(driver: Any, base: str, timeout: float = 30.0) -> None:
    """Log into the admin as the demo's admin (admin / admin)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout, poll_frequency=0.1)
    driver.get(f"{base}/admin/login/?next={DASHBOARD}")
    wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("admin")
    driver.find_element(By.ID, "id_password").send_keys("admin")
    driver.find_element(By.CSS_SELECTOR, "[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "outbox-dashboard")))
    # The admin's navigation sidebar folded away (the admin remembers it per browser):
    # the page's width goes to the charts.
    driver.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="PNG of the last hour")
    parser.add_argument("--out-day", type=Path, default=None, help="PNG of the last day too")
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs)")
    args = parser.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="outbox-screenshot-"))
    valkey = demo = driver = None
    ok = False
    try:
        valkey = ValkeyServer(folder / "valkey").start()
        print(f"screenshot: Valkey {valkey.url}", flush=True)
        asyncio.run(fill(valkey.url, time.time()))
        demo = DemoProcess(folder, "--latency", "0.5", env={"OUTBOX_VALKEY_URL": valkey.url}).start(
            within=90.0
        )
        print(f"screenshot: demo {demo.url}", flush=True)
        driver = start_chrome(folder)
        login(driver, demo.url)
        shoot(driver, demo.url, "hour", args.out)
        if args.out_day is not None:
            shoot(driver, demo.url, "day", args.out_day)
        ok = True
    except Exception as exc:
        print(f"screenshot: failed: {exc}", file=sys.stderr, flush=True)
        if demo is not None and demo.log_path.exists():
            print(demo.log()[-4000:], file=sys.stderr, flush=True)
    finally:
        if driver is not None:
            driver.quit()
        if demo is not None:
            demo.stop()
        if valkey is not None:
            valkey.stop()
        if args.keep:
            print(f"screenshot: kept {folder}", flush=True)
        else:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
