"""The README's settings snippet is additive: pasted into a project that already lists DRF
and WhiteNoise (as cookiecutter-django's does), Django still starts, with each app and
middleware once; pasted into a fresh project it adds them (README "Quickstart")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.support.paths import ROOT

WHITENOISE = "whitenoise.middleware.WhiteNoiseMiddleware"
#: What a settings module of each kind holds before the snippet.
EXISTING = f"""
from pathlib import Path
BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "not-a-secret"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth",
                  "django.contrib.staticfiles", "rest_framework"]
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware", "{WHITENOISE}",
              "django.contrib.sessions.middleware.SessionMiddleware"]
STATIC_ROOT = BASE_DIR / "collected"
"""
FRESH = """
from pathlib import Path
BASE_DIR = Path(__file__).resolve().parent
SECRET_KEY = "not-a-secret"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth"]
MIDDLEWARE = ["django.middleware.security.SecurityMiddleware",
              "django.contrib.sessions.middleware.SessionMiddleware"]
"""
READ = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({'apps': list(s.INSTALLED_APPS), 'middleware': list(s.MIDDLEWARE), "
    "'static_root': str(s.STATIC_ROOT)}))"
)


def readme_settings() -> str:
    """The settings part of the README's first Python block (up to ``# urls.py``)."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(# settings\.py.*?)```", text, re.S)
    assert block, "the README's settings snippet"
    return block.group(1).split("# urls.py")[0]


@pytest.mark.parametrize("kind", ["existing", "fresh"])
def test_the_readme_settings_snippet_adds_only_what_is_missing(tmp_path, kind):
    base = EXISTING if kind == "existing" else FRESH
    (tmp_path / "pasted_settings.py").write_text(base + "\n" + readme_settings())
    done = subprocess.run(
        [sys.executable, "-c", READ],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
            "DJANGO_SETTINGS_MODULE": "pasted_settings",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr  # e.g. "Application labels aren't unique"
    found = json.loads(done.stdout)
    for app in ("rest_framework", "channels", "django_outbox"):
        assert found["apps"].count(app) == 1, found["apps"]
    assert found["middleware"].count(WHITENOISE) == 1, found["middleware"]
    assert found["middleware"].index(WHITENOISE) == 1, found["middleware"]
    expected = "collected" if kind == "existing" else "staticfiles"
    assert found["static_root"] == str(tmp_path / expected)
