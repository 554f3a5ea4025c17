"""The results table: the run's result chosen on dev, and each stage's starting model (the best before it on dev)."""

import json

from ance_core.artifacts import METRICS, ArtifactRef
from ance_core.pipeline.report import build_report

METRIC_KEYS = ("ndcg_at_10", "mrr_at_10", "recall_at_100", "recall_at_1000")


def _evaluation(folder, ndcg: float) -> ArtifactRef:
    folder.mkdir(parents=True)
    (folder / METRICS).write_text(json.dumps(dict.fromkeys(METRIC_KEYS, ndcg)))
    return ArtifactRef(str(folder), folder.name)


def _report(tmp_path, dev_scores: dict[str, float], started_from: dict[str, str]) -> dict:
    evaluations = [(label, _evaluation(tmp_path / "test" / str(k), 0.5)) for k, label in enumerate(dev_scores)]
    dev = {label: _evaluation(tmp_path / "dev" / str(k), v) for k, (label, v) in enumerate(dev_scores.items())}
    candidates = [label for label in dev_scores if label != "BM25"]
    return build_report(evaluations, [], "test", "toy", dev, "dev", candidates, started_from)


def test_a_round_that_skipped_a_worse_warmup_says_where_it_started(tmp_path):
    scores = {"BM25": 0.40, "zero-shot": 0.50, "warmup": 0.45, "ANCE round 1": 0.55}
    report = _report(tmp_path, scores, {"warmup": "zero-shot", "ANCE round 1": "zero-shot"})
    lines = report["markdown"].splitlines()
    assert lines[2].startswith("| model | trained from | dev nDCG@10 | nDCG@10 |")
    row = next(line for line in lines if line.startswith("| **ANCE round 1** (result)"))
    assert row.startswith("| **ANCE round 1** (result) | zero-shot | 0.5500 |")
    assert ("ANCE round 1 trained from zero-shot, the best model before it on the dev split, not from warmup."
            in report["markdown"])
    assert report["selected"] == "ANCE round 1"
    assert report["warnings"] == ["warmup made the model worse on the dev split: nDCG@10 0.5000 (zero-shot) -> "
                                  "0.4500 (-0.0500)"]


def test_stages_that_each_continue_the_last_say_nothing_more(tmp_path):
    scores = {"BM25": 0.40, "zero-shot": 0.50, "warmup": 0.52, "ANCE round 1": 0.55}
    report = _report(tmp_path, scores, {"warmup": "zero-shot", "ANCE round 1": "warmup"})
    assert "the best model before it" not in report["markdown"]
    assert "| warmup | zero-shot | 0.5200 |" in report["markdown"]
    assert "| zero-shot | — | 0.5000 |" in report["markdown"]
