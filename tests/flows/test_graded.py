"""Training that makes the model worse is caught and never handed back silently, on a small graded collection with
many weak positives (tests/tiny.py: build_graded_dataset), with the real all-MiniLM-L6-v2 (offline package):

- trained on every grade (`train_min_relevance: 1`) the negatives statistics flag that most training negatives
  outscore their positive. At the default learning rate the random grade-1 links cost this small dev split only
  0.002-0.01 nDCG@10 (within its noise), so the run that must be caught is made plainly harmful with a learning
  rate 50x the default (a misconfigured run; 12 steps of it are plenty): its warm-up scores worse on the dev split
  than the model it started from, the ANCE round after it starts from that better model (the best so far on dev),
  the run's result is that starting model, and the run warns (closing lines, --json, MLflow);
- with the default (`auto`: each query's own top grade on graded qrels) it trains on the grade-2 positives only,
  says what it left out, and does not make the model worse."""


import pytest
from mlflow.tracking import MlflowClient

from ance_core.pipeline.report import select_model
from tests.tiny import build_graded_dataset, run_pipeline_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def graded(scifact_dir, tmp_path_factory):
    return build_graded_dataset(scifact_dir, tmp_path_factory.mktemp("graded") / "graded", documents=250)


def run_pipeline(data, tmp_path, min_relevance, rounds: int = 0, selection: str = "best", **train
                 ) -> tuple[dict, str]:
    train = {"epochs": 1, "batch_size": 16, "passage_max_length": 64} | train  # (64 tokens: the harm shows as well)
    config = {"data": {"dataset": str(data), "train_min_relevance": min_relevance, "dev_fraction": 0.25},
              "model": {"passage_max_length": 64}, "warmup": train, "ance": train, "rounds": rounds,
              "selection": selection, "work_dir": str(tmp_path / "work")}
    return run_pipeline_cli(config, tmp_path, timeout=1200)


def test_training_that_hurts_is_caught_and_the_run_says_so(graded, tmp_path):
    result, out = run_pipeline(graded, tmp_path, 1, rounds=1, selection="one-se", learning_rate=1e-3,
                               max_steps=12)  # harm in a few steps; the result by the one-standard-error rule
    dev = {r["model"]: r["dev_ndcg_at_10"] for r in result["results"]}
    assert dev["warmup"] < dev["zero-shot"] - 0.02, dev  # the failure, reproduced
    # the round starts from the best model so far on dev, not from the warm-up that made it worse
    assert "ANCE round 1 trained from zero-shot, the best model before it on the dev split, not from warmup" in out
    # the result is the pretrained model (alone, or fused with BM25: the hybrid row of the best dense model on dev)
    assert result["selected"] in ("zero-shot", "zero-shot + BM25")
    assert result["final_checkpoint"].split("/")[-2] == "model"
    warning = next(w for w in result["warnings"] if w.startswith("warmup made the model worse on the dev split"))
    assert f"WARNING: {warning}" in out and f"Result: {result['selected']}" in out
    stats = result["negatives"]["warmup"]
    assert stats["above_positive"] > 0.25  # most BM25 negatives outscore a random "positive"
    assert any("score above their positive" in w for w in result["warnings"])
    client = MlflowClient(result["mlflow_uri"])
    parent = client.get_run(result["mlflow_run_id"])
    assert parent.data.tags["result_model"] == result["selected"]
    assert (parent.data.tags["selection"], parent.data.tags["best_on_dev"]) == ("one-se", result["best_on_dev"])
    models = [r["model"] for r in result["results"] if r["model"] != "BM25"]
    assert result["best_on_dev"] == select_model(result["results"], models)
    assert "made the model worse" in parent.data.tags["warnings"]
    champion = client.get_model_version_by_alias(f"ance-{graded.name}", "champion")
    assert champion.tags["label"] == "zero-shot"  # the run's result chosen on dev (a hybrid's: its dense model)


def test_the_default_trains_on_the_top_grade_and_does_not_hurt(graded, tmp_path):
    result, out = run_pipeline(graded, tmp_path, "auto")
    dev = {r["model"]: r["dev_ndcg_at_10"] for r in result["results"]}
    assert dev["warmup"] >= dev["zero-shot"]
    assert not any("made the model worse" in w for w in result["warnings"])
    grades = next(w for w in result["warnings"] if w.startswith("training positives are the"))
    assert "at each query's own top grade" in grades and "queries by their top grade: 2: " in grades
    assert result["negatives"]["warmup"]["above_positive"] < 0.25
