"""The results table: the run's result chosen on dev, and each stage's starting model (the best before it on dev)."""

import json
from pathlib import Path

import pandas as pd
import pytest

from ance_core.artifacts import MANIFEST, METRICS, PER_QUERY, ArtifactRef
from ance_core.errors import AnceError
from ance_core.pipeline.report import build_report, read_report

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


def _per_query_report(tmp_path, dev: dict[str, list[float]], rule: str) -> dict:
    """A report whose dev evaluations keep per-query nDCG@10 (queries q0, q1, ...), as the evaluate stage writes."""
    evaluations, dev_refs = [], {}
    for k, (label, values) in enumerate(dev.items()):
        evaluations.append((label, _evaluation(tmp_path / "test" / str(k), 0.5)))
        ref = _evaluation(tmp_path / "dev" / str(k), sum(values) / len(values))
        pd.DataFrame({"query_id": [f"q{i}" for i in range(len(values))], "ndcg_at_10": values}).to_parquet(
            Path(ref.path, PER_QUERY), index=False)
        dev_refs[label] = ref
    candidates = [label for label in dev if label != "BM25"]
    started = {"warmup": "zero-shot", "ANCE round 1": "warmup"}
    return build_report(evaluations, [], "test", "toy", dev_refs, "dev", candidates, started, rule)


NOISY = {  # ten dev queries: the round leads zero-shot by 0.03 on average, two queries up 0.4 and one down 0.25
    "BM25": [0.3] * 10,
    "zero-shot": [0.5] * 10,
    "warmup": [0.5] * 9 + [0.52],
    "ANCE round 1": [0.9, 0.9, 0.25] + [0.5] * 7,
}


def test_a_lead_within_one_standard_error_does_not_displace_the_simpler_model(tmp_path):
    report = _per_query_report(tmp_path, NOISY, "one-se")
    assert report["best_on_dev"] == "ANCE round 1"
    assert report["selected"] == "zero-shot" and report["selection"] == "one-se"
    # mean difference 0.055, standard error sd([0.4, 0.4, -0.25, 0 x 7]) / sqrt(10) = 0.1978 / 3.162 = 0.0626
    assert ("The run's result is **zero-shot**: the simplest of its models within one standard error of the best dev "
            "nDCG@10 (ANCE round 1: +0.0550 ± 0.0626 over 10 queries" in report["markdown"])
    assert "| **zero-shot** (result) |" in report["markdown"]
    assert _per_query_report(tmp_path / "best", NOISY, "best")["selected"] == "ANCE round 1"


def test_a_hybrid_row_is_the_result_only_when_its_lead_over_its_dense_model_is_beyond_the_error(tmp_path):
    steady = {"BM25": [0.3] * 10, "zero-shot": [0.5] * 10, "warmup": [0.6] * 10,
              "ANCE round 1": [0.7] * 9 + [0.6], "ANCE round 1 + BM25": [0.72] * 9 + [0.6]}
    report = _per_query_report(tmp_path, steady, "one-se")
    assert report["selected"] == "ANCE round 1 + BM25"  # its lead over its dense model: 0.018 ± 0.002, beyond
    assert report["best_on_dev"] == "ANCE round 1 + BM25"  # one error (and the round's over the warm-up too)
    steady["ANCE round 1 + BM25"] = [0.75, 0.65] * 5  # still the best, but its lead 0.010 ± 0.016: its dense model
    report = _per_query_report(tmp_path / "b", steady, "one-se")
    assert (report["best_on_dev"], report["selected"]) == ("ANCE round 1 + BM25", "ANCE round 1")


def test_without_per_query_scores_the_result_is_the_best_on_dev(tmp_path):
    scores = {"BM25": 0.40, "zero-shot": 0.50, "warmup": 0.51}
    evaluations = [(label, _evaluation(tmp_path / "test" / str(k), 0.5)) for k, label in enumerate(scores)]
    dev = {label: _evaluation(tmp_path / "dev" / str(k), v) for k, (label, v) in enumerate(scores.items())}
    report = build_report(evaluations, [], "test", "toy", dev, "dev", ["zero-shot", "warmup"], {}, "one-se")
    assert report["selected"] == "warmup" and report["selection"] == "best"
    assert report["warnings"] == ["selection one-se needs every model's per-query dev scores, and zero-shot, warmup "
                                  "have none (an evaluation from before they were kept): the result is the best on dev"]
    assert build_report(evaluations, [], "test", "toy", dev, "dev", ["zero-shot", "warmup"])["warnings"] == []


def test_a_report_written_before_the_selection_rules_reads_as_chosen_by_best(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"selected": "warmup", "results": []}))
    report = read_report(ArtifactRef(str(tmp_path), "r"))
    assert (report["best_on_dev"], report["selection"]) == ("warmup", "best")


def test_the_closing_line_names_the_best_model_when_the_rule_chose_a_simpler_one():
    from tracking.closing import closing_lines

    summary = {"run_url": "http://127.0.0.1:5000/#/runs/r", "delivered_late": 0, "undelivered_calls": 0}
    simpler = closing_lines(summary, "zero-shot", best="ANCE round 1")
    assert simpler[0] == ("Result: zero-shot (simpler than ANCE round 1, the best dev nDCG@10 of the run's models, "
                          "and within one standard error of it: selection one-se)")
    assert closing_lines(summary, "ANCE round 1", best="ANCE round 1")[0] == (
        "Result: ANCE round 1 (the best dev nDCG@10 of the run's models, the starting one included)")
    assert closing_lines(summary, "ANCE round 1 + BM25", best="zero-shot + BM25", selection="cv")[0] == (
        "Result: ANCE round 1 + BM25 (the best dev nDCG@10 of the run's models pooled over its dev folds: selection "
        "cv; on this run's dev split alone, zero-shot + BM25)")


def test_a_result_chosen_on_a_dev_split_under_thirteen_queries_is_warned_of(tmp_path):
    """MED (6 dev queries), LISA (5), DL19 (10): their dev splits could not see what training did on test
    (RESULTS.md); the user is told, in the table, the closing lines and the MLflow tag."""
    report = _per_query_report(tmp_path, NOISY, "best")  # ten dev queries
    small = [w for w in report["warnings"] if w.startswith("the result was chosen on 10 dev queries")]
    assert len(small) == 1 and "under 13 queries" in small[0] and "data.dev_fraction" in small[0]
    assert f"**Warning:** {small[0]}." in report["markdown"]
    thirteen = {label: values + values[:3] for label, values in NOISY.items()}
    assert not any("was chosen on" in w for w in _per_query_report(tmp_path / "b", thirteen, "best")["warnings"])


def _fold(folder: Path, scores: dict[str, list[float]], first: int) -> dict[str, ArtifactRef]:
    """Another dev fold's run's dev evaluations by kind (queries q<first>, q<first + 1>, ...)."""
    refs = {}
    for k, (kind, values) in enumerate(scores.items()):
        ref = _evaluation(folder / str(k), sum(values) / len(values))
        pd.DataFrame({"query_id": [f"q{first + i}" for i in range(len(values))], "ndcg_at_10": values}).to_parquet(
            Path(ref.path, PER_QUERY), index=False)
        refs[kind] = ref
    return refs


def test_selection_cv_chooses_on_every_folds_dev_queries_pooled(tmp_path):
    """On this run's ten dev queries the round leads; pooled with two other folds' runs (eight queries each, where
    the round trails zero-shot) zero-shot leads: cv delivers zero-shot, and says what one fold alone chose."""
    dev = {"BM25": [0.3] * 10, "zero-shot": [0.5] * 10, "ANCE round 1": [0.6] * 10, "ANCE round 1 + BM25": [0.55] * 10}
    other = {"zero-shot": [0.5] * 8, "ANCE round 1": [0.4] * 8, "hybrid": [0.45] * 8}
    folds = [_fold(tmp_path / "f1", other, 10), _fold(tmp_path / "f2", other, 18)]
    evaluations, dev_refs = [], {}
    for k, (label, values) in enumerate(dev.items()):
        evaluations.append((label, _evaluation(tmp_path / "test" / str(k), 0.5)))
        dev_refs[label] = ref = _evaluation(tmp_path / "dev" / str(k), sum(values) / len(values))
        pd.DataFrame({"query_id": [f"q{i}" for i in range(10)], "ndcg_at_10": values}).to_parquet(
            Path(ref.path, PER_QUERY), index=False)
    candidates = [label for label in dev if label != "BM25"]
    report = build_report(evaluations, [], "test", "toy", dev_refs, "dev", candidates, {}, "cv", folds)
    assert report["best_on_dev"] == "ANCE round 1" and report["selected"] == "zero-shot"
    assert report["selection"] == "cv"
    rows = {r["model"]: r for r in report["results"]}
    assert abs(rows["ANCE round 1"]["cv_ndcg_at_10"] - (0.6 * 10 + 0.4 * 16) / 26) < 1e-9
    assert rows["ANCE round 1 + BM25"]["cv_queries"] == 26 and "cv_ndcg_at_10" not in rows["BM25"]
    assert "| dev nDCG@10 | dev nDCG@10, 3 folds |" in report["markdown"]
    assert "over 26 queries of 3 dev folds" in report["markdown"] and "the best is ANCE round 1" in report["markdown"]
    assert not any("was chosen on" in w for w in report["warnings"])  # 26 pooled queries: not a small dev split
    # without folds (no other fold ran), cv chooses as best does
    alone = build_report(evaluations, [], "test", "toy", dev_refs, "dev", candidates, {}, "cv", None)
    assert alone["selected"] == "ANCE round 1" and alone["selection"] == "best"
    # folds that share dev queries (a dataset's own dev split) are refused, naming the queries
    with pytest.raises(AnceError, match=r"the dev folds share queries \(q0, q1, q2, q3, q4\)"):
        build_report(evaluations, [], "test", "toy", dev_refs, "dev", candidates, {}, "cv",
                     [_fold(tmp_path / "f3", other, 0)])



def test_a_relevant_grade_above_1_is_said_under_the_table(tmp_path):
    """MRR@10 and R@k of evaluations at eval.relevant_grade 2 count grade 2 and above: the table says so under it (its
    column names are those of grade 1); at grade 1 nothing is added."""
    def report(folder, config):
        evaluations = [(label, _evaluation(folder / label, 0.5)) for label in ("BM25", "zero-shot")]
        for _, ref in evaluations:  # as the evaluate stage's manifest records its key
            (Path(ref.path) / MANIFEST).write_text(json.dumps({"stage": "evaluate", "config": config}))
        return build_report(evaluations, [], "test", "toy")["markdown"]

    said = "MRR@10 and R@k count a document of qrels grade 2 or above as relevant (eval.relevant_grade)"
    assert said in report(tmp_path / "graded", {"split": "test", "relevant_grade": 2})
    assert "relevant" not in report(tmp_path / "plain", {"split": "test"})
