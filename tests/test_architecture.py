"""The house rules of django_outbox/ (README "Architecture"), read from the source.

The core knows nothing about Django; nothing outside the core talks to Valkey or
to a core object's private members; a worker sets nothing on the outbox it shares;
the package's imports form no circle; no module is so long that it holds more than
one concept.
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


def test_the_worker_and_its_duties_set_nothing_on_the_outbox():
    """One outbox may serve several workers at once: what is a worker's own (its ID in
    the lease tokens it makes) goes into the calls it makes, never onto the outbox."""

    def is_outbox(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "outbox") or (
            isinstance(node, ast.Attribute) and node.attr == "outbox"
        )

    offenders = []
    for path in [CORE / "worker.py", *sorted((CORE / "duties").glob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            offenders += [
                f"{path.name}:{node.lineno}"
                for target in targets
                if isinstance(target, ast.Attribute) and is_outbox(target.value)
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


def test_the_outbox_imports_nothing_of_the_websocket_wing():
    # ws/ stands on outbox.py (the consumer asks get_outbox(); the publisher subscribes
    # to the outbox's events from apps.ready), so no arrow may run back down to it.
    found = modules()
    targets = imports_of("django_outbox.outbox", found["django_outbox.outbox"], set(found))
    assert sorted(t for t in targets if t.split(".")[:2] == ["django_outbox", "ws"]) == []


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


#: The page whose "Architecture" section draws the house (a block listing every module).
ARCHITECTURE_MAP = PACKAGE.parent / "docs" / "explanation" / "storage.md"


def core_modules_on_the_map() -> set[str]:
    """The ``*.py`` files and ``folder/`` sub-packages the map lists under ``core/`` (the
    block's last part)."""
    section = ARCHITECTURE_MAP.read_text().split("\n## Architecture\n", 1)[1]
    block = section.split("```", 2)[1]
    return set(re.findall(r"[\w/]+\.py|(?<![\w/])\w+/(?=\s)", block.split("\n  core/", 1)[1]))


def test_the_architecture_map_names_every_core_module_and_no_other():
    # A module of a sub-package may be listed by its path, its file name or its folder.
    found = {p.relative_to(CORE).as_posix() for p in CORE.rglob("*.py") if p.name != "__init__.py"}
    named = core_modules_on_the_map()
    missing = sorted(
        m for m in found if not {m, m.rpartition("/")[2], m.split("/")[0] + "/"} & named
    )
    files = found | {m.rpartition("/")[2] for m in found}
    stale = sorted(n for n in named if n.endswith(".py") and n not in files)
    assert (missing, stale) == ([], [])


# --- the Lua scripts ---------------------------------------------------------------------

LUA = CORE / "lua"
#: Top-level definitions of a library file: ``local function f`` and ``local A, B =``.
_LUA_DEFINITION = re.compile(r"^local (?:function (\w+)|([\w, ]+?) *=)", re.MULTILINE)


def _lua_code(text: str) -> str:
    """``text`` with its comments and string literals blanked out (same length, so
    positions still compare)."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("--", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
        elif text[i] in "'\"":
            j = i + 1
            while j < n and text[j] != text[i]:
                j += 2 if text[j] == "\\" else 1
            j += 1
        else:
            out.append(text[i])
            i += 1
            continue
        out.append(" " * (j - i))
        i = j
    return "".join(out)


def library_definitions() -> dict[str, str]:
    """Every name a library file defines at its top level -> the file (``lib/x``)."""
    defined: dict[str, str] = {}
    for path in sorted((LUA / "lib").glob("*.lua")):
        for match in _LUA_DEFINITION.finditer(_lua_code(path.read_text())):
            names = match.group(1) or match.group(2)
            for name in (n.strip() for n in names.split(",")):
                assert name not in defined, f"{name}: lib/{path.stem} and {defined[name]}"
                defined[name] = f"lib/{path.stem}"
    return defined


def test_every_library_name_a_script_uses_is_defined_by_its_includes_before_use():
    """A script that calls a library function (or reads a layout name) without naming
    the file that defines it in its --@include lines would, in Lua, read an undefined
    global: Valkey refuses that only when the line runs. Read statically instead: in
    each assembled script, every library name is defined before its first use."""
    from django_outbox.core.scripts import load_scripts

    defined = library_definitions()
    assert {"split", "join", "claim", "settle", "hinted", "Q", "NOW"} <= set(defined)
    for script in load_scripts().values():
        code = _lua_code(script.text)
        for name, home in defined.items():
            uses = [
                m.start()
                for m in re.finditer(rf"(?<![\w.:]){name}\b", code)
                if not re.match(r"\s*=[^=]", code[m.end() :])  # a table member `name = x`
                or code[: m.start()].rstrip().endswith(("local", "local function", ","))
            ]
            if not uses:
                continue
            definition = re.search(rf"^local (?:function )?(?:[\w, ]*\b)?{name}\b", code, re.M)
            assert definition is not None, (
                f"{script.name}.lua uses {name} but does not include {home}"
            )
            assert definition.start() <= uses[0], (
                f"{script.name}.lua uses {name} before {home} defines it (include order)"
            )


def test_every_script_states_its_flags_and_is_the_only_place_lua_is_assembled():
    """Each script file starts with its own #!lua line; the loader splices nothing but
    the library files a script names (no text markers, no globals between scripts)."""
    from django_outbox.core.scripts import SCRIPT_NAMES, load_scripts

    for name in SCRIPT_NAMES:
        source = (LUA / f"{name}.lua").read_text()
        assert source.startswith("#!lua"), name
        assert not re.search(r"^--@(?!include )", source, re.M), name
    for script in load_scripts().values():
        assert "ONLY_OP" not in script.text and "ACK_SETTLED" not in script.text
        assert "CARRIED" not in script.text


def test_script_answers_are_read_by_their_reply_types_only():
    """A script's answer is a positional Lua table; core/replies.py is the one place that
    reads it by position (one frozen type per reply). Elsewhere in the core, ``answer[0]``
    or ``answer[4:]`` would be a second, unchecked reading of a script's header."""
    offenders = []
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "replies.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Name)
                and node.value.id == "answer"
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []


# --- the tests' own layout (docs/explanation/testing.md "Where the tests are") ------------

REPO = PACKAGE.parent
TESTS = REPO / "tests"
#: The folders that hold test modules; support/ holds none.
TEST_FOLDERS = {
    "core",
    "operations",
    "delivery",
    "django",
    "opencode",
    "agents",
    "langgraph",
    "cluster",
    "faults",
    "browser",
    "acceptance",
}


def _imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (relative imports resolved from its place under REPO)."""
    package = list(path.relative_to(REPO).parent.parts)
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return found


def test_no_test_module_is_imported_by_bench_tools_or_another_test():
    """What tests, bench/ and tools/ share lives in tests/support/ or django_outbox.testing:
    a test module is never imported, so moving or renaming one breaks nothing else."""
    offenders = set()
    for folder in ("bench", "tools", "tests"):
        for path in sorted((REPO / folder).rglob("*.py")):
            for module in _imported_modules(path):
                parts = module.split(".")
                tests = [i for i, part in enumerate(parts) if part.startswith("test_")]
                if parts[0] == "tests" and tests:
                    offenders.add(f"{path.relative_to(REPO)}: {'.'.join(parts[: tests[0] + 1])}")
    assert sorted(offenders) == []


def test_every_test_module_lives_in_a_level_folder():
    """tests/ holds only conftest.py and this file at its root; every test module is in a
    folder of TEST_FOLDERS, and every folder on its way is a package (without an
    ``__init__.py`` pytest would put the folder itself on sys.path, and tests/django would
    shadow Django)."""
    misplaced = []
    for path in sorted(TESTS.rglob("test_*.py")):
        relative = path.relative_to(TESTS)
        if relative == Path("test_architecture.py"):
            continue
        if len(relative.parts) < 2 or relative.parts[0] not in TEST_FOLDERS:
            misplaced.append(str(relative))
        folder = path.parent
        while folder != TESTS.parent:
            if not (folder / "__init__.py").exists():
                misplaced.append(f"{folder.relative_to(REPO)} has no __init__.py")
            folder = folder.parent
    assert sorted(set(misplaced)) == []
