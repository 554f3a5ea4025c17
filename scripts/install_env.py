"""Install the project and its pinned dependencies into a virtual environment (`make env`), with uv when it can be
had: uv resolves and installs in about a quarter of pip's time and compiles the bytecode on both cores. uv is told
what pip is configured with (index URLs, find-links, constraints: `pip config list` and PIP_* variables), so both
pick the same releases; without uv (no wheel for this platform, no registry) pip installs as before.

    .venv/bin/python scripts/install_env.py -c constraints.txt -e ".[dev,minilm]"
"""

import ast
import os
import subprocess
import sys


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


def main() -> None:
    args = sys.argv[1:]
    pip = [sys.executable, "-m", "pip", "install", "--progress-bar", "off"]
    if os.environ.get("ANCE_INSTALL_WITH_PIP") != "1" and subprocess.run([*pip, "-q", "uv"]).returncode == 0:
        uv = [sys.executable, "-m", "uv", "pip", "install", "--python", sys.executable, "--compile-bytecode"]
        settings = pip_settings()
        env = os.environ | ({"SSL_CERT_FILE": settings["cert"][0]} if settings.get("cert") else {})
        if subprocess.run([*uv, *uv_options(settings), *args], env=env).returncode == 0:
            return
        print("uv could not install the environment: installing with pip", file=sys.stderr)
    sys.exit(subprocess.run([*pip, *args]).returncode)


if __name__ == "__main__":
    main()
