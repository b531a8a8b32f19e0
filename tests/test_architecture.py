"""The house rules of django_outbox/ (README "Architecture"), read from the source.

The core knows nothing about Django; nothing outside the core talks to Valkey or
to a core object's private members; the package's imports form no circle; no
module is so long that it holds more than one concept.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import django_outbox

PACKAGE = Path(django_outbox.__file__).parent
CORE = PACKAGE / "core"
MAX_MODULE_LINES = 800


def modules() -> dict[str, Path]:
    """Dotted module name -> path, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Package modules ``name`` imports, anywhere in the file (inside functions and
    ``TYPE_CHECKING`` blocks too: a circle there is still a circle)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name and candidate != "django_outbox":
                targets.add(candidate)
    return targets


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


def test_only_the_core_imports_redis():
    offenders = []
    for name, path in modules().items():
        if path.is_relative_to(CORE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{name}: {n}" for n in names if n.split(".")[0] in ("redis", "hiredis")]
    assert offenders == []


#: ``outbox._x``, ``get_outbox()._x``, ``self.outbox._x``: a private member of the core service.
PRIVATE_CORE_ACCESS = re.compile(r"(?:\boutbox\b|get_outbox\(\))\._[a-z]")


def test_nothing_outside_the_core_touches_core_privates():
    offenders = [
        f"{name}:{number}: {line.strip()}"
        for name, path in modules().items()
        if not path.is_relative_to(CORE)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_CORE_ACCESS.search(line)
    ]
    assert offenders == []


def test_the_package_imports_form_no_circle():
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    # A package's __init__ re-exporting its modules is not a circle through them.
    graph = {
        name: {t for t in targets if not (name.startswith(t + "."))}
        for name, targets in graph.items()
    }
    circles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert circles == []


def test_no_module_is_longer_than_800_lines():
    long = {
        name: lines
        for name, path in modules().items()
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_every_module_opens_with_a_docstring():
    missing = [
        name
        for name, path in modules().items()
        if path.read_text().strip() and ast.get_docstring(ast.parse(path.read_text())) is None
    ]
    assert missing == []
