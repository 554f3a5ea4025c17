import numpy as np
import pandas as pd
import pytest

from ance_core.errors import AnceError
from ance_core.mining import ance_negatives, drop_positives, sample_uniform
from ance_core.search import run_frame


def _run(n_queries=5, depth=50, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.array([[f"d{j}" for j in rng.permutation(100)[:depth]] for _ in range(n_queries)], dtype=object)
    scores = -np.sort(rng.random((n_queries, depth)), axis=1)
    return run_frame([f"q{i}" for i in range(n_queries)], ids, -scores)


def _positives(run):
    top = run[run["rank"] <= 3]
    return {q: set(g["doc_id"]) | {"d-unretrieved"} for q, g in top.groupby("query_id")}


def test_never_returns_a_positive_and_respects_top_k():
    run = _run()
    positives = _positives(run)
    neg = ance_negatives(run, positives, top_k=20, n=4, seed=1, round_=1)
    assert len(neg) == sum(len(p) for p in positives.values())  # one row per (query, positive)
    for row in neg.itertuples():
        assert not set(row.negative_ids) & positives[row.query_id]
        assert len(set(row.negative_ids)) == 4  # no duplicates
        assert all(r <= 20 for r in row.negative_ranks)
        assert row.negative_ranks == sorted(row.negative_ranks)


def test_deterministic_for_seed_round_and_query():
    run = _run()
    positives = _positives(run)
    a = ance_negatives(run, positives, 30, 3, seed=7, round_=2)
    b = ance_negatives(run.sample(frac=1, random_state=3), positives, 30, 3, seed=7, round_=2)
    pd.testing.assert_frame_equal(a, b)
    c = ance_negatives(run, positives, 30, 3, seed=7, round_=3)
    assert a["negative_ids"].tolist() != c["negative_ids"].tolist()


def test_sampling_is_uniform_over_candidates():
    ranked = pd.DataFrame({"doc_id": [f"d{i}" for i in range(10)], "rank": range(1, 11), "score": range(10)})
    candidates = drop_positives(ranked, {"d0", "d5"}, top_k=10)
    assert candidates["doc_id"].tolist() == ["d1", "d2", "d3", "d4", "d6", "d7", "d8", "d9"]
    rng = np.random.default_rng(0)
    counts = pd.Series([d for _ in range(4000) for d in sample_uniform(candidates, 2, rng)["doc_id"]]).value_counts()
    assert set(counts.index) == set(candidates["doc_id"])
    assert counts.max() / counts.min() < 1.2  # each of 8 candidates drawn ~1000 times


def test_too_few_candidates_is_a_clear_error():
    run = _run(n_queries=1, depth=5)
    with pytest.raises(AnceError, match="raise mining.top_k"):
        ance_negatives(run, {"q0": {"d-x"}}, top_k=3, n=4, seed=0, round_=0)
    with pytest.raises(AnceError, match="no retrieval results"):
        ance_negatives(run, {"q9": {"d1"}}, top_k=3, n=1, seed=0, round_=0)
