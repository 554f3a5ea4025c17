"""`ance tune` and `ance run --recipe auto` end to end on the tiny pipeline (ephemeral Prefect server, the work
folder's MLflow store): every trial a cached task with its MLflow run nested under the search's, successive halving
over two seeds, the decision written as a report and a config, and the auto run reusing the winner's trial."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.tiny import failure_report, tiny_pipeline_config

pytestmark = pytest.mark.slow


def _ance(args: list[str], tmp_path, timeout: int = 1500) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "ance_cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")})
    assert proc.returncode == 0, failure_report(proc)
    return proc


def test_a_search_runs_its_rungs_decides_against_the_baseline_and_auto_trains_the_winner(tiny_scifact, tiny_model,
                                                                                       tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    (tmp_path / "c.json").write_text(json.dumps(config))
    settings = ["--tune-set", "seeds=[42,43]", "--tune-set", "learning_rates=[5e-4]", "--tune-set", "warmup_epochs=[1]"]
    search = ["--config", str(tmp_path / "c.json"), *settings]
    proc = _ance(["tune", *search, "--out", str(tmp_path / "chosen.yaml"), "--json"], tmp_path)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    trials = result["trials"]
    # two candidates (the base at 1e-3, and 5e-4): rung 0 their warm-ups (seed 42), then both as whole recipes under
    # seed 42 (the challenger survives, the baseline always runs), then under 42 and 43 (only 43 is new)
    assert [(t["rung"], t["full"], t["seed"]) for t in trials] == [
        (0, False, 42), (0, False, 42), (1, True, 42), (1, True, 42), (2, True, 43), (2, True, 43)]
    baseline = "demo (baseline)"
    assert [t["candidate"] for t in trials] == [baseline, "lr 0.0005"] * 3
    # the warm-up rung's warm-up is the whole recipe's (planned as in it): trained once, reused
    warmups = [[s["path"] for s in json.loads(Path(t["path"], "trial.json").read_text())["stages"]
                if (s["for"], s["stage"]) == ("warmup", "train")] for t in trials[:4]]
    assert warmups[0] == warmups[2] and warmups[1] == warmups[3]
    assert result["winner"] in (baseline, "lr 0.0005") and result["reason"]
    for t in trials:  # a trial's score is the dev nDCG@10 of the dense model it delivers
        record = json.loads(Path(t["path"], "trial.json").read_text())
        dense = [r for r in record["results"] if r["model"] != "BM25" and not r["model"].endswith(" + BM25")]
        warmup = next(r["dev_ndcg_at_10"] for r in dense if r["model"] == "warmup")  # the warm-up rung's score
        assert t["score"] == (max(r["dev_ndcg_at_10"] for r in dense) if t["full"] else warmup)
        assert ("ANCE round 1" in {r["model"] for r in record["results"]}) == t["full"]
    chosen = yaml.safe_load((tmp_path / "chosen.yaml").read_text())
    assert chosen["warmup"]["learning_rate"] == (5e-4 if result["winner"] == "lr 0.0005" else 1e-3)
    assert "**Chosen:" in proc.stdout and "| candidate | overrides |" in proc.stdout
    # MLflow: the search's run, every trial's run nested under it, nothing registered by a trial
    client = MlflowClient(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    parent = client.get_run(result["mlflow_run_id"])
    assert parent.data.tags["winner"] == result["winner"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "tune")} == {
        "tune/tune.md", "tune/tune.json", "tune/recipe.yaml"}
    nested = client.search_runs([parent.info.experiment_id],
                                filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(nested) == len(trials) and all(r.data.tags.get("trial") == "true" for r in nested)
    assert not client.search_registered_models()
    assert not (tmp_path / "work" / "latest.json").exists()
    # the test split, read once the choice is made: the baseline's and the winner's runs under each seed
    bench = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "bench" / "tune_results.py"),
                            str(tmp_path / "work"), "--json", str(tmp_path / "test.json")],
                           capture_output=True, text=True, timeout=120)
    assert bench.returncode == 0, bench.stderr[-2000:]
    summary = json.loads((tmp_path / "test.json").read_text())[0]
    assert summary["winner"] == result["winner"] and set(summary["recipes"][baseline]) == {"42", "43"}
    assert "max(BM25, zero-shot)" in bench.stdout

    # the same search once more, every trial cached: its folder is the first's, now the newest search of these
    # settings (what a search without a budget of its own replays), and its MLflow run holds its own report
    manifest = Path(result["report_dir"], "manifest.json")
    os.utime(manifest, (1e9, 1e9))
    second = json.loads(_ance(["tune", *search, "--json"], tmp_path).stdout.strip().splitlines()[-1])
    assert second["report_dir"] == result["report_dir"] and manifest.stat().st_mtime > 1e9
    report = client.download_artifacts(second["mlflow_run_id"], "tune/tune.md", str(tmp_path / "report"))
    assert f"{len(trials)} trials ({len(trials)} cached)" in Path(report).read_text()  # not the first's "(0 cached)"

    # the same search again: every trial cached; `ance run --recipe auto` trains the winner (its trial's stages). A
    # seed set on the base config is not the search's (its trials run under tune.seeds): said, and the trials reused
    again = _ance(["run", "--recipe", "auto", "--config", str(tmp_path / "c.json"), "--json", *settings,
                   "--set", "warmup.seed=7"], tmp_path)
    assert f"{len(trials)} trials ({len(trials)} cached)" in again.stdout
    assert "the config's warmup.seed 7 is not used" in again.stdout + again.stderr
    # the second search's run lists every trial too: each cached one a nested run pointing at the run that trained it
    searches = [r for r in client.search_runs([parent.info.experiment_id])
                if "mlflow.parentRunId" not in r.data.tags
                and r.info.run_id not in (parent.info.run_id, second["mlflow_run_id"])]
    assert len(searches) == 1 and searches[0].info.status == "FINISHED"
    pointers = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.mlflow.parentRunId = '{searches[0].info.run_id}'")
    assert len(pointers) == len(trials) and all(r.data.tags["cached"] == "true" for r in pointers)
    assert {r.data.tags["trial_run_id"] for r in pointers} == {r.info.run_id for r in nested}
    run = json.loads(again.stdout.strip().splitlines()[-1])
    assert (tmp_path / "work" / "latest.json").is_file() and client.search_registered_models()
    assert "ANCE round 1" in {r["model"] for r in run["results"]}
    assert run["recipe_search"]["winner"] == result["winner"] and run["recipe_search"]["reason"] == result["reason"]
