import math

import pandas as pd
import pytest

from ance_core.retrieval.evaluate import evaluate_run
from ance_core.stage_config import KEY_DUMP


def test_metrics_against_hand_computed_values():
    qrels = pd.DataFrame({"query_id": ["1", "1", "2", "3"], "doc_id": ["a", "b", "c", "e"], "relevance": [1, 1, 1, 1]})
    run = pd.DataFrame({"query_id": ["1", "1", "1", "3"], "doc_id": ["x", "a", "b", "e"],
                        "score": [3.0, 2.0, 1.0, 5.0]})
    metrics, per_query = evaluate_run(run, qrels)
    # query 1: relevant at ranks 2 and 3; query 2: nothing retrieved (counts as 0); query 3: relevant at rank 1
    ndcg1 = (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3))
    assert per_query.set_index("query_id").loc["1", "ndcg_at_10"] == pytest.approx(ndcg1)
    assert metrics["ndcg_at_10"] == pytest.approx((ndcg1 + 0 + 1) / 3)
    assert metrics["mrr_at_10"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert metrics["recall_at_100"] == pytest.approx((1 + 0 + 1) / 3)
    assert len(per_query) == 3


def test_a_hit_whose_document_is_the_query_is_dropped_before_scoring_as_beir_does(tmp_path):
    """ArguAna / Quora shape: each query is also a corpus document and ranks itself first. BEIR's evaluator drops it
    (ignore_identical_ids); kept, it pushes the relevant document down."""
    from ance_core.retrieval.evaluate import without_identical_ids, write_evaluation

    run = pd.DataFrame({"query_id": ["q1", "q1", "q1", "q2", "q2"], "doc_id": ["q1", "d1", "d2", "d3", "q2"],
                        "rank": [1, 2, 3, 1, 2], "score": [9.0, 5.0, 4.0, 8.0, 7.0]})
    qrels = pd.DataFrame({"query_id": ["q1", "q2"], "doc_id": ["d1", "d3"], "relevance": [1, 1]})
    assert without_identical_ids(run)[["doc_id", "rank"]].values.tolist() == [["d1", 1], ["d2", 2], ["d3", 1]]
    (tmp_path / "kept").mkdir(), (tmp_path / "dropped").mkdir()
    kept = write_evaluation(run, qrels, tmp_path / "kept", "t")
    dropped = write_evaluation(run, qrels, tmp_path / "dropped", "t", ignore_identical_ids=True)
    assert dropped["mrr_at_10"] == 1.0 and kept["mrr_at_10"] == 0.75  # q1's answer back at rank 1
    assert "q1 Q0 q1" not in (tmp_path / "dropped" / "run.trec").read_text()  # the run evaluated is the run kept


def test_identical_ids_are_kept_where_the_qrels_judge_a_query_own_id_relevant(capsys):
    """Found by a review: classic collections number their queries and documents apart (CISI judges 7 pairs, MED 1,
    of a query and the document of the same number relevant), and the BEIR rule dropped those relevant hits; on a
    collection numbered so throughout (query i's answer is document i) every score was 0, without a word."""
    from ance_core.retrieval.config import EvalConfig
    from ance_core.retrieval.evaluate import identical_ids_rule

    arguana = pd.DataFrame({"query_id": ["q1", "q2"], "doc_id": ["d1", "d3"], "relevance": [1, 1],
                            "split": ["test", "test"]})
    assert identical_ids_rule(EvalConfig(), arguana).ignore_identical_ids and not capsys.readouterr().out
    classic = pd.DataFrame({"query_id": ["1", "2", "7"], "doc_id": ["4", "2", "7"], "relevance": [1, 0, 2],
                            "split": ["test", "test", "train"]})  # (2-2 is judged not relevant: no evidence)
    assert not identical_ids_rule(EvalConfig(), classic).ignore_identical_ids
    assert ("evaluation: 1 qrels judge a document relevant to the query of the same id (e.g. query '7' and document "
            "'7', split train): the collection numbers its queries and documents apart") in capsys.readouterr().out
    off = EvalConfig(ignore_identical_ids=False)
    assert identical_ids_rule(off, classic) is off


def test_the_evaluate_stage_key_is_unchanged_when_identical_ids_are_kept():
    from ance_core.retrieval.config import EvalConfig
    from tasks.evaluate import evaluate_key

    assert EvalConfig().ignore_identical_ids  # on by default, like BEIR: a new key (other metrics)
    assert evaluate_key("test", EvalConfig(ignore_identical_ids=False)) == {"split": "test"}  # the key from before
    assert evaluate_key("test", EvalConfig()) != {"split": "test"}


def test_a_trec_run_file_reads_back_ranked_by_score_and_bad_lines_are_named(tmp_path):
    from ance_core.errors import AnceWarning, DataError
    from ance_core.retrieval.search import read_trec, write_trec

    run = pd.DataFrame({"query_id": ["q1", "q1", "q2"], "doc_id": ["a", "b", "c"], "rank": [1, 2, 1],
                        "score": [2.5, 1.0, 0.5]})
    write_trec(run, tmp_path / "run.trec", "my model")  # a tag is one column: its space written as _
    pd.testing.assert_frame_equal(read_trec(tmp_path / "run.trec"), run)
    # float64 scores (a fused run's) read back exactly: two RRF sums (ranks 5 and 150, 3 and 174) that 9 digits tied
    fused = pd.DataFrame({"query_id": ["q1", "q1"], "doc_id": ["a", "b"], "rank": [1, 2],
                          "score": [1 / 65 + 1 / 210, 1 / 63 + 1 / 234]})
    assert fused["score"].iloc[0] > fused["score"].iloc[1]
    write_trec(fused, tmp_path / "fused.trec", "fused")
    pd.testing.assert_frame_equal(read_trec(tmp_path / "fused.trec"), fused, check_exact=True)  # (evaluation
    # ranks a tie as trec_eval does, by document id: b first)
    (tmp_path / "fused.trec").unlink()
    assert {line.split()[-1] for line in (tmp_path / "run.trec").read_text().splitlines()} == {"my_model"}
    with pytest.raises(KeyError):  # a failure leaves no file, whole or half
        write_trec(run.drop(columns="score"), tmp_path / "failed.trec", "sys")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.trec"]
    with pytest.raises(DataError, match=r": a folder, not a file"):
        read_trec(tmp_path)
    (tmp_path / "other.trec").write_text("q1 Q0 b 1 1.0 x\nq1 Q0 a 2 3.0 x\nq1 Q0 a 3 0.1 x\n")  # its ranks ignored
    with pytest.warns(AnceWarning, match="1 lines repeat a .* q1/a"):
        assert read_trec(tmp_path / "other.trec")[["doc_id", "rank"]].values.tolist() == [["a", 1], ["b", 2]]
    (tmp_path / "bad.trec").write_text("q1 Q0 a 1 2.0 x\nq1 a 1 2.0\n")  # one bad line: left out, named
    with pytest.warns(AnceWarning, match=r"bad.trec: 1 of its 2 rows .* left out: line 2: expected 6 whitespace-"):
        assert read_trec(tmp_path / "bad.trec")["doc_id"].tolist() == ["a"]
    (tmp_path / "bad.trec").write_text("q1 a 1 2.0\nq1 a 1 2.0\n")  # nothing readable: the first line named
    with pytest.raises(DataError, match=r"bad.trec:1: expected 6 whitespace-separated columns"):
        read_trec(tmp_path / "bad.trec")
    (tmp_path / "latin.trec").write_bytes(b"q1 Q0 caf\xe9 1 2.0 x\n")
    with pytest.warns(AnceWarning, match=r"latin.trec:1: not valid UTF-8 \(byte 9 of the line\)"):
        assert read_trec(tmp_path / "latin.trec")["doc_id"].tolist() == ["caf\ufffd"]


def test_per_query_metrics_are_those_ir_measures_gives_for_the_tables():
    """The run and qrels go to trec_eval as nested dicts built from plain lists (8x faster than ir_measures' own
    conversion of the DataFrames): the same values, ties of score and unjudged queries included."""
    import ir_measures
    import numpy as np

    from ance_core.retrieval.evaluate import _NAMES, MEASURES, per_query_metrics

    rng = np.random.default_rng(0)
    run = pd.DataFrame([(f"q{q}", f"d{d}", float(rng.integers(0, 5)))  # few distinct scores: many ties
                        for q in range(30) for d in rng.choice(300, 120, replace=False)],
                       columns=["query_id", "doc_id", "score"]).astype({"query_id": "string", "doc_id": "string"})
    qrels = pd.DataFrame([(f"q{q}", f"d{d}", int(rng.integers(1, 4))) for q in range(33)  # 3 queries the run lacks
                          for d in rng.choice(300, 8, replace=False)], columns=["query_id", "doc_id", "relevance"])
    expected = {(m.query_id, _NAMES[str(m.measure)]): m.value
                for m in ir_measures.iter_calc(list(MEASURES.values()), qrels, run)}
    got = per_query_metrics(run, qrels).set_index("query_id")
    assert len(got) == 33 and (got.loc[["q30", "q31", "q32"]] == 0).all().all()
    for (q, name), value in expected.items():  # trec_eval's own measures: the same on the ties
        if name != "mrr_at_10":
            assert got.loc[q, name] == pytest.approx(value, abs=1e-12)
    # RR@10 (another provider, which broke ties the other way): on trec_eval's order of the ties
    order = run.assign(key=run["doc_id"].astype(str)).sort_values(["query_id", "score", "key"],
                                                                  ascending=[True, False, False])
    order = order.assign(score=-order.groupby("query_id").cumcount().astype(float))
    ranked = {m.query_id: m.value for m in ir_measures.iter_calc([MEASURES["mrr_at_10"]], qrels, order)}
    assert got.loc[list(ranked), "mrr_at_10"].tolist() == pytest.approx(list(ranked.values()), abs=1e-12)
    assert sum(got.loc[q, "mrr_at_10"] != expected[(q, "mrr_at_10")] for q in ranked) > 0  # (the ties mattered)


def test_tied_scores_rank_one_way_for_every_metric_the_trec_file_and_its_read_back(tmp_path):
    """nDCG@10 (pytrec_eval: equal scores, the greater document id first) and RR@10 (ir_measures' other provider: the
    smaller first) scored two rankings of one run; a TREC file at 6 decimals read back ties that were not ties."""
    from ance_core.retrieval.evaluate import write_evaluation
    from ance_core.retrieval.search import read_trec

    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]})
    tie = pd.DataFrame({"query_id": ["q", "q"], "doc_id": ["a", "b"], "score": [1.0, 1.0], "rank": [1, 2]})
    metrics, _ = evaluate_run(tie, qrels)
    assert metrics["mrr_at_10"] == 0.5 and metrics["ndcg_at_10"] == pytest.approx(1 / math.log2(3))  # b, then a
    close = pd.DataFrame({"query_id": ["q", "q"], "doc_id": ["a", "b"], "score": [0.5000004, 0.5000001],
                          "rank": [1, 2]})
    (tmp_path / "e").mkdir()
    written = write_evaluation(close, qrels, tmp_path / "e", tag="t")
    assert written["ndcg_at_10"] == 1.0
    back = read_trec(tmp_path / "e" / "run.trec")
    assert evaluate_run(back, qrels)[0] == written  # (it read 0.631: the two lines said 0.500000)
    (tmp_path / "t").mkdir()
    write_evaluation(tie, qrels, tmp_path / "t", tag="t")  # the file lists the ranking scored, in its order
    assert [line.split()[2] for line in (tmp_path / "t" / "run.trec").read_text().splitlines()] == ["b", "a"]


def test_a_document_listed_twice_for_a_query_counts_where_it_ranked_best():
    """trec_eval refuses such a run; here the later, lower copy used to replace the first in the judged ranking."""
    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]})
    run = pd.DataFrame({"query_id": ["q"] * 3, "doc_id": ["a", "b", "a"], "score": [0.9, 0.8, 0.1]})
    metrics, _ = evaluate_run(run, qrels)
    assert metrics["ndcg_at_10"] == 1.0 and metrics["mrr_at_10"] == 1.0


def test_ids_that_are_not_strings_are_scored_as_their_text():
    """Ids read by pandas as integers (a qrels TSV of numeric ids): every query counted, not a row of zeros."""
    qrels = pd.DataFrame({"query_id": [1, 2], "doc_id": [10, 20], "relevance": [1, 1]})
    run = pd.DataFrame({"query_id": [1, 2], "doc_id": ["10", 30], "score": [1.0, 1.0]})
    metrics, per_query = evaluate_run(run, qrels)
    assert per_query["query_id"].tolist() == ["1", "2"] and per_query["ndcg_at_10"].tolist() == [1.0, 0.0]
    assert metrics["ndcg_at_10"] == 0.5


def test_a_run_file_listing_a_document_twice_keeps_it_where_it_scored_best(tmp_path):
    """`ance evaluate --run` kept the first line of a repeated (query, document) pair, the pipeline's own evaluation
    the best-scoring one: the same rows ranked two ways."""
    from ance_core.errors import AnceWarning
    from ance_core.retrieval.search import read_trec

    (path := tmp_path / "dup.trec").write_text("q Q0 d1 1 1.0 x\nq Q0 d2 2 5.0 x\nq Q0 d1 3 9.0 x\n")
    with pytest.warns(AnceWarning, match="the best-scoring line is kept: q/d1"):
        run = read_trec(path)
    assert run["doc_id"].tolist() == ["d1", "d2"] and run["score"].tolist() == [9.0, 5.0]
    assert run["rank"].tolist() == [1, 2]


def test_a_relevant_grade_of_2_counts_grade_1_documents_as_not_relevant_in_mrr_and_recall_only(tmp_path):
    """TREC Deep Learning's passage collections grade 0-3 and count 2 and 3 as relevant for the binary metrics
    (trec_eval -l 2): MRR@10 and recall counted its 'related' grade 1 too, above the published figures."""
    from ance_core.retrieval.config import EvalConfig
    from tasks.evaluate import evaluate_key

    qrels = pd.DataFrame({"query_id": ["1", "1", "1"], "doc_id": ["a", "b", "c"], "relevance": [1, 2, 1]})
    run = pd.DataFrame({"query_id": ["1", "1", "1"], "doc_id": ["a", "x", "b"], "score": [3.0, 2.0, 1.0]})
    any_grade, _ = evaluate_run(run, qrels)
    graded, _ = evaluate_run(run, qrels, relevant_grade=2)
    assert any_grade["mrr_at_10"] == pytest.approx(1.0) and graded["mrr_at_10"] == pytest.approx(1 / 3)
    assert any_grade["recall_at_100"] == pytest.approx(2 / 3) and graded["recall_at_100"] == pytest.approx(1.0)
    assert any_grade["ndcg_at_10"] == graded["ndcg_at_10"] < 1.0  # (gains by the grades either way)
    # the default keeps every key and digest it had; another grade is an evaluation of its own
    assert "relevant_grade" not in EvalConfig().model_dump(context=KEY_DUMP)
    assert "relevant_grade" not in repr(EvalConfig())
    assert evaluate_key("test", EvalConfig()) == {"split": "test", "ignore_identical_ids": True}
    assert evaluate_key("test", EvalConfig(relevant_grade=2))["relevant_grade"] == 2


def test_a_run_shallower_than_a_metrics_cutoff_is_said(recwarn):
    """`eval.top_k: 100` left the R@1000 column as recall at 100, under its name: one warning per setting says so."""
    from ance_core.errors import AnceWarning
    from ance_core.retrieval.evaluate import warn_shallow

    warn_shallow({"eval.top_k": 1000, "bm25.top_k": 1000})
    assert not recwarn.list
    with pytest.warns(AnceWarning) as caught:
        warn_shallow({"eval.top_k": 100, "bm25.top_k": 50})
    assert [str(w.message) for w in caught] == [
        "eval.top_k is 100: the runs it scores hold 100 documents a query, so R@1000 reads the metric at 100 (set it "
        "to at least 1000 for the columns as named)",
        "bm25.top_k is 50: the runs it scores hold 50 documents a query, so R@100, R@1000 read the metric at 50 (set "
        "it to at least 1000 for the columns as named)"]
