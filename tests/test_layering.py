import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "ance_core"
FORBIDDEN = {"prefect", "mlflow"}


def imported(tree: ast.AST, in_functions: bool = True) -> list[str]:
    """The modules named by the import statements in `tree` (without `in_functions`: only those run when the module
    itself is imported, not the ones inside its functions)."""
    names, todo = [], [tree]
    while todo:
        node = todo.pop()
        if not in_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.append(node.module or "")
        todo += ast.iter_child_nodes(node)
    return names


def test_core_sources_never_import_orchestration_or_tracking():
    for path in CORE.rglob("*.py"):
        for name in imported(ast.parse(path.read_text())):
            assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_only_the_tracking_package_imports_mlflow():
    for folder in ("ance_core", "tasks", "flows", "ance_cli", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in imported(ast.parse(path.read_text())):
                assert name.split(".")[0] != "mlflow", f"{folder}/{path.name} imports {name}; use tracking/"


def test_flows_import_no_circle():
    """The flows' modules import one another without a circle (a function may import one lazily)."""
    edges = {path.stem: {name.removeprefix("flows.") for name in imported(ast.parse(path.read_text()), False)
                         if name.startswith("flows.")}
             for path in (ROOT / "flows").glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        assert module not in path, f"import circle: {' -> '.join([*path, module])}"
        if module not in done:
            for target in sorted(edges.get(module, ())):
                visit(target, [*path, module])
            done.add(module)

    for module in sorted(edges):
        visit(module, [])


def test_importing_the_core_loads_neither():
    modules = [f"ance_core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__"]
    loaded = f"sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})"
    code = f"import sys; import {', '.join(modules)}; print({loaded})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
