"""The device kit (scripts/gpu_kit): what it carries covers the project's dependencies, and its GPU-side script
parses. Its full dry run (downloads, install into a scratch folder, sizes) is `make gpu-kit` (3-4 min, registries)."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu_kit"))
import gather  # noqa: E402


def _name(requirement: str) -> str:
    return re.split(r"[<>=!\[ ;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_dependency_is_carried_or_on_the_machine():
    needed = {_name(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]}
    carried = {_name(r) for r in gather.REQUIREMENTS} | {"mlflow", "matplotlib"}  # mlflow-skinny; matplotlib there
    missing = needed - carried - gather.ON_MACHINE - gather.LEFT_OUT
    assert not missing, f"pyproject dependencies the kit neither carries nor finds on the GPU machine: {missing}"


@pytest.mark.parametrize("wheel,name", [("mlflow_skinny-3.17.2-py3-none-any.whl", "mlflow-skinny"),
                                        ("PyStemmer-3.1.0-cp312-cp312-manylinux1_x86_64.whl", "pystemmer")])
def test_dist_name(wheel, name):
    assert gather.dist_name(Path(wheel)) == name


def test_run_script_parses_and_refuses_an_unknown_part(tmp_path):
    script = ROOT / "scripts" / "gpu_kit" / "run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    done = subprocess.run(["bash", str(script), "nothing"], capture_output=True, text=True,
                          env={"OUT": str(tmp_path / "out"), "KIT": str(tmp_path / "kit"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and "usage" in done.stderr


def test_the_model_part_refuses_a_cold_machine(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_kit" / "run.sh"), "model"], capture_output=True,
                          text=True, cwd=ROOT,
                          env={"OUT": str(tmp_path / "out"), "KIT": str(tmp_path / "kit"), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 3 and "run part 'site' first" in done.stdout
