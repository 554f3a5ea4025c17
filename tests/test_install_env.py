"""scripts/install_env.py (`make env`): uv is given what pip is configured with, so both pick the same releases."""

import importlib.util
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import install_env  # noqa: E402


def test_pip_settings_read_from_variables_reach_uv(tmp_path, monkeypatch):
    (tmp_path / "pip.conf").write_text("[global]\nextra-index-url = file:///a/simple\n    file:///b/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "pip.conf"))
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels here")
    settings = install_env.pip_settings()
    assert settings["extra-index-url"][-2:] == ["file:///a/simple", "file:///b/simple"]  # after the machine's own
    assert settings["find-links"] == ["/wheels", "here"]
    options = install_env.uv_options({"extra-index-url": ["file:///a/simple"], "constraint": ["c.txt"]})
    assert options == ["--index-strategy", "unsafe-best-match", "--extra-index-url", "file:///a/simple",
                       "--constraint", "c.txt"]


def test_make_env_installs_through_the_script():  # (and .ci/run: make test, which needs env)
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert '$(BIN)/python scripts/install_env.py -c constraints.txt -e ".[dev,minilm]"' in makefile


@pytest.mark.slow
def test_the_bytecode_of_every_project_module_and_the_servers_is_written_after_the_install(tmp_path, monkeypatch):
    """Installed without uv's --compile-bytecode (all 27k files of the environment), `make env` imports what the
    pipeline and its tests use once: its bytecode is then there for every process, also where PYTHONDONTWRITEBYTECODE
    is set. Every project module is imported (`python -m ance_cli`'s module is not run: the walk would end there)."""
    install_env.warm_bytecode(str(tmp_path))
    import prefect.server.api.server

    import flows.ance_pipeline
    import tracking.run

    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))
    for module in (tracking.run, flows.ance_pipeline, prefect.server.api.server, importlib.import_module("torch.nn")):
        assert Path(importlib.util.cache_from_source(module.__file__)).is_file(), module.__name__


def test_the_installed_distribution_carries_the_version_every_stage_key_holds():
    """pyproject.toml reads its version from ance_core.__version__ (in every stage's key and manifest): the package a
    user installs names the version its work folders were built by (it said 0.1.0 while the keys said 0.2.0)."""
    import importlib.metadata

    import ance_core

    assert importlib.metadata.version("ance-pipeline") == ance_core.__version__
