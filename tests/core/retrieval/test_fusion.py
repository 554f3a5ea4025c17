"""Hybrid retrieval (ance_core/retrieval/fusion.py): the two fusions by hand, and the choice on the dev split."""

import pandas as pd
import pytest

from ance_core.errors import AnceError
from ance_core.retrieval.fusion import Fusion, candidates, choose_fusion, fuse


def _run(rows):
    return pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])


DENSE = _run([("q", "a", 0.9), ("q", "b", 0.5), ("q", "c", 0.1)])
BM25 = _run([("q", "c", 12.0), ("q", "d", 6.0), ("q", "b", 2.0)])


def test_reciprocal_rank_fusion_sums_one_over_k_plus_rank_of_each_run():
    run = fuse(DENSE, BM25, Fusion("rrf"))
    expected = {"a": 1 / 61, "b": 1 / 62 + 1 / 63, "c": 1 / 63 + 1 / 61, "d": 1 / 62}
    assert dict(zip(run["doc_id"], run["score"], strict=True)) == pytest.approx(expected)
    assert run["doc_id"].tolist() == ["c", "b", "a", "d"] and run["rank"].tolist() == [1, 2, 3, 4]


def test_bm25s_rows_of_score_0_are_filler_not_hits():
    """BM25 fills a query's run to its depth with documents that match no query term (score 0, at arbitrary ranks):
    under RRF they were ranked as hits, so with one BM25 match the filler at rank 2 outranked the dense model's own
    top hits (found by a review with `ance search --hybrid`); nor are they in a convex combination."""
    dense = _run([("q", "a", 0.9), ("q", "b", 0.8), ("q", "c", 0.7), ("q", "m", 0.1)])
    bm25 = _run([("q", "m", 2.4), ("q", "x", 0.0), ("q", "y", 0.0), ("q", "z", 0.0)])
    run = fuse(dense, bm25, Fusion("rrf"))
    assert run["doc_id"].tolist() == ["m", "a", "b", "c"]  # m: 1/64 + 1/61; no filler
    convex = fuse(dense, bm25, Fusion("convex", 0.5)).set_index("doc_id")["score"]
    # BM25's lone match scales to 1 (a run's hits of one score are all its best)
    assert convex[["a", "b", "c", "m"]].tolist() == pytest.approx([0.5, 0.5 * 7 / 8, 0.5 * 6 / 8, 0.5])
    assert sorted(convex.index) == ["a", "b", "c", "m"]


def test_a_convex_combination_scales_bm25s_matches_whatever_filler_follows_them():
    """The filler set BM25's minimum to 0 where a query matches fewer documents than the run's depth (its weakest
    match otherwise): one row of filler swapped b and d here. Where a query's own id was its only match (ArguAna,
    Quora), every filler row scaled to 1 and outranked the dense model's hits (nDCG@10 0.43 for 1.0; a review's)."""
    dense, bm25 = _run([("q", "e", 1.0), ("q", "d", 0.0), ("q", "b", -1.0)]), _run([("q", "b", 12.0), ("q", "d", 6.0),
                                                                                     ("q", "e", 4.0)])
    order = fuse(dense, bm25, Fusion("convex", 0.5))["doc_id"].tolist()
    assert order == ["e", "b", "d"]  # e: 0.5 + 0; b: 0 + 0.5; d: 0.25 + 0.125
    assert fuse(dense, pd.concat([bm25, _run([("q", "f", 0.0)])]), Fusion("convex", 0.5))["doc_id"].tolist() == order
    dense = _run([("1", "a", 0.9), ("1", "b", 0.5), ("1", "c", 0.1)])
    bm25 = _run([("1", "1", 7.0), ("1", "x", 0.0), ("1", "y", 0.0), ("1", "z", 0.0)])
    run = fuse(dense, bm25, Fusion("convex", 0.5), ignore_identical_ids=True)
    assert run["doc_id"].tolist() == ["a", "b", "c"]


def test_a_convex_combination_scales_each_runs_scores_of_the_query_to_0_1():
    run = fuse(DENSE, BM25, Fusion("convex", 0.7))
    # dense: a 1, b 0.5, c 0 (min-max); bm25: c 1, d 0.4, b 0; a document a run missed gets 0 from it
    expected = {"a": 0.7, "b": 0.7 * 0.5, "c": 0.3, "d": 0.3 * 0.4}
    assert dict(zip(run["doc_id"], run["score"], strict=True)) == pytest.approx(expected)


def test_depth_cuts_each_run_and_the_result():
    run = fuse(DENSE, BM25, Fusion("rrf"), depth=1)
    assert run["doc_id"].tolist() == ["c"]  # a (dense #1) and c (bm25 #1) tie at 1/61: trec_eval's order, c first


def test_the_dev_split_chooses_and_a_tie_goes_to_the_simpler_fusion():
    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]})
    chosen, scored = choose_fusion(DENSE, BM25, qrels)
    assert len(scored) == len(candidates()) == 10
    best = max(s["dev_ndcg_at_10"] for s in scored)
    assert chosen.method == "convex" and best == 1.0  # a first needs the dense run's weight above BM25's
    first = next(s for s in scored if s["dev_ndcg_at_10"] == best)
    assert (chosen.method, chosen.weight) == (first["method"], first["weight"]) and chosen.weight == 0.6
    qrels = pd.DataFrame({"query_id": ["q"], "doc_id": ["b"], "relevance": [1]})
    assert choose_fusion(DENSE, BM25, qrels)[0] == Fusion("rrf")  # b is second under RRF and under w = 0.5


def test_an_empty_dev_run_is_refused():
    with pytest.raises(AnceError, match="a dev run is empty"):
        choose_fusion(DENSE.iloc[:0], BM25, pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "relevance": [1]}))


def test_fused_ties_rank_as_trec_eval_ranks_them():
    """RRF ties are common (a dense-only and a BM25-only hit at the same rank): the fused run's `rank` (what a served
    search returns) put the smaller document id first, its evaluation the greater."""
    dense = pd.DataFrame({"query_id": ["q"], "doc_id": ["a"], "score": [3.0]})
    bm25 = pd.DataFrame({"query_id": ["q"], "doc_id": ["z"], "score": [7.0]})
    run = fuse(dense, bm25, Fusion("rrf"))
    assert run["doc_id"].tolist() == ["z", "a"] and run["rank"].tolist() == [1, 2]


def test_a_querys_own_id_leaves_both_runs_before_they_are_fused():
    """ArguAna's queries are documents: the query's own BM25 hit set the scale of the other scores (min-max), and the
    fused order of the rest changed with it; it was dropped only from the fused run."""
    dense = pd.DataFrame({"query_id": ["q1"] * 3, "doc_id": ["q1", "A", "B"], "score": [20.0, 12.0, 10.0]})
    bm25 = pd.DataFrame({"query_id": ["q1"] * 3, "doc_id": ["q1", "A", "B"], "score": [100.0, 1.0, 9.0]})
    convex = Fusion("convex", 0.5)
    assert fuse(dense, bm25, convex)["doc_id"].tolist() == ["q1", "A", "B"]  # (A above B: the scale was q1's)
    assert fuse(dense, bm25, convex, ignore_identical_ids=True)["doc_id"].tolist() == ["B", "A"]
    qrels = pd.DataFrame({"query_id": ["q1"], "doc_id": ["B"], "relevance": [1]})
    chosen, scored = choose_fusion(dense, bm25, qrels, ignore_identical_ids=True)
    assert next(s for s in scored if s["weight"] == 0.5)["dev_ndcg_at_10"] == 1.0


def test_a_run_whose_hits_of_a_query_share_one_score_counts_them_as_its_best():
    """A query with a single BM25 hit (or hits of one score): min-max made it 0, the value of a document the run does
    not have, so the match added nothing to the convex combination."""
    dense = pd.DataFrame({"query_id": ["q"] * 2, "doc_id": ["a", "b"], "score": [2.0, 1.0]})
    bm25 = pd.DataFrame({"query_id": ["q"], "doc_id": ["b"], "score": [4.0]})
    run = fuse(dense, bm25, Fusion("convex", 0.4)).set_index("doc_id")["score"]
    assert run["b"] == pytest.approx(0.6) and run["a"] == pytest.approx(0.4)
