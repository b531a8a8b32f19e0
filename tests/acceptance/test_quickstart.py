"""The documentation cannot drift from the package.

- ``test_quickstart_from_wheel`` (slow) follows docs/quickstart.md as a new user would:
  builds the wheel and sdist (``python -m build``, ``twine check``), installs the wheel
  into a clean venv with ``uvicorn[standard]`` and WhiteNoise (pip may use the machine's
  package index and its cache), runs ``django-admin startproject mysite``, writes the
  project's files from the very snippets the page includes (``docs/quickstart/``), and
  runs the page's commands: ``check``, ``migrate``, ``createsuperuser``,
  ``collectstatic``, uvicorn serving the project on a real Valkey, ``watch.py`` on the
  WebSocket, the accept over HTTP (the page's curl request, sent with httpx), and
  ``outbox_worker`` delivering it to the quickstart's agent; then the frontend page of
  docs/howto/frontend.md (its view, URL and template as shown there) in headless
  Chromium: a prompt typed on the page is delivered and shown sent.
- The fast tests check that every relative link of README.md and of the docs pages
  resolves, and that the settings reference names every ``OUTBOX`` key.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from django_outbox.conf import OWN_KEYS
from django_outbox.core.config import Config, declared
from django_outbox.delivery.opencode import OpencodeSettings
from django_outbox.testing import ValkeyServer, free_port, wait_until
from tests.support.paths import ROOT as REPO

DOCS = REPO / "docs"
SNIPPETS = DOCS / "quickstart"
PASSWORD = "quickstart-Pa55word"
#: What the wheel's build does not read from the checkout (venvs, caches, build output, data).
NOT_SOURCE = (
    ".git",
    ".venv*",
    ".*cache",
    ".hypothesis",
    ".opencode",
    "node_modules",
    "build",
    "dist",
    "var",
    "_build",
    "*.egg-info",
    "__pycache__",
)
#: The quickstart page's packages besides the wheel.
EXTRA_PACKAGES = ["uvicorn[standard]", "whitenoise"]


def run(argv: list[str], *, timeout: float, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure show what it printed."""
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert done.returncode == 0, f"{argv} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def stop(process: subprocess.Popen, timeout: float = 15.0) -> int:
    """SIGTERM, wait (bounded), SIGKILL if it would not stop; return the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    return process.returncode


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.exists() else ""


@pytest.mark.slow
def test_quickstart_from_wheel(tmp_path):
    started = time.monotonic()
    dist = tmp_path / "dist"
    # 1. The wheel and the sdist, and their metadata as an index would check it; built from a
    # copy of the checkout, as building writes into its source tree (egg-info, build/) and
    # another run of the suite may build at the same time (.ci/run runs two at once).
    source = tmp_path / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(dist), str(source)],
        timeout=180,
    )
    wheels = sorted(dist.glob("django_outbox-*.whl"))
    sdists = sorted(dist.glob("django_outbox-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(dist.iterdir())
    run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, wheels + sdists)], timeout=60
    )

    # 2. A clean venv with the wheel (not editable) and the page's server packages.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=60)
    bin_ = venv / "bin"
    run(
        [str(bin_ / "python"), "-m", "pip", "install", "--quiet", str(wheels[0]), *EXTRA_PACKAGES],
        timeout=240,
    )

    # 3. A fresh project, its files written from the snippets the page shows.
    site = tmp_path / "site"
    site.mkdir()
    run([str(bin_ / "django-admin"), "startproject", "mysite", str(site)], timeout=60)
    settings_py = site / "mysite" / "settings.py"
    settings_py.write_text(
        read(settings_py) + "\n\n" + read(SNIPPETS / "settings.py"), encoding="utf-8"
    )
    for name in ("urls.py", "asgi.py", "agent.py"):
        shutil.copyfile(SNIPPETS / name, site / "mysite" / name)
    shutil.copyfile(SNIPPETS / "watch.py", site / "watch.py")
    # The frontend page (docs/howto/frontend.md): its view, URL and template as shown.
    view, route, template = frontend_snippets()
    (site / "mysite" / "views.py").write_text(view, encoding="utf-8")
    (site / "templates").mkdir()
    (site / "templates" / "queue.html").write_text(template, encoding="utf-8")
    with (site / "mysite" / "urls.py").open("a", encoding="utf-8") as urls:
        urls.write(f"\nfrom mysite import views  # noqa: E402\n\nurlpatterns.append({route})\n")
    with settings_py.open("a", encoding="utf-8") as settings:
        settings.write('\nTEMPLATES[0]["DIRS"] = [BASE_DIR / "templates"]\n')

    logs = tmp_path / "logs"
    logs.mkdir()
    with ValkeyServer(tmp_path / "valkey") as valkey:
        env = {
            **os.environ,
            "VALKEY": valkey.url.rsplit("/", 1)[0],  # redis://127.0.0.1:<port>
            "DJANGO_SUPERUSER_PASSWORD": PASSWORD,
            "PYTHONUNBUFFERED": "1",
        }
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.pop("OUTBOX_VALKEY_URL", None)
        manage = [str(bin_ / "python"), "manage.py"]

        # 4. The page's commands.
        checked = run([*manage, "check"], cwd=site, env=env, timeout=60)
        assert "E0" not in checked.stdout + checked.stderr
        run([*manage, "migrate", "--no-input"], cwd=site, env=env, timeout=120)
        run(
            [*manage, "createsuperuser", "--no-input", "--username", "admin",
             "--email", "admin@example.com"],
            cwd=site, env=env, timeout=60,
        )  # fmt: skip
        run([*manage, "collectstatic", "--no-input"], cwd=site, env=env, timeout=60)
        assert (site / "staticfiles" / "django_outbox" / "outbox.js").is_file()

        port = free_port()
        server = f"http://127.0.0.1:{port}"
        procs: list[subprocess.Popen] = []
        files = []

        def start(name: str, argv: list[str]) -> subprocess.Popen:
            out = (logs / f"{name}.log").open("w")
            files.append(out)
            proc = subprocess.Popen(argv, cwd=site, env=env, stdout=out, stderr=subprocess.STDOUT)
            procs.append(proc)
            return proc

        def log(name: str) -> str:
            return read(logs / f"{name}.log")

        try:
            uvicorn = start(
                "uvicorn",
                [str(bin_ / "uvicorn"), "mysite.asgi:application", "--host", "127.0.0.1",
                 "--port", str(port)],
            )  # fmt: skip

            def serving() -> bool:
                assert uvicorn.poll() is None, log("uvicorn")
                try:
                    return httpx.get(f"{server}/admin/login/", timeout=2).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(serving, timeout=30, interval=0.1, message="uvicorn serving")
            # Static files through WhiteNoise: outbox.js and the admin's CSS.
            for path in ("django_outbox/outbox.js", "admin/css/base.css"):
                assert httpx.get(f"{server}/static/{path}", timeout=5).status_code == 200, path
            schema = httpx.get(f"{server}/outbox/api/schema/", timeout=10)
            assert schema.status_code == 200 and b"/outbox/api/workspaces/" in schema.content

            # The WebSocket watcher first, so it sees every change.
            watcher = start(
                "watch",
                [str(bin_ / "python"), "watch.py", "ws1", "ses1", "--server", server,
                 "--password", PASSWORD, "--until", "sent"],
            )  # fmt: skip

            def snapshot_seen() -> bool:
                assert watcher.poll() is None, log("watch") + log("uvicorn")
                return '"queue.snapshot"' in log("watch")

            wait_until(snapshot_seen, timeout=30, interval=0.1, message="the snapshot")

            # The page's curl request: Basic auth, JSON body.
            accepted = httpx.post(
                f"{server}/outbox/api/workspaces/ws1/sessions/ses1/messages/",
                auth=("admin", PASSWORD),
                json={"clientMessageID": "hello-1", "text": "Hello, agent"},
                timeout=10,
            )
            assert accepted.status_code == 202, accepted.text
            entry_id = accepted.json()["id"]
            again = httpx.post(
                f"{server}/outbox/api/workspaces/ws1/sessions/ses1/messages/",
                auth=("admin", PASSWORD),
                json={"clientMessageID": "hello-1", "text": "Hello, agent"},
                timeout=10,
            )
            assert again.status_code == 200 and again.json()["id"] == entry_id, again.text

            worker = start("worker", [*manage, "outbox_worker"])

            def watcher_done() -> bool:
                assert worker.poll() is None, log("worker")
                return watcher.poll() is not None

            wait_until(watcher_done, timeout=40, interval=0.1, message="the sent update")
            assert watcher.returncode == 0, log("watch")
            frames = log("watch")
            for state in ("queued", "delivering", "sent"):
                assert f'"state": "{state}"' in frames, frames
            inbox = read(site / "agent-inbox.jsonl").splitlines()
            assert len(inbox) == 1 and entry_id in inbox[0] and "Hello, agent" in inbox[0]

            # 5. The frontend page in a real browser: a prompt typed there is delivered.
            if frontend_in_browser(tmp_path, server):
                inbox = read(site / "agent-inbox.jsonl").splitlines()
                assert len(inbox) == 2 and "Hello from the page" in inbox[1]
            assert stop(worker) == 0, log("worker")
        finally:
            for proc in procs:
                stop(proc)
            for out in files:
                out.close()
    # The brief's bound for this test (the first run fills pip's cache and may be slower).
    print(f"quickstart from wheel: {time.monotonic() - started:.1f}s")


def frontend_snippets() -> tuple[str, str, str]:
    """The frontend page's view module, URL pattern and template, as docs/howto/frontend.md
    shows them."""
    blocks = re.findall(r"```(\w+)\n(.*?)```", read(DOCS / "howto" / "frontend.md"), re.S)
    view = next(code for lang, code in blocks if lang == "python" and "# views.py" in code)
    template = next(code for lang, code in blocks if lang == "html" and "queue.html" in code)
    found = re.search(r"# urls\.py: (path\(.*\))", view)
    assert found, "the page names the view's URL pattern"
    return view, found.group(1), template


def frontend_in_browser(tmp_path: Path, server: str) -> bool:
    """Log in, open the frontend page, send a prompt and wait until the page shows it
    sent; False (and why, printed) when there is no headless browser here."""
    from tests.support.browser import CHROMEDRIVER, CHROMIUM, start_chrome

    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        print("quickstart: no headless browser, the frontend page was not tried")
        return False
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    driver = start_chrome(tmp_path, "frontend")
    wait = WebDriverWait(driver, 30, poll_frequency=0.1)
    try:
        driver.get(f"{server}/admin/login/?next=/queue/ws1/ses2/")
        wait.until(ec.presence_of_element_located((By.ID, "id_username"))).send_keys("admin")
        driver.find_element(By.ID, "id_password").send_keys(PASSWORD)
        driver.find_element(By.CSS_SELECTOR, "[type=submit]").click()
        box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "#prompt input")))
        box.send_keys("Hello from the page")
        driver.find_element(By.CSS_SELECTOR, "#prompt button").click()
        wait.until(ec.text_to_be_present_in_element((By.ID, "queue"), "Hello from the page: sent"))
        console = [
            e["message"]
            for e in driver.get_log("browser")
            if e["level"] == "SEVERE" and "favicon.ico" not in e["message"]  # (none here)
        ]
        assert console == [], console
    finally:
        driver.quit()
    return True


# --- fast checks ---------------------------------------------------------------------------

#: [text](target) in Markdown, skipping images' and code's look-alikes well enough here.
LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lowercase, punctuation dropped,
    spaces to hyphens), enough for this project's headings."""
    anchors = set()
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def relative_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # no links inside code blocks
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize(
    "page",
    [REPO / "README.md", *sorted(DOCS.rglob("*.md"))],
    ids=lambda p: str(p.relative_to(REPO)),
)
def test_relative_links_resolve(page):
    """Every relative link of README.md and of the docs pages names a file that exists,
    and an ``#anchor`` into a Markdown file names one of its headings."""
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(read(file)):
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: {broken}"


def test_settings_reference_names_every_key():
    """docs/reference/settings.md documents every OUTBOX key the package accepts."""
    page = read(DOCS / "reference" / "settings.md")
    opencode = {name.upper() for name in declared(OpencodeSettings)}
    keys = {f.name.upper() for f in dataclasses.fields(Config)} | OWN_KEYS | opencode
    missing = sorted(k for k in keys if f"`{k}`" not in page)
    assert not missing, f"undocumented settings: {missing}"
