"""`selection: cv` end to end on the tiny collection: the run runs once more per other dev fold (a trial run nested
under its MLflow run), pools each model's dev nDCG@10 over every fold's dev queries, and chooses its result and its
hybrid row's dense model on that; a fold's run is the same stages as `ance run` with that `data.dev_fold` (cached
when run again). A fold with no dev query is refused before any training. A recipe search under cv scores each trial
pooled over the folds."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from mlflow.tracking import MlflowClient

from ance_core.artifacts import PER_QUERY
from ance_core.pipeline.report import select_model
from tests.tiny import failure_report, run_pipeline_cli, tiny_pipeline_config

pytestmark = pytest.mark.slow


def _ance(args: list[str], tmp_path, timeout: int = 900) -> subprocess.CompletedProcess:
    """`ance <args>` in a subprocess with its own PREFECT_HOME under `tmp_path` (its exit status is the caller's to
    check)."""
    return subprocess.run([sys.executable, "-m", "ance_cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")})


def test_selection_cv_pools_the_dev_folds_and_chooses_on_them(tiny_scifact, tiny_model, tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    config["data"] |= {"dev_fraction": 0.5}
    (tmp_path / "c.json").write_text(json.dumps(config | {"selection": "cv"}))
    proc = _ance(["run", "--config", str(tmp_path / "c.json"), "--json"], tmp_path, timeout=1200)
    assert proc.returncode == 0, failure_report(proc)
    result, out = json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout
    assert "| dev nDCG@10 | dev nDCG@10, 2 folds |" in out and "queries of 2 dev folds (selection cv" in out
    assert f"Result: {result['selected']} (the best dev nDCG@10 of the run's models pooled over its dev folds" in out
    assert result["selection"] == "cv"
    # the fold's own run names its lines as the fold's (in Prefect's log, whose console may wrap a line); the run's
    # own closing lines are the only bare ones
    logged = " ".join(proc.stderr.split())
    assert "[dev fold 1] Result: " in logged and "[dev fold 1] its models:" in logged
    assert len(re.findall(r"^Result: ", out, re.M)) == 1
    rows = {r["model"]: r for r in result["results"]}
    candidates = [m for m in rows if m != "BM25"]
    assert all(rows[m]["cv_queries"] == 40 for m in candidates)  # the tiny collection's 40 training queries, once
    pooled = [{"model": m, "dev_ndcg_at_10": rows[m]["cv_ndcg_at_10"]} for m in candidates]
    assert result["selected"] == select_model(pooled, candidates)
    assert result["best_on_dev"] == select_model(result["results"], candidates)
    dense = [m for m in candidates if not m.endswith(" + BM25")]
    hybrid = next(m for m in candidates if m.endswith(" + BM25"))
    assert hybrid == select_model([p for p in pooled if p["model"] in dense], dense) + " + BM25"

    # fold 1 alone: `ance run` with data.dev_fold 1 is the run cv made (every stage reused), and the pooled score of
    # each dense model is the two folds' dev scores weighted by their queries
    fold_dir = tmp_path / "fold1"
    fold_dir.mkdir()
    fold, _ = run_pipeline_cli(config | {"data": config["data"] | {"dev_fold": 1}}, fold_dir, timeout=1200)
    assert all(s["cached"] for s in fold["stages"] if s["stage"] != "report"), \
        [s for s in fold["stages"] if not s["cached"]]
    dev_paths = {s["for"]: s["path"] for s in result["stages"] if s["stage"] == "evaluate-dev"}
    n0 = len(pd.read_parquet(Path(dev_paths["zero-shot"], PER_QUERY)))
    fold_rows = {r["model"]: r for r in fold["results"]}
    for model in ("zero-shot", "warmup", "ANCE round 1"):
        expected = (rows[model]["dev_ndcg_at_10"] * n0 + fold_rows[model]["dev_ndcg_at_10"] * (40 - n0)) / 40
        assert rows[model]["cv_ndcg_at_10"] == pytest.approx(expected, abs=1e-9)

    # MLflow: the fold's run is a trial nested under the run; the run says which rule chose
    client = MlflowClient(result["mlflow_uri"])
    parent = client.get_run(result["mlflow_run_id"])
    assert (parent.data.tags["selection"], parent.data.tags["result_model"]) == ("cv", result["selected"])
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{parent.info.run_id}' and tags.trial = 'true'")
    assert [r.data.tags["mlflow.runName"] for r in children] == ["dev fold 1"]


def test_selection_cv_refuses_a_fold_without_dev_queries_before_any_training(tiny_scifact, tiny_model, tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    config["data"] |= {"dev_fraction": 0.02}  # 50 folds of 40 training queries: some hold none
    (tmp_path / "c.json").write_text(json.dumps(config | {"selection": "cv"}))
    proc = _ance(["run", "--config", str(tmp_path / "c.json")], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert re.search(r"selection cv: dev fold \d+ of data.dev_fraction 0.02 leaves no dev queries", out), out[-3000:]
    assert "Traceback" not in out and not (tmp_path / "work" / "train").exists()
    # a recipe search under cv: refused the same way before its first trial
    proc = _ance(["tune", "--config", str(tmp_path / "c.json"), "--tune-set", "learning_rates=[5e-4]"], tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert re.search(r"selection cv: dev fold \d+ of data.dev_fraction 0.02 leaves no dev queries", out), out[-3000:]
    assert "Traceback" not in out and not (tmp_path / "work" / "trial").exists()


def test_a_recipe_search_under_cv_scores_each_trial_pooled_over_the_dev_folds(tiny_scifact, tiny_model, tmp_path):
    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    config["data"] |= {"dev_fraction": 0.5}
    (tmp_path / "c.json").write_text(json.dumps(config | {"selection": "cv"}))
    proc = _ance(["tune", "--config", str(tmp_path / "c.json"), "--json", "--tune-set", "seeds=[42]", "--tune-set",
                  "learning_rates=[5e-4]", "--tune-set", "warmup_epochs=[1]"], tmp_path, timeout=1500)
    assert proc.returncode == 0, failure_report(proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "dense model each trial delivers, pooled over the 2 dev folds: selection cv)" in proc.stdout
    trials = result["trials"]
    assert [(t["rung"], t["full"]) for t in trials] == [(0, False), (0, False), (1, True), (1, True)]
    client = MlflowClient(f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    for t in trials:  # the score: the delivered model's dev nDCG@10 pooled over both folds' 40 queries, not its own
        record = json.loads(Path(t["path"], "trial.json").read_text())
        rows = {r["model"]: r for r in record["results"]}
        assert rows[t["model"]]["cv_queries"] == 40 and t["score"] == rows[t["model"]]["cv_ndcg_at_10"]
        assert t["model"] == ("warmup" if not t["full"] else
                              select_model([{"model": m, "dev_ndcg_at_10": r["cv_ndcg_at_10"]} for m, r in rows.items()
                                            if m != "BM25" and not m.endswith(" + BM25")],
                                           [m for m in rows if m != "BM25" and not m.endswith(" + BM25")]))
        # each fold's run is nested under its trial's run, itself under the search's
        folds = client.search_runs([client.get_run(t["mlflow_run_id"]).info.experiment_id],
                                   f"tags.mlflow.parentRunId = '{t['mlflow_run_id']}' and tags.trial = 'true'")
        trial_name = f"{t['candidate']} · seed 42{'' if t['full'] else ' · warm-up only'}"
        assert [r.data.tags["mlflow.runName"] for r in folds] == [f"{trial_name} · dev fold 1"]
    chosen = yaml.safe_load(Path(result["report_dir"], "recipe.yaml").read_text())
    assert chosen["selection"] == "cv"
