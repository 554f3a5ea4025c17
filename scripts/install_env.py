"""Install the project and its pinned dependencies into a virtual environment (`make env`), with uv when it can be
had: uv resolves and installs in about a quarter of pip's time. uv is told what pip is configured with (index URLs,
find-links, constraints: `pip config list` and PIP_* variables), so both pick the same releases; without uv (no wheel
for this platform, no registry) pip installs as before.

Bytecode: uv's `--compile-bytecode` compiled all 25,800 modules of the environment (48 s on a 2-core machine) when the
pipeline and its tests import about 4,900 (ray, sympy, most of transformers: never). Instead one process imports
those (`WARM`: the `ance` command and every module of the project, the embedded Prefect server, MLflow's SQL store,
pytest) and writes their bytecode, in about 20 s; a module left out is compiled when first imported. Where
PYTHONDONTWRITEBYTECODE is set (CI machines set it), nothing would ever write it: every process would compile its
imports again (about 15 s more for each `ance` command).

    .venv/bin/python scripts/install_env.py -c constraints.txt -e ".[dev,minilm]"
"""

import ast
import os
import subprocess
import sys

PROJECT = ("ance_cli", "ance_core", "flows", "tasks", "tracking")
WARM = ("prefect.server.api.server", "prefect.server.database", "mlflow.store.tracking.sqlalchemy_store",
        "mlflow.tracking", "faiss", "pytest", "xdist")
WARM_IMPORTS = f"""
import importlib, pkgutil
for name in {WARM!r}:
    try:
        importlib.import_module(name)
    except Exception:  # (pytest without the dev extra): left to its first import
        pass
for package in {PROJECT!r}:
    module = importlib.import_module(package)
    for found in pkgutil.walk_packages(module.__path__, package + "."):
        if found.name.endswith(".__main__"):  # (it would run the command)
            continue
        try:
            importlib.import_module(found.name)
        except Exception:
            pass
"""


def pip_settings() -> dict[str, list[str]]:
    """pip's configured values (files and PIP_* variables), by option name, e.g. {"extra-index-url": [...]}."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    settings: dict[str, list[str]] = {}
    for line in out.splitlines():  # global.extra-index-url='a b', :env:.find-links='/opt/wheels'
        key, _, value = line.partition("=")
        values = settings.setdefault(key.rpartition(".")[2], [])
        values += [v for v in ast.literal_eval(value.strip()).split() if v not in values]  # pip prints repr()s
    return settings


def uv_options(settings: dict[str, list[str]]) -> list[str]:
    """The uv pip install options that make uv pick what pip would: pip takes the best match across all its indexes."""
    options = ["--index-strategy", "unsafe-best-match"]
    for name in ("index-url", "extra-index-url", "find-links", "constraint"):
        for value in settings.get(name, []):
            options += [f"--{name}", value]
    return options


def warm_bytecode(pycache_prefix: str | None = None) -> None:
    """Write the bytecode of what the pipeline and its tests import (`WARM`), by importing it once (beside the sources,
    or under `pycache_prefix`)."""
    prefix = {"PYTHONPYCACHEPREFIX": pycache_prefix} if pycache_prefix else {}
    subprocess.run([sys.executable, "-c", WARM_IMPORTS], env=os.environ | {"PYTHONDONTWRITEBYTECODE": ""} | prefix,
                   stdout=subprocess.DEVNULL, check=False)


def main() -> None:
    args = sys.argv[1:]
    pip = [sys.executable, "-m", "pip", "install", "--progress-bar", "off"]
    if os.environ.get("ANCE_INSTALL_WITH_PIP") != "1" and subprocess.run([*pip, "-q", "uv"]).returncode == 0:
        uv = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable]
        settings = pip_settings()
        env = os.environ | ({"SSL_CERT_FILE": settings["cert"][0]} if settings.get("cert") else {})
        if subprocess.run([*uv, *uv_options(settings), *args], env=env).returncode == 0:
            warm_bytecode()
            return
        print("uv could not install the environment: installing with pip", file=sys.stderr)
    sys.exit(subprocess.run([*pip, *args]).returncode)


if __name__ == "__main__":
    main()
