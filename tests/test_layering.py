import ast
import subprocess
import sys
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "ance_core"
FORBIDDEN = {"prefect", "mlflow"}


def test_core_sources_never_import_orchestration_or_tracking():
    for path in CORE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_importing_the_core_loads_neither():
    modules = [f"ance_core.{p.stem}" for p in CORE.glob("*.py") if p.stem != "__init__"]
    loaded = f"sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})"
    code = f"import sys; import {', '.join(modules)}; print({loaded})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
