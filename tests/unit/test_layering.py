"""The shape of the code, checked: imports follow the layers of docs/architecture.md and the
proxy's and the runtime's rooms ("Rooms" and "The runtime's rooms" there), without cycles; no
module outgrows a room, and every public class says what it is.

Layers, lowest first (an arrow is "may import"):

- ``core``    → nothing of Talaria but itself;
- ``runtime`` → core;
- ``proxy``   → core; ``runtime`` only from ``proxy/runtimes/embedded.py`` (the embedded
  default runs the node in the proxy's process);
- ``sim``     → core, runtime;
- ``sdk``     → nothing of Talaria but itself (a client library);
- the CLI (``talaria/cli/``, ``talaria/calibrate_live.py``), ``migrations/`` and ``bench/`` sit on
  top and may import any layer, but ``bench/`` never imports ``tests`` nor reads a file there.

Inside ``proxy/``, each room (sub-package) may import only the rooms before it in ``ROOMS``;
inside ``runtime/``, each room (a folder, or some of its own modules: ``RUNTIME_FILE_ROOMS``)
only the rooms before it in ``RUNTIME_ROOMS``. Anywhere in the layers, no module imports one
that imports it back, however indirectly (no file circle), and in every folder its modules and
sub-folders import each other without a cycle (no folder cycle).

Every import counts: ``import a.b``; ``from a import b`` (``b`` may be a module: ``from talaria
import runtime``); relative imports, resolved against the importing file's package; and
``importlib.import_module`` / ``__import__`` of a string literal; at module level, inside a
function or under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
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

ROOMS = (
    "contract",
    "store",
    "sessions",
    "runtimes",
    "cluster",
    "placement",
    "callpath",
    "dialects",
    "console",
    "api",
    "edge",
)
"""The proxy's rooms, lowest first: each may import itself and the rooms before it
(docs/architecture.md, "Rooms")."""
FACE = "(face)"
"""proxy/__init__.py, the package's face (and any name ``talaria.proxy`` gives that is not a
room: ``from talaria.proxy import create_app``)."""
FACE_MAY_IMPORT = frozenset({"contract", "edge"})
KNOWN: dict[str, str] = {}
"""Imports against the rooms' order allowed for now: ``"<file> -> <room>"`` → the reason
(e.g. ``"proxy/callpath/context.py -> dialects": "being removed: the responses store becomes
the dialect's own service (issue 37)"``, gone since the store became the responses dialect's
own service). Each must still be needed (``test_every_known_room_exception_is_still_needed``):
remove it with the import, here and in docs/architecture.md."""

MAX_LINES = 420
"""About 400 lines per module: 400 is the aim, 420 (5 % over) the bound, so that a module is
not split for one more function (docs/architecture.md, "Rooms" and "Long modules")."""
LONG_MODULES: dict[str, str] = {}
"""Modules allowed past ``MAX_LINES``: path → the reason (also listed in docs/architecture.md)."""
UNDOCUMENTED_FOLDERS: dict[str, str] = {}
"""Folders whose classes are not yet held to a docstring: path → the reason."""


def _modules(folder: str) -> Iterator[Path]:
    yield from sorted((ROOT / folder).rglob("*.py"))


def _package_of(path: Path) -> str:
    """The package ``path`` is imported in, for its relative imports: a layer's folder is
    ``talaria.<layer>`` (the symlinks), anything else its own path (``bench.harness``); a
    file outside the checkout (a probe) is in none."""
    if not path.is_relative_to(ROOT):
        return ""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[0] in (*LAYERS, "migrations"):
        parts.insert(0, "talaria")
    return ".".join(parts[:-1])


def _absolute(package: str, level: int, module: str | None) -> str:
    """``from <level dots><module> import ...`` in ``package``, made absolute."""
    base = package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def _literal(node: ast.expr | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return None


def _dynamic_import(node: ast.Call, package: str) -> str | None:
    """The module ``importlib.import_module("...")`` or ``__import__("...")`` names, when it is
    a string literal (a relative one resolved against its ``package`` argument or the file's)."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return None
    target = _literal(node.args[0])
    if target is None:
        return None
    if name == "import_module" and target.startswith("."):
        given = node.args[1] if len(node.args) > 1 else None
        given = given or next((k.value for k in node.keywords if k.arg == "package"), None)
        level = len(target) - len(target.lstrip("."))
        return _absolute(_literal(given) or package, level, target[level:] or None)
    return target


def _imports(path: Path, package: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) for every import in ``path``: ``import a.b``; ``from a
    import b`` as ``a.b`` (``b`` may be a module: ``from talaria import runtime``); relative
    imports resolved against ``package`` (default: the file's own); and
    ``importlib.import_module``/``__import__`` of a string literal."""
    package = _package_of(path) if package is None else package
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(package, node.level, node.module) if node.level else node.module or ""
            for alias in node.names:
                yield node.lineno, base if alias.name == "*" else f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and (name := _dynamic_import(node, package)):
            yield node.lineno, name


def _layer_of(name: str) -> str | None:
    parts = name.split(".")
    if parts[0] == "talaria" and len(parts) > 1 and not parts[1].startswith("__"):
        return parts[1] if parts[1] in LAYERS else "cli"
    return "tests" if parts[0] == "tests" else None


def _imported_layers(path: Path, package: str | None = None) -> Iterator[tuple[int, str, str]]:
    """(line, imported module, its layer) for each ``talaria.<layer>`` or ``tests`` import."""
    for line, name in _imports(path, package):
        layer = _layer_of(name)
        if layer is not None:
            yield line, name, layer


def _relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name


def _layer_violations(path: Path, layer: str, package: str | None = None) -> Iterator[str]:
    """Each import of ``path`` (a module of ``layer``) of a layer it may not import."""
    relative = _relative(path)
    allowed = ALLOWED[layer] | EXTRA.get(relative, frozenset())
    for line, name, imported in _imported_layers(path, package):
        if imported not in allowed:
            yield f"{relative}:{line} imports {name}"


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    wrong = [w for path in _modules(layer) for w in _layer_violations(path, layer)]
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


def test_the_checker_sees_modules_imported_by_name_from_a_package(tmp_path: Path) -> None:
    """``from talaria import runtime``: the names imported are modules (the old checker read
    only ``from talaria.<layer> import ...``, and saw nothing here)."""
    module = tmp_path / "m.py"
    module.write_text("from talaria import runtime\nfrom talaria import proxy, sim\n")
    assert sorted(_imported_layers(module)) == [
        (1, "talaria.runtime", "runtime"),
        (2, "talaria.proxy", "proxy"),
        (2, "talaria.sim", "sim"),
    ]
    assert sorted(_layer_violations(module, "core")) == [
        "m.py:1 imports talaria.runtime",
        "m.py:2 imports talaria.proxy",
        "m.py:2 imports talaria.sim",
    ]


def test_the_checker_resolves_relative_imports(tmp_path: Path) -> None:
    """Relative imports, against the importing file's package (the old checker skipped every
    ``from .``): read as a module of runtime/scheduling/."""
    module = tmp_path / "m.py"
    module.write_text(
        "from .intake import Intake\n"
        "from ..engines import sim\n"
        "def f():\n    from ... import proxy\n"
        "from ...proxy.edge import app\n"
    )
    package = "talaria.runtime.scheduling"
    assert sorted(_imported_layers(module, package)) == [
        (1, "talaria.runtime.scheduling.intake.Intake", "runtime"),
        (2, "talaria.runtime.engines.sim", "runtime"),
        (4, "talaria.proxy", "proxy"),
        (5, "talaria.proxy.edge.app", "proxy"),
    ]
    assert sorted(_layer_violations(module, "runtime", package)) == [
        "m.py:4 imports talaria.proxy",
        "m.py:5 imports talaria.proxy.edge.app",
    ]
    assert _package_of(ROOT / "runtime" / "scheduling" / "node.py") == package
    assert _package_of(ROOT / "proxy" / "__init__.py") == "talaria.proxy"
    assert _package_of(ROOT / "bench" / "harness" / "chaos.py") == "bench.harness"


def test_the_checker_sees_import_module_of_a_literal(tmp_path: Path) -> None:
    """``importlib.import_module("talaria...")`` and ``__import__("talaria...")`` (the old
    checker read only import statements); a name computed at run time cannot be read."""
    module = tmp_path / "m.py"
    module.write_text(
        "import importlib\n"
        "from importlib import import_module\n"
        "importlib.import_module('talaria.proxy.edge.app')\n"
        "def f(name):\n"
        "    __import__('talaria.sim.replay')\n"
        "    import_module('.app', package='talaria.proxy.edge')\n"
        "    importlib.import_module(name)\n"
    )
    assert sorted(_imported_layers(module)) == [
        (3, "talaria.proxy.edge.app", "proxy"),
        (5, "talaria.sim.replay", "sim"),
        (6, "talaria.proxy.edge.app", "proxy"),
    ]
    assert len(list(_layer_violations(module, "runtime"))) == 3


# -- the proxy's rooms ----------------------------------------------------------------------------
def _room_of(path: Path) -> str:
    """The room a module of proxy/ is in (its first folder), or ``FACE``."""
    parts = path.relative_to(ROOT / "proxy").parts
    return FACE if len(parts) == 1 else parts[0]


def _imported_rooms(path: Path, package: str | None = None) -> Iterator[tuple[int, str, str]]:
    """(line, imported module, its room) for each import of ``talaria.proxy``."""
    for line, name in _imports(path, package):
        parts = name.split(".")
        if parts[:2] == ["talaria", "proxy"]:
            room = parts[2] if len(parts) > 2 and parts[2] in ROOMS else FACE
            yield line, name, room


def _room_violations(
    path: Path, room: str, package: str | None = None
) -> Iterator[tuple[str, str]]:
    """(``"<file> -> <room>"``, where) for each import of ``path`` (a module of ``room``) of a
    room it may not import."""
    relative = _relative(path)
    allowed = FACE_MAY_IMPORT if room == FACE else frozenset(ROOMS[: ROOMS.index(room) + 1])
    for line, name, imported in _imported_rooms(path, package):
        if imported not in allowed:
            yield f"{relative} -> {imported}", f"{relative}:{line} imports {name}"


def _proxy_room_violations() -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in _modules("proxy"):
        for key, where in _room_violations(path, _room_of(path)):
            found[key].append(where)
    return found


def test_the_rooms_are_the_proxys_folders() -> None:
    folders = {p.parent.name for p in (ROOT / "proxy").glob("*/__init__.py")}
    assert folders == set(ROOMS), "a room missing from ROOMS, or gone"
    loose = [p.name for p in (ROOT / "proxy").glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules of proxy/ in no room: {loose}"


def test_a_proxy_room_imports_only_the_rooms_before_it() -> None:
    wrong = [w for key, ws in _proxy_room_violations().items() if key not in KNOWN for w in ws]
    assert not wrong, "\n".join(wrong)


def test_every_known_room_exception_is_still_needed() -> None:
    stale = set(KNOWN) - set(_proxy_room_violations())
    assert not stale, f"fixed: remove from KNOWN (and docs/architecture.md): {sorted(stale)}"


def test_the_room_checker_sees_every_form(tmp_path: Path) -> None:
    """A module of store/ importing a later room absolutely, relatively and through the face's
    package; and the face importing a room other than contract/ and edge/."""
    module = tmp_path / "m.py"
    module.write_text(
        "from talaria.proxy.callpath.door import open_call\n"
        "from ..dialects import registry\n"
        "from talaria.proxy import edge, contract\n"
        "from .batch import write_batch\n"
        "import talaria.proxy\n"
    )
    found = sorted(w for _, w in _room_violations(module, "store", "talaria.proxy.store"))
    assert found == [
        "m.py:1 imports talaria.proxy.callpath.door.open_call",
        "m.py:2 imports talaria.proxy.dialects.registry",
        "m.py:3 imports talaria.proxy.edge",
        "m.py:5 imports talaria.proxy",
    ]
    face = tmp_path / "face.py"
    face.write_text("from talaria.proxy.edge.app import create_app\nfrom .store import db\n")
    assert [k for k, _ in _room_violations(face, FACE, "talaria.proxy")] == ["face.py -> store"]


def _a_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``edges`` (its nodes, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_cycle_among_the_proxy_rooms() -> None:
    """Whatever ``ROOMS`` says: the rooms' imports of each other (the ``KNOWN`` exceptions
    aside) have no cycle."""
    edges: dict[str, set[str]] = defaultdict(set)
    for path in _modules("proxy"):
        room, relative = _room_of(path), _relative(path)
        for _, _, imported in _imported_rooms(path):
            if imported != room and f"{relative} -> {imported}" not in KNOWN:
                edges[room].add(imported)
    assert _a_cycle(edges) is None, " -> ".join(_a_cycle(edges) or [])
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]


# -- the runtime's rooms --------------------------------------------------------------------------
RUNTIME_ROOMS = ("seam", "memory", "engines", "scheduling", "node")
"""The runtime's rooms, lowest first: each may import itself and the rooms before it
(docs/architecture.md, "The runtime's rooms"): the seam (what an engine is to the node, how long
its work takes, what its entry may hold), the memory accounting the engines share, the engines,
the node's scheduler, and the node's assembly (config, factory, server and routes)."""
RUNTIME_FOLDER_ROOMS = {"memory": "memory", "engines": "engines", "scheduling": "scheduling"}
"""runtime/'s folders, each a room (with all below it)."""
RUNTIME_FILE_ROOMS = {
    "engine.py": "seam",
    "costmodel.py": "seam",
    "config_fields.py": "seam",
    "__init__.py": "node",
    "app_state.py": "node",
    "auth.py": "node",
    "call_routes.py": "node",
    "config.py": "node",
    "engine_kinds.py": "node",
    "factory.py": "node",
    "gguf.py": "node",
    "instant.py": "node",
    "model_source.py": "node",
    "placement_routes.py": "node",
    "placement_rules.py": "node",
    "serve.py": "node",
    "server.py": "node",
    "sim_node.py": "node",
    "status_routes.py": "node",
}
"""runtime/'s own modules, each in the room it serves (a new one is placed here)."""


@cache
def _package_modules() -> dict[str, Path]:
    """Every module of the package's layers by its import name (a package by its __init__.py)."""
    found: dict[str, Path] = {}
    for layer in LAYERS:
        for path in _modules(layer):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(["talaria", *parts])] = path
    return found


def _target(name: str) -> Path | None:
    """The module of the package an import of ``name`` loads: its longest prefix that is one
    (``talaria.runtime.engine.Admission`` → runtime/engine.py); None outside the package."""
    modules = _package_modules()
    while name:
        if name in modules:
            return modules[name]
        name = name.rpartition(".")[0]
    return None


def _runtime_room(path: Path) -> str:
    """The room of a module of runtime/: its folder's, or its own (``RUNTIME_FILE_ROOMS``)."""
    parts = path.relative_to(ROOT / "runtime").parts
    if len(parts) == 1:
        return RUNTIME_FILE_ROOMS[parts[0]]
    return RUNTIME_FOLDER_ROOMS[parts[0]]


def _runtime_room_violations(path: Path, room: str) -> Iterator[str]:
    """Each import of ``path`` (a module of ``room``) of a room after ``room``."""
    allowed = RUNTIME_ROOMS[: RUNTIME_ROOMS.index(room) + 1]
    for line, name in _imports(path):
        target = _target(name)
        if target is None or not target.is_relative_to(ROOT / "runtime"):
            continue
        if _runtime_room(target) not in allowed:
            yield f"{_relative(path)}:{line} imports {name} ({_runtime_room(target)})"


def test_every_runtime_module_is_in_a_room() -> None:
    own = {p.name for p in (ROOT / "runtime").glob("*.py")}
    assert own == set(RUNTIME_FILE_ROOMS), "a module of runtime/ missing from its rooms, or gone"
    folders = {p.parent.name for p in (ROOT / "runtime").glob("*/__init__.py")}
    assert folders == set(RUNTIME_FOLDER_ROOMS), "a folder of runtime/ in no room, or gone"
    assert set(RUNTIME_FILE_ROOMS.values()) | set(RUNTIME_FOLDER_ROOMS.values()) == set(
        RUNTIME_ROOMS
    )


def test_a_runtime_room_imports_only_the_rooms_before_it() -> None:
    wrong = [
        w
        for path in _modules("runtime")
        for w in _runtime_room_violations(path, _runtime_room(path))
    ]
    assert not wrong, "\n".join(wrong)


def test_the_runtime_room_checker_sees_a_later_room(tmp_path: Path) -> None:
    """A module of the engines' room importing the scheduler (a later room) and the seam and
    the memory accounting (earlier ones), absolutely and relatively."""
    module = tmp_path / "m.py"
    module.write_text(
        "from talaria.runtime.scheduling.node import NodeScheduler\n"
        "from talaria.runtime.engine import Admission\n"
        "from talaria.runtime.memory.resources import NodeMemory\n"
        "def f():\n    from talaria.runtime import factory\n"
    )
    assert [w.split(" ")[0] for w in _runtime_room_violations(module, "engines")] == [
        "m.py:1",
        "m.py:5",
    ]
    assert not list(_runtime_room_violations(module, "node"))


# -- cycles: no file circle, no folder cycle ------------------------------------------------------
@cache
def _import_graph() -> dict[str, frozenset[str]]:
    """Each module of the package (its path from the checkout) → the modules of the package it
    imports (every import, lazy ones and ``TYPE_CHECKING`` ones too)."""
    graph: dict[str, frozenset[str]] = {}
    for path in _package_modules().values():
        targets = {_target(name) for _, name in _imports(path)}
        graph[_relative(path)] = frozenset(
            _relative(t) for t in targets if t is not None and t != path
        )
    return graph


def _folder_edges(graph: Mapping[str, Iterable[str]]) -> dict[str, dict[str, set[str]]]:
    """For each folder, how its units import each other: its own modules and its sub-folders
    (each with all below it). ``a/b/x.py`` importing ``a/c.py`` is ``a/b`` → ``a/c.py`` in
    folder ``a``; importing ``a/b/y.py`` is ``a/b/x.py`` → ``a/b/y.py`` in ``a/b``."""
    edges: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for source, targets in graph.items():
        a = source.split("/")
        for target in targets:
            b = target.split("/")
            common = 0
            while common < min(len(a), len(b)) - 1 and a[common] == b[common]:
                common += 1
            unit_a, unit_b = "/".join(a[: common + 1]), "/".join(b[: common + 1])
            if unit_a != unit_b:
                edges["/".join(a[:common])][unit_a].add(unit_b)
    return edges


def _folder_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """A cycle among the units of each folder that has one (``_folder_edges``)."""
    found = [_a_cycle(units) for _, units in sorted(_folder_edges(graph).items())]
    return [cycle for cycle in found if cycle is not None]


def test_no_file_circle() -> None:
    """No module of core/, runtime/, proxy/, sim/ or sdk/ imports, however indirectly, a module
    that imports it back."""
    cycle = _a_cycle({k: set(v) for k, v in _import_graph().items()})
    assert cycle is None, " -> ".join(cycle or [])


def test_no_folder_cycle() -> None:
    """In every folder of the package (the package itself included: its layers), the modules and
    sub-folders import each other without a cycle: a folder is a unit its neighbours depend
    on, or that depends on them, never both."""
    cycles = _folder_cycles(_import_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder() -> None:
    """On toy graphs: a circle and where it closes; none in a diamond; a folder that both
    imports a neighbour and is imported by it is a cycle even with no file circle (the runtime
    had one: engines/ → config.py → factory.py → engines/)."""
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None
    assert _a_cycle({"a": {"a"}}) == ["a", "a"]
    tangled = {"pkg/x.py": {"pkg/sub/b.py"}, "pkg/sub/c.py": {"pkg/x.py"}, "pkg/sub/b.py": set()}
    assert _a_cycle({k: set(v) for k, v in tangled.items()}) is None
    assert _folder_cycles(tangled) == [["pkg/sub", "pkg/x.py", "pkg/sub"]]
    layered = {
        "pkg/x.py": {"pkg/sub/b.py", "core/y.py"},
        "pkg/sub/b.py": {"pkg/sub/c.py", "pkg/z.py"},
        "pkg/sub/c.py": {"core/y.py"},
    }
    assert _folder_cycles(layered) == []
    assert _folder_cycles({"core/y.py": {"pkg/x.py"}, "pkg/x.py": {"core/y.py"}}) == [
        ["core", "pkg", "core"]
    ]


# -- bench and the tests' files -------------------------------------------------------------------
TESTS_PATH = re.compile(r"/?tests(/|$)")
"""A string that is a path into tests/ (``"tests"``, ``"tests/fixtures/..."``, the
``"/tests/..."`` of an f-string): prose that mentions a test file (docstrings, messages an
agent sends) does not start with it."""


def _tests_paths(path: Path) -> Iterator[str]:
    """Where ``path`` names the tests folder as a path: string literals, docstrings aside."""
    tree = ast.parse(path.read_text(), filename=str(path))
    prose = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if not isinstance(node, ast.Constant) or id(node) in prose:
            continue
        text = _literal(node)
        if text is not None and TESTS_PATH.match(text):
            yield f"{_relative(path)}:{node.lineno} {text!r}"


def test_bench_does_not_read_the_tests_files() -> None:
    """bench/ has its own fixtures (bench/fixtures/): no path into tests/ in its code, nor in
    its other files."""
    wrong = [w for path in _modules("bench") for w in _tests_paths(path)]
    for other in sorted((ROOT / "bench").rglob("*")):
        if other.is_file() and other.suffix not in (".py", ".pyc", ".json"):
            for n, line in enumerate(other.read_text(errors="replace").splitlines(), 1):
                if re.search(r"(^|[\s\"'=(/])tests/", line.split("#", 1)[0]):
                    wrong.append(f"{_relative(other)}:{n} {line.strip()}")
    assert not wrong, "\n".join(wrong)


def test_the_tests_path_checker_sees_a_path(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""Reads nothing of tests/fixtures/ (a docstring)."""\n'
        "from pathlib import Path\n"
        "A = Path(__file__).parents[1] / 'tests' / 'fixtures'\n"
        "B = open('tests/fixtures/agent_tools/codex.json')\n"
        "C = f'{A}/tests/x'\n"
        "D = 'run make tests/test_x.py'  # an agent's message\n"
    )
    assert sorted(w.split()[0] for w in _tests_paths(module)) == ["m.py:3", "m.py:4", "m.py:5"]


# -- modules ------------------------------------------------------------------------------------
def _code_modules() -> Iterator[Path]:
    for folder in (*LAYERS, "talaria"):
        for path in _modules(folder):
            if folder == "talaria" and path.parent.name in LAYERS:
                continue
            if not path.is_symlink() and "static" not in path.parts:
                yield path


def test_no_module_outgrows_a_room() -> None:
    """Every non-test module, bench's included, is within ``MAX_LINES`` or listed."""
    seen = {
        p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines())
        for p in (*_code_modules(), *_modules("bench"))
    }
    long = {path: n for path, n in seen.items() if n > MAX_LINES and path not in LONG_MODULES}
    assert not long, long
    assert set(LONG_MODULES) <= set(seen), "an exception names a module that is gone"


def _undocumented_classes(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
            continue
        if ast.get_docstring(node) is None:
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
    """``Engine`` and each optional capability (runtime/engine.py): every member says its
    contract."""
    path = ROOT / "runtime" / "engine.py"
    tree = ast.parse(path.read_text())
    protocols = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and any(ast.unparse(b) == "Protocol" for b in n.bases)
    ]
    assert {"Engine", "Switching", "Staging", "MemoryAccounting"} <= {p.name for p in protocols}
    missing = []
    for protocol in protocols:
        members = [
            n
            for n in protocol.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.AnnAssign)
        ]
        assert members, protocol.name
        for member in members:
            if isinstance(member, ast.AnnAssign):
                following = protocol.body[protocol.body.index(member) + 1 :]
                documented = bool(following) and isinstance(following[0], ast.Expr)
                name = ast.unparse(member.target)
            else:
                documented = ast.get_docstring(member) is not None
                name = member.name
            if not documented:
                missing.append(f"{protocol.name}.{name}")
    assert not missing, missing
