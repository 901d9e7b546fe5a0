"""The shape of the code, checked: imports follow the layers of docs/architecture.md, no module
outgrows a room, and every public class says what it is.

Layers, lowest first (an arrow is "may import"):

- ``core``    → nothing of Talaria but itself;
- ``runtime`` → core;
- ``proxy``   → core; ``runtime`` only from ``proxy/runtimes/embedded.py`` (the embedded
  default runs the node in the proxy's process);
- ``sim``     → core, runtime;
- ``sdk``     → nothing of Talaria but itself (a client library);
- the CLI (``talaria/cli/``, ``talaria/calibrate_live.py``), ``migrations/`` and ``bench/`` sit on
  top and may import any layer, but ``bench/`` never imports ``tests``.

Every import counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("core", "runtime", "proxy", "sim", "sdk")
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "runtime": frozenset({"core", "runtime"}),
    "proxy": frozenset({"core", "proxy"}),
    "sim": frozenset({"core", "runtime", "sim"}),
    "sdk": frozenset({"sdk"}),
}
EXTRA: dict[str, frozenset[str]] = {
    "proxy/runtimes/embedded.py": frozenset({"runtime"}),
}
"""Files allowed one more layer than their folder, with the reason in the module docstring."""

MAX_LINES = 420
"""About 400 lines per module (docs/architecture.md, "Rooms")."""
LONG_MODULES: dict[str, str] = {}
"""Modules allowed past ``MAX_LINES``: path → the reason (also listed in docs/architecture.md)."""
UNDOCUMENTED_FOLDERS: dict[str, str] = {}
"""Folders whose classes are not yet held to a docstring: path → the reason."""


def _modules(folder: str) -> Iterator[Path]:
    yield from sorted((ROOT / folder).rglob("*.py"))


def _imported_layers(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, imported module, its layer) for each ``talaria.<layer>`` or ``tests`` import."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "talaria" and len(parts) > 1 and parts[1] in LAYERS:
                yield node.lineno, name, parts[1]
            elif parts[0] == "talaria" and len(parts) > 1:
                yield node.lineno, name, "cli"
            elif parts[0] == "tests":
                yield node.lineno, name, "tests"


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    wrong = []
    for path in _modules(layer):
        relative = path.relative_to(ROOT).as_posix()
        allowed = ALLOWED[layer] | EXTRA.get(relative, frozenset())
        for line, name, imported in _imported_layers(path):
            if imported not in allowed:
                wrong.append(f"{relative}:{line} imports {name}")
    assert not wrong, "\n".join(wrong)


def test_bench_does_not_import_the_tests() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _modules("bench")
        for line, name, imported in _imported_layers(path)
        if imported == "tests"
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import talaria.proxy.edge.app\n"
        "def f():\n    from talaria.sim import replay\n"
        "from tests.e2e import helpers\n"
    )
    assert [layer for _, _, layer in sorted(_imported_layers(module))] == ["proxy", "sim", "tests"]


def _code_modules() -> Iterator[Path]:
    for folder in (*LAYERS, "talaria"):
        for path in _modules(folder):
            if folder == "talaria" and path.parent.name in LAYERS:
                continue
            if not path.is_symlink() and "static" not in path.parts:
                yield path


def test_no_module_outgrows_a_room() -> None:
    seen = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in _code_modules()
    }
    long = {path: n for path, n in seen.items() if n > MAX_LINES and path not in LONG_MODULES}
    assert not long, long
    assert set(LONG_MODULES) <= set(seen), "an exception names a module that is gone"


def _undocumented_classes(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        public_class = isinstance(node, ast.ClassDef) and not node.name.startswith("_")
        if public_class and ast.get_docstring(node) is None:
            yield f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"


def test_every_public_class_has_a_docstring() -> None:
    missing = [
        name
        for path in _code_modules()
        if path.parent.relative_to(ROOT).as_posix() not in UNDOCUMENTED_FOLDERS
        for name in _undocumented_classes(path)
    ]
    assert not missing, "\n".join(missing)


def test_every_engine_protocol_member_has_a_docstring() -> None:
    path = ROOT / "runtime" / "engine.py"
    tree = ast.parse(path.read_text())
    (engine,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Engine"]
    members = [
        n
        for n in engine.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.AnnAssign)
    ]
    assert members
    missing = []
    for member in members:
        if isinstance(member, ast.AnnAssign):
            following = engine.body[engine.body.index(member) + 1 :]
            documented = bool(following) and isinstance(following[0], ast.Expr)
            name = ast.unparse(member.target)
        else:
            documented = ast.get_docstring(member) is not None
            name = member.name
        if not documented:
            missing.append(name)
    assert not missing, missing
