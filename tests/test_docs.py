"""The README and the manual (docs/) stay true: the README is the door (its set-up commands are make targets, CI runs
the second), the manual's config example validates, its commands exist, the site builds with no broken link."""

import os
import re
from pathlib import Path

from typer.testing import CliRunner

from ance_cli.main import app
from ance_core.pipeline.loading import load_config

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
MANUAL = {p.name: p.read_text() for p in sorted(DOCS.glob("*.md"))}
EVERYTHING = README + "".join(MANUAL.values())


def test_the_config_example_is_a_valid_pipeline_config(tmp_path):
    block = re.search(r"```yaml\n(.*?)```", MANUAL["commands.md"], re.S).group(1)
    (tmp_path / "c.yaml").write_text(block)
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.rounds == 2 and cfg.mining.top_k == 200


def test_the_documented_commands_exist():
    import typer

    commands = set(re.findall(r"^ance (\w+)", MANUAL["commands.md"], re.M))
    assert commands == set(typer.main.get_command(app).commands)  # (every command in the page's synopsis)
    for command in commands | set(re.findall(r"^ance (\w+)", README, re.M)):
        assert CliRunner().invoke(app, [command, "--help"]).exit_code == 0, command
    # the help is read as markdown (paragraphs reflowed): what it shows in angle brackets must survive as text
    out = CliRunner().invoke(app, ["export", "--help"], env={"COLUMNS": "200"}).output
    assert "models:/<name>@<alias> or models:/<name>/<version>" in out


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_second():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    lines = [ln.split("#")[0].strip() for ln in first_block.strip().splitlines()]
    assert lines == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines()
          if ln and not ln.startswith(("#", "set ", "cd "))]
    assert ci[-1] == "make test"


def test_documented_make_targets_exist():
    targets = set(re.findall(r"^make ([\w-]+)", EVERYTHING, re.M)) | set(re.findall(r"`make ([\w-]+)`", EVERYTHING))
    assert {"demo", "test", "up", "deploy", "down", "docs"} <= targets
    makefile = (ROOT / "Makefile").read_text()
    for target in targets:
        assert re.search(rf"^{target}:", makefile, re.M), target


def test_how_it_is_built_names_every_module():
    tree = MANUAL["architecture.md"]
    files = [p for folder in ("tasks", "flows", "tracking", "bench", "scripts", "ance_cli")
             for p in sorted((ROOT / folder).iterdir())
             if p.suffix in (".py", ".sh") and p.name not in ("__init__.py", "__main__.py")]
    missing = [f"{p.parent.name}/{p.name}" for p in files if p.name not in tree]
    assert not missing, f"not named in docs/architecture.md: {missing}"


def test_how_it_is_built_maps_every_core_module_to_its_room():
    """The ance_core block lists each room (`  data/`, or `(foundation)` for the top-level modules) with its modules,
    one per line: exactly the files each room holds."""
    block = MANUAL["architecture.md"].split("\nance_core/", 1)[1].split("\ntasks/", 1)[0]
    listed: dict[str, set[str]] = {}
    room = None
    for line in block.splitlines():
        if m := re.match(r"^  (\(foundation\)|\w+/)\s", line):
            room = "" if m.group(1) == "(foundation)" else m.group(1).rstrip("/")
        if room is not None and (m := re.match(r"^  (?:\S+)?\s+(\w+\.py)\s", line)):
            listed.setdefault(room, set()).add(m.group(1))
    core = ROOT / "ance_core"
    actual = {"": {p.name for p in core.glob("*.py") if p.name != "__init__.py"}}
    actual |= {d.name: {p.name for p in d.glob("*.py") if p.name != "__init__.py"}
               for d in core.iterdir() if (d / "__init__.py").is_file()}
    assert listed == actual


def test_the_manual_lists_every_deployment_that_make_deploy_registers():
    import yaml

    names = {d["name"] for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}
    line = next(ln for ln in MANUAL["orchestration.md"].splitlines() if ln.startswith("make deploy"))
    listed = set(re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)+|retrain|evaluate|compress", line.split("#", 1)[1]))
    assert names <= listed, f"make deploy registers {sorted(names - listed)} too"


def test_config_fields_named_in_the_docs_exist():
    from ance_core.pipeline.config import PipelineConfig

    fields = PipelineConfig.model_fields
    named = set(re.findall(r"`([a-z_0-9]+)\.(?!py`)([a-z_0-9]+)`", EVERYTHING))  # not file names
    sections = {s for s, _ in named if s in fields}
    assert {"warmup", "mining", "data"} <= sections
    for section, field in named:
        if section in fields:
            model = fields[section].annotation
            model = next((a for a in getattr(model, "__args__", (model,)) if hasattr(a, "model_fields")), model)
            assert field in model.model_fields, f"the docs name `{section}.{field}`, which the config does not have"


def test_make_test_says_it_installs_debian_packages():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    test_line = next(ln for ln in first_block.splitlines() if ln.startswith("make test"))
    assert "chromium" in test_line and "docker-compose" in test_line


def test_no_placeholder_is_left_in_the_documents():
    for name in ("README.md", "RESULTS.md", "BENCHMARKS.md", *(f"docs/{n}" for n in MANUAL)):
        text = (ROOT / name).read_text()
        assert "TBD" not in text and "«" not in text, name


def test_the_config_reference_is_what_the_config_models_generate():
    """docs/config-reference.md is generated from the config models (ance_core/pipeline/reference.py): a field added,
    renamed, retyped, given another default or description without regenerating it fails here."""
    from ance_core.pipeline.reference import reference

    committed = (ROOT / "docs" / "config-reference.md").read_text()
    assert committed == reference(), ("docs/config-reference.md is stale: python -m ance_core.pipeline.reference > "
                                      "docs/config-reference.md")
    for field in ("`index.ivf_storage`", "`ance.learning_rate`", "`data.dev_fraction`", "`tune.budget_minutes`"):
        assert field in committed, field


def test_the_readme_is_the_door():
    """At most 200 lines: what it is, the two commands, the results, the map; every docs page is on the map."""
    assert len(README.splitlines()) <= 200
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", README))
    assert linked == set(MANUAL), f"pages missing from the README's map: {set(MANUAL) - linked}"


def test_the_docs_site_builds_strict(tmp_path):
    """`make docs`: mkdocs --strict fails on a broken link or anchor, a page left out of the nav, a bad config."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    for page in ("index.html", "commands/index.html", "RESULTS/index.html", "config-reference/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    home = (tmp_path / "site" / "index.html").read_text()
    assert 'href="commands/"' in home and "fonts.googleapis" not in home
