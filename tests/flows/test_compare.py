"""The compare-negatives flow end to end on the tiny SciFact subset (real Prefect flow, embedded MLflow store)."""

import json
import os
import subprocess
import sys

import pytest
from mlflow.tracking import MlflowClient

from tests.tiny import failure_report

pytestmark = pytest.mark.slow
SAMPLERS = ["bm25", "in-batch", "nce", "simans", "ance+bm25"]


def test_every_sampler_trains_from_the_same_warmup_with_the_same_budget(tiny_scifact, tiny_model, tmp_path):
    train = {"max_steps": 2, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3}
    config = {"samplers": SAMPLERS, "data": {"dataset": str(tiny_scifact)},
              "model": {"name": str(tiny_model), "passage_max_length": 48}, "warmup": train, "ance": train,
              "encode": {"batch_size": 32}, "work_dir": str(tmp_path),
              # margin: a shared option the BM25 sampler takes too (its candidates scored by the warm-up)
              "mining": {"top_k": 40, "num_negatives": 2, "margin": 0.5}}
    (tmp_path / "compare.yaml").write_text(json.dumps(config))
    proc = subprocess.run([sys.executable, "-m", "ance_cli", "compare", "--config", str(tmp_path / "compare.yaml"),
                           "--json"], capture_output=True, text=True, timeout=900,
                          env=os.environ | {"PREFECT_HOME": str(tmp_path / "prefect")})
    assert proc.returncode == 0, failure_report(proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["model"] for r in result["results"]] == ["BM25 warm-up", *SAMPLERS]
    for row in result["results"]:
        assert 0.0 <= row["ndcg_at_10"] <= 1.0 and 0.0 <= row["recall_at_1000"] <= 1.0
    assert set(result["train_seconds"]) == {"BM25 warm-up", *SAMPLERS}
    table = result["table"].splitlines()
    assert table[0].startswith("| sampler | nDCG@10 | MRR@10 | R@100 | R@1000 | train wall time (s)")
    assert [line.split(" | ")[0].strip("| ") for line in table[2:]] == ["BM25 warm-up", *SAMPLERS]
    for line in table[2:]:
        assert line.count("|") == 10
    # every sampler's model started from the warm-up checkpoint, with the same number of steps: the stage manifests
    # record each training stage's starting checkpoint (by digest) and its log has one line per step
    from ance_core.artifacts import read_manifest

    trained = [read_manifest(p) | {"folder": p} for p in (tmp_path / "train").iterdir() if not p.name.startswith(".")]
    models = {read_manifest(p)["key"] for p in (tmp_path / "model").iterdir() if not p.name.startswith(".")}
    warmups = [m for m in trained if m["inputs"]["checkpoint"] in models]
    assert len(warmups) == 1 and len(trained) == 1 + len(SAMPLERS)
    starts = sorted(m["inputs"]["checkpoint"] for m in trained if m is not warmups[0])
    assert starts == [warmups[0]["key"]] * len(SAMPLERS)
    assert all(len((m["folder"] / "train_log.jsonl").read_text().splitlines()) == 2 for m in trained)
    # ance+bm25 mined the warm-up model's ANN ranking and a BM25 ranking, both recorded as the mining's inputs
    mined = [read_manifest(p) for p in (tmp_path / "mine").iterdir() if not p.name.startswith(".")]
    both = [m for m in mined if "bm25_run" in m["inputs"]]
    assert len(both) == 1 and both[0]["inputs"]["run"] and both[0]["inputs"]["run"] != both[0]["inputs"]["bm25_run"]
    logs = {}
    client = MlflowClient(result["tracking"]["tracking_uri"])
    parent = client.get_run(result["tracking"]["run_id"])
    children = {r.info.run_name: r for r in client.search_runs(
        [parent.info.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")}
    assert set(children) == {"BM25 warm-up", *SAMPLERS}
    # finished, not FAILED by its final logging (it read a retrain's start checkpoint, which a comparison has none
    # of), and no sampler tagged as its result: nothing was chosen
    assert "error" not in result["tracking"] and parent.info.status == "FINISHED"
    assert "result_model" not in parent.data.tags and "ndcg_at_10" not in parent.data.metrics
    assert all(run.info.status == "FINISHED" for run in children.values())
    for sampler in SAMPLERS:  # each from its step 1: alternatives from one warm-up, laid on each other in Compare
        logs[sampler] = client.get_metric_history(children[sampler].info.run_id, "loss")
        assert [m.step for m in logs[sampler]] == [1, 2]
    assert "neg_overlap_top100" in children["simans"].data.metrics  # mined samplers get the negatives analysis
    assert "neg_overlap_top100" not in children["in-batch"].data.metrics
    plots = {a.path for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"plots/loss.png", "plots/grad_norms.png", "plots/negatives_overlap.png", "plots/score_profiles.png",
            "plots/sampled_ranks.png"} <= plots
    assert client.get_experiment(parent.info.experiment_id).name == "compare-negatives"
    files = {p.name for p in (tmp_path / "compare").glob("*/*")}  # the same table and plots as files
    assert {"comparison.md", "loss.png", "grad_norms.png", "score_profiles.png", "sampled_ranks.png"} <= files
