"""The README stays true: its config example validates, its commands exist, its set-up commands are make targets."""

import re
from pathlib import Path

from typer.testing import CliRunner

from ance_cli.main import app
from ance_core.config import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_config_example_is_a_valid_pipeline_config(tmp_path):
    block = re.search(r"```yaml\n(.*?)```", README, re.S).group(1)
    (tmp_path / "c.yaml").write_text(block)
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.rounds == 2 and cfg.mining.top_k == 200


def test_readme_commands_exist():
    commands = set(re.findall(r"^ance (\w+)", README, re.M))
    assert commands == {"demo", "run", "compress", "bm25", "evaluate", "search"}
    for command in commands:
        assert CliRunner().invoke(app, [command, "--help"]).exit_code == 0


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_second():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    lines = [ln.split("#")[0].strip() for ln in first_block.strip().splitlines()]
    assert lines == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln and not ln.startswith(("#", "set ", "cd "))]
    assert ci[-1] == "make test"


def test_readme_make_targets_exist():
    targets = set(re.findall(r"^make ([\w-]+)", README, re.M)) | set(re.findall(r"`make ([\w-]+)`", README))
    assert {"demo", "test", "up", "deploy", "down"} <= targets
    makefile = (ROOT / "Makefile").read_text()
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M), target
