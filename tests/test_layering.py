"""The import graph: layers that only import downwards, rooms of the core that form no circle, no module circle.

Layers, from the top: ance_cli -> flows -> tasks -> tracking -> ance_core. Inside ance_core, the foundation modules
(its top-level files: errors, faults, artifacts, stage_config) import no room, and the rooms (its subpackages) import
one another without a circle. Every import counts, those inside functions included: an import moved into a function
to dodge a circle is still the circle.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "ance_core"
FORBIDDEN = {"prefect", "mlflow"}
LAYERS = ["ance_core", "tracking", "tasks", "flows", "ance_cli"]  # from the bottom


def imported(tree: ast.AST, in_functions: bool = True) -> list[str]:
    """The modules named by the import statements in `tree` (without `in_functions`: only those run when the module
    itself is imported, not the ones inside its functions). `from a import b` names `a` (and `a.b`, in case b is a
    module); imports under `if TYPE_CHECKING:` are left out (they never run)."""
    names, todo = [], [tree]
    while todo:
        node = todo.pop()
        if not in_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
            names += [f"{node.module}.{a.name}" for a in node.names]
        todo += ast.iter_child_nodes(node)
    return names


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_graph() -> dict[str, set[str]]:
    """Each module of the five packages -> the project modules it imports (a package's own `__init__` is left out:
    importing `a.b` runs `a/__init__.py`, which is not an arrow the module drew)."""
    paths = [p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")]
    modules = {module_name(p): p for p in paths}
    graph = {}
    for name, path in modules.items():
        targets = {t for t in imported(ast.parse(path.read_text())) if t in modules and t != name}
        graph[name] = {t for t in targets if not (modules[t].name == "__init__.py" and name.startswith(t + "."))}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph (as a path that comes back to its start), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def room(module: str) -> str:
    """`ance_core.training.loop` -> `training`; a foundation module (`ance_core.errors`) -> `foundation`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (CORE / parts[-1]).is_dir() else "foundation"


def test_no_module_imports_a_circle():
    found = circle(project_graph())
    assert found is None, "import circle: " + " -> ".join(found)


def test_layers_import_only_downwards():
    graph = project_graph()
    for module, targets in graph.items():
        level = LAYERS.index(module.split(".")[0])
        for target in targets:
            assert LAYERS.index(target.split(".")[0]) <= level, f"{module} imports {target}, a layer above it"


def test_the_core_rooms_import_one_another_without_a_circle_and_the_foundation_imports_no_room():
    graph = project_graph()
    rooms: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module.startswith("ance_core.") and module != "ance_core":
            rooms.setdefault(room(module), set()).update(
                room(t) for t in targets if t.startswith("ance_core.") and room(t) != room(module))
    assert rooms.pop("foundation", set()) == set(), "a foundation module imports a room"
    found = circle(rooms)
    assert found is None, "rooms import one another in a circle: " + " -> ".join(found)


def test_every_room_says_what_lives_there():
    for folder in sorted(p for p in CORE.iterdir() if p.is_dir() and p.name != "__pycache__"):
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text()))
        assert doc and len(doc.splitlines()) <= 3, f"{folder.name}/__init__.py: a docstring of one to three lines"


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, None),
])
def test_the_circle_finder_finds_circles_and_only_circles(graph, expected):
    assert circle(graph) == expected


def test_a_circle_through_an_import_inside_a_function_counts():
    tree = ast.parse("import os\ndef f():\n    from ance_core.training import loop\n")
    assert "ance_core.training.loop" in imported(tree)
    assert "ance_core.training.loop" not in imported(tree, in_functions=False)


def test_core_sources_never_import_orchestration_or_tracking():
    for path in CORE.rglob("*.py"):
        for name in imported(ast.parse(path.read_text())):
            assert name.split(".")[0] not in FORBIDDEN, f"{path.relative_to(ROOT)} imports {name}"


def test_only_the_tracking_package_imports_mlflow():
    for folder in ("ance_core", "tasks", "flows", "ance_cli", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in imported(ast.parse(path.read_text())):
                assert name.split(".")[0] != "mlflow", f"{path.relative_to(ROOT)} imports {name}; use tracking/"


def test_importing_the_core_loads_neither():
    modules = [module_name(p) for p in CORE.rglob("*.py")]
    loaded = f"sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})"
    code = f"import sys; import {', '.join(modules)}; print({loaded})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
