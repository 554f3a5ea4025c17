"""scripts/install_env.py (`make env`): uv is given what pip is configured with, so both pick the same releases."""

import sys
from pathlib import Path

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
