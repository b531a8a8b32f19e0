"""Sphinx configuration of the django-outbox documentation (``make docs``).

Sphinx, because autodoc reads the reference straight from the package's docstrings and
the build fails on any warning (``-W``), and Furo, a maintained theme that many Python
projects use, with a light and a dark mode and no JavaScript from a CDN. Pages are
Markdown (MyST), so the README's text moved here as it was written.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE / "_ext"))
os.environ["DJANGO_SETTINGS_MODULE"] = "docs_settings"

import django  # noqa: E402

django.setup()

from importlib.metadata import version as _dist_version  # noqa: E402

_version = _dist_version("django-outbox")

project = "django-outbox"
author = "django-outbox contributors"
copyright = "the django-outbox contributors"
release = version = _version

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.graphviz",
    "sphinxarg.ext",
    "sphinxcontrib.openapi",
    "outbox_docs",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_generated"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = "django-outbox"
html_static_path = ["_static"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"show-inheritance": False}

graphviz_output_format = "svg"

# No network at build time: nothing is fetched (no intersphinx, no CDN).
