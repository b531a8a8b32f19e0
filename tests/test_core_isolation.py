"""The core knows nothing about Django (STYLE.md: layers)."""

import ast
from pathlib import Path

import django_outbox.core

CORE = Path(django_outbox.core.__file__).parent


def test_core_has_no_django_imports():
    offenders = []
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] in ("django", "rest_framework", "channels")
            ]
    assert offenders == []
