import numpy as np
import pandas as pd
import pytest

from ance_core.errors import AnceError, AnceWarning
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.mining import drop_positives, sample_negatives
from ance_core.negatives.samplers import sample_uniform
from ance_core.retrieval.search import run_frame

CORPUS = [f"d{j}" for j in range(100)] + ["d-unretrieved", "d-x"]


def _run(n_queries=5, depth=50, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.array([[f"d{j}" for j in rng.permutation(100)[:depth]] for _ in range(n_queries)], dtype=object)
    scores = -np.sort(rng.random((n_queries, depth)), axis=1)
    return run_frame([f"q{i}" for i in range(n_queries)], ids, -scores)


def ance_negatives(run, positives, top_k, n, seed, round_, corpus_ids):
    """n negatives per pair from the top-k of `run` minus the positives (the `ance` sampler)."""
    cfg = MiningConfig(sampler="ance", top_k=top_k, num_negatives=n, seed=seed)
    return sample_negatives(cfg, positives, round_, {"dense": run}, corpus_ids)


def _positives(run):
    top = run[run["rank"] <= 3]
    return {q: set(g["doc_id"]) | {"d-unretrieved"} for q, g in top.groupby("query_id")}


def test_never_returns_a_positive_and_respects_top_k():
    run = _run()
    positives = _positives(run)
    neg = ance_negatives(run, positives, top_k=20, n=4, seed=1, round_=1, corpus_ids=CORPUS)
    assert len(neg) == sum(len(p) for p in positives.values())  # one row per (query, positive)
    for row in neg.itertuples():
        assert not set(row.negative_ids) & positives[row.query_id]
        assert len(set(row.negative_ids)) == 4  # no duplicates
        assert all(r <= 20 for r in row.negative_ranks)
        assert row.negative_ranks == sorted(row.negative_ranks)


def test_deterministic_for_seed_round_and_query():
    run = _run()
    positives = _positives(run)
    a = ance_negatives(run, positives, 30, 3, seed=7, round_=2, corpus_ids=CORPUS)
    b = ance_negatives(run.sample(frac=1, random_state=3), positives, 30, 3, seed=7, round_=2, corpus_ids=CORPUS)
    pd.testing.assert_frame_equal(a, b)
    c = ance_negatives(run, positives, 30, 3, seed=7, round_=3, corpus_ids=CORPUS)
    assert a["negative_ids"].tolist() != c["negative_ids"].tolist()


def test_sampling_is_uniform_over_candidates():
    ranked = pd.DataFrame({"doc_id": [f"d{i}" for i in range(10)], "rank": range(1, 11), "score": range(10)})
    candidates = drop_positives(ranked, {"d0", "d5"}, top_k=10)
    assert candidates["doc_id"].tolist() == ["d1", "d2", "d3", "d4", "d6", "d7", "d8", "d9"]
    rng = np.random.default_rng(0)
    counts = pd.Series([d for _ in range(4000) for d in sample_uniform(candidates, 2, rng)["doc_id"]]).value_counts()
    assert set(counts.index) == set(candidates["doc_id"])
    assert counts.max() / counts.min() < 1.2  # each of 8 candidates drawn ~1000 times


def test_too_few_candidates_fall_back_to_random_documents_with_one_warning():
    """A short ranking (3 candidates for 4 negatives) and no ranking at all (q9) still give 4 distinct negatives
    each, never a positive; the fallback ones are counted per row and named in one warning."""
    run = _run(n_queries=1, depth=5)
    with pytest.warns(AnceWarning) as caught:
        neg = ance_negatives(run, {"q0": {"d-x"}, "q9": {"d1"}}, top_k=3, n=4, seed=0, round_=0, corpus_ids=CORPUS)
    assert len(caught) == 1 and "2 of 2 queries" in str(caught[0].message) and "q0, q9" in str(caught[0].message)
    rows = {r.query_id: r for r in neg.itertuples()}
    assert rows["q0"].fallback == 1 and rows["q9"].fallback == 4
    for row in rows.values():
        assert len(set(row.negative_ids)) == 4 and not set(row.negative_ids) & {"d-x", "d1"}
    assert sum(r > 0 for r in rows["q0"].negative_ranks) == 3 and rows["q9"].negative_ranks == [0, 0, 0, 0]
    with pytest.raises(AnceError, match="needs the corpus ids"):
        ance_negatives(run, {"q0": {"d-x"}}, top_k=3, n=1, seed=0, round_=0, corpus_ids=None)


def test_ids_sorted_once_mine_the_same_negatives(monkeypatch):
    """`sorted_ids` sorts the corpus once for a caller that mines in parts; sample_negatives then sorts nothing and
    draws the same negatives as from the unsorted list."""
    import ance_core.negatives.mining as mining

    corpus = [f"d{i}" for i in range(60)][::-1]
    run = pd.DataFrame({"query_id": ["q1"] * 3, "doc_id": ["d1", "d2", "d3"], "rank": [1, 2, 3],
                        "score": [3.0, 2.0, 1.0]})
    cfg = MiningConfig(sampler="ance", num_negatives=6, top_k=3)  # 3 from the ranking, 3 random (the fallback)
    unsorted = sample_negatives(cfg, {"q1": {"d0"}}, 1, {"dense": run}, corpus, warn_short=False)
    once = mining.sorted_ids(corpus)
    monkeypatch.setattr(mining, "sorted_ids", lambda ids: pytest.fail("sorted again"))
    again = sample_negatives(cfg, {"q1": {"d0"}}, 1, {"dense": run}, once, warn_short=False)
    assert again["negative_ids"].tolist() == unsorted["negative_ids"].tolist()
    assert len(set(again["negative_ids"][0])) == 6
