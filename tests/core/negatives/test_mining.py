import numpy as np
import pandas as pd
import pytest

from ance_core.errors import AnceError, AnceWarning
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.mining import sample_negatives
from ance_core.negatives.samplers import MINED, SAMPLERS
from ance_core.retrieval.search import run_frame
from ance_core.stage_config import KEY_DUMP

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
        assert list(row.negative_ranks) == sorted(row.negative_ranks)


def test_deterministic_for_seed_round_and_query():
    run = _run()
    positives = _positives(run)
    a = ance_negatives(run, positives, 30, 3, seed=7, round_=2, corpus_ids=CORPUS)
    b = ance_negatives(run.sample(frac=1, random_state=3), positives, 30, 3, seed=7, round_=2, corpus_ids=CORPUS)
    pd.testing.assert_frame_equal(a, b)
    c = ance_negatives(run, positives, 30, 3, seed=7, round_=3, corpus_ids=CORPUS)
    assert [list(x) for x in a["negative_ids"]] != [list(x) for x in c["negative_ids"]]


@pytest.mark.parametrize("sampler", MINED)
def test_a_query_gets_the_same_negatives_whichever_queries_are_mined_with_it(sampler):
    """Counter-based draws: mining the queries one at a time, or in another grouping, gives the table of all at once
    (the fallback's random documents included: skip_top leaves some pairs short)."""
    run = _run(n_queries=6)
    positives = _positives(run) | {"q-unranked": {"d3"}}  # nothing retrieved: all from the fallback
    cfg = MiningConfig(sampler=sampler, top_k=8, num_negatives=5, seed=3, skip_top=2)
    rankings = {"dense": run, "bm25": run.sample(frac=1, random_state=1)}
    scores = {(q, d): 0.5 for q, ds in positives.items() for d in ds}

    def mined(queries):
        return sample_negatives(cfg, {q: positives[q] for q in queries}, 4, rankings, CORPUS, scores,
                                warn_short=False)

    whole = mined(sorted(positives))
    assert any((ranks == 0).any() for ranks in whole["negative_ranks"])  # some random documents
    pd.testing.assert_frame_equal(pd.concat([mined([q]) for q in sorted(positives)], ignore_index=True), whole)
    halves = [sorted(positives)[::2], sorted(positives)[1::2]]
    regrouped = pd.concat([mined(h) for h in halves]).sort_values(["query_id", "positive_id"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(regrouped, whole)


def test_the_draws_of_a_fixed_seed_are_pinned():
    """The baseline of the counter-based draws (issue 28): the same seed, round and rankings give these negatives on
    every machine and version. A change here changes every mined table: bump nothing silently."""
    run = _run(n_queries=3, depth=30, seed=5)
    positives = {"q0": {"d1", "d2"}, "q1": {"d3"}, "q2": {"d4"}}
    scores = {(q, d): 0.6 for q, ds in positives.items() for d in ds}
    got = {}
    for sampler in ("ance", "simans"):
        cfg = MiningConfig(sampler=sampler, top_k=30, num_negatives=2, seed=42, simans_a=20.0)
        table = sample_negatives(cfg, positives, 1, {"dense": run}, CORPUS, scores)
        got[sampler] = [list(ids) for ids in table["negative_ids"]]
    assert got == PINNED


PINNED = {"ance": [["d9", "d55"], ["d89", "d54"], ["d27", "d7"], ["d73", "d54"]],
          "simans": [["d87", "d89"], ["d97", "d59"], ["d26", "d74"], ["d89", "d73"]]}


def test_sampling_is_uniform_over_candidates():
    """Each pair draws 2 of the 8 candidates left (10 ranked minus 2 positives) without replacement: over 4000 pairs
    every candidate is drawn ~1000 times, no positive ever."""
    queries = [f"q{i}" for i in range(4000)]
    run = pd.DataFrame({"query_id": np.repeat(queries, 10), "doc_id": np.tile([f"d{i}" for i in range(10)], 4000),
                        "rank": np.tile(np.arange(1, 11), 4000), "score": np.tile(np.arange(10.0), 4000)})
    table = ance_negatives(run, {q: {"d0", "d5"} for q in queries}, 10, 2, seed=0, round_=0, corpus_ids=CORPUS)
    table = table[table["positive_id"] == "d0"]
    counts = pd.Series(np.concatenate(table["negative_ids"].to_numpy())).value_counts()
    assert set(counts.index) == {"d1", "d2", "d3", "d4", "d6", "d7", "d8", "d9"}
    assert counts.sum() == 8000 and counts.max() / counts.min() < 1.2


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
    assert sum(r > 0 for r in rows["q0"].negative_ranks) == 3 and list(rows["q9"].negative_ranks) == [0, 0, 0, 0]
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
    assert list(again["negative_ids"][0]) == list(unsorted["negative_ids"][0])
    assert len(set(again["negative_ids"][0])) == 6


def test_the_negatives_sample_page_needs_only_its_documents_rows(tmp_path):
    """tracking reads the corpus rows the page shows (`negatives_sample_docs`, `read_corpus_rows`), not the corpus:
    the same page as from the whole corpus."""
    from ance_core.data.corpus import read_corpus_rows
    from ance_core.negatives.analysis import negatives_sample, negatives_sample_docs

    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(300)], "title": [f"t{i}" for i in range(300)],
                           "text": [f"passage number {i}" for i in range(300)]})
    corpus.to_parquet(tmp_path / "corpus.parquet", row_group_size=50)
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(40)], "text": [f"query {i}" for i in range(40)]})
    negatives = pd.DataFrame({"query_id": queries["query_id"], "positive_id": [f"d{i}" for i in range(40)],
                              "negative_ids": [[f"d{100 + i}", f"d{200 + i}"] for i in range(40)],
                              "negative_ranks": [[1, 2]] * 40})
    docs = negatives_sample_docs(negatives)
    rows = read_corpus_rows(tmp_path, docs)
    assert sorted(rows["doc_id"]) == docs and len(docs) == 30  # 10 queries: a positive and 2 negatives each
    assert negatives_sample(negatives, rows, queries) == negatives_sample(negatives, corpus, queries)


@pytest.mark.parametrize("sampler", MINED)
def test_later_draws_are_other_valid_negatives_and_draw_0_is_the_single_draw(sampler):
    """`draws` (one per training epoch): draw 0 is the table of a single draw, column for column; each later draw
    holds num_negatives distinct non-positive documents per pair, other than draw 0's for most pairs."""
    from ance_core.negatives.mining import REDRAWN, epoch_negatives, negative_draws

    run = _run(n_queries=6)
    positives = _positives(run)
    cfg = MiningConfig(sampler=sampler, top_k=20, num_negatives=3, seed=3)
    scores = {(q, d): 0.5 for q, ds in positives.items() for d in ds}
    rankings = {"dense": run, "bm25": run}
    one = sample_negatives(cfg, positives, 1, rankings, CORPUS, scores)
    three = sample_negatives(cfg, positives, 1, rankings, CORPUS, scores, draws=3)
    assert negative_draws(one) == 1 and negative_draws(three) == 3
    pd.testing.assert_frame_equal(three.drop(columns=[c for c in REDRAWN if c in three]), one)
    pd.testing.assert_frame_equal(epoch_negatives(three, 0), three)
    changed = 0
    for draw in (1, 2):
        table = epoch_negatives(three, draw)
        for row, first in zip(table.itertuples(), one.itertuples(), strict=True):
            assert len(set(row.negative_ids)) == 3 and not set(row.negative_ids) & positives[row.query_id]
            changed += set(row.negative_ids) != set(first.negative_ids)
    assert changed > len(one)  # of 2 x the pairs
    again = sample_negatives(cfg, positives, 1, rankings, CORPUS, scores, draws=3)
    pd.testing.assert_frame_equal(again, three)


@pytest.mark.parametrize("sampler", ["ance", "simans"])
def test_a_document_of_the_querys_own_id_is_never_its_negative(sampler):
    """Where the corpus holds the queries (ArguAna, Quora), a query's own text ranks first: it was drawn as its own
    negative (SimANS preferred it, its score closest to the positive's), though evaluation drops it as the query."""
    ids = np.array([["q0", "d1", "d2", "d3"], ["q1", "d4", "d5", "d6"]], dtype=object)
    run = run_frame(["q0", "q1"], ids, np.array([[16.0, 11.0, 5.0, 4.0], [16.0, 11.0, 5.0, 4.0]]))
    positives = {"q0": {"d1"}, "q1": {"d4"}}
    scores = {("q0", "d1"): 11.0, ("q1", "d4"): 11.0}
    for seed in range(20):
        cfg = MiningConfig(sampler=sampler, top_k=4, num_negatives=2, seed=seed)
        table = sample_negatives(cfg, positives, 1, {"dense": run}, ["q0", "q1", *CORPUS], scores)
        for row in table.itertuples():
            assert row.query_id not in set(row.negative_ids), (seed, row)


@pytest.mark.parametrize("sampler", [s for s in MINED if SAMPLERS[s].rankings and s != "bm25+random"])
def test_judged_only_draws_a_judged_querys_negatives_from_its_judged_nonrelevant_documents(sampler):
    """`judged_only`: a query whose qrels judge documents non-relevant (pooled TREC judgments) draws from those among
    its candidates alone, never from its unjudged top hits; a query without such judgments mines as before; a judged
    query with none of them among its candidates takes the fallback. Off, the judgments change nothing."""
    run = _run(n_queries=3, depth=40)
    positives = {q: {d} for q, d in run[run["rank"] == 1][["query_id", "doc_id"]].itertuples(index=False)}
    candidates = {q: list(g.sort_values("rank")["doc_id"])[1:] for q, g in run.groupby("query_id")}
    judged = {"q0": set(candidates["q0"][20:23]) | {"d-x"}, "q2": {"d-unretrieved"}}  # q1: none judged
    scores = {(q, d): float(run[(run["query_id"] == q) & (run["doc_id"] == d)]["score"].iloc[0])
              for q, ds in positives.items() for d in ds}
    rankings = {"dense": run, "bm25": run}
    on = MiningConfig(sampler=sampler, top_k=40, num_negatives=2, seed=1, judged_only=True)
    off = on.model_copy(update={"judged_only": False})
    with pytest.warns(AnceWarning, match="1 of 3 queries"):
        table = sample_negatives(on, positives, 1, rankings, CORPUS, scores, judged=judged).set_index("query_id")
    assert set(table.loc["q0", "negative_ids"]) <= judged["q0"] and table.loc["q0", "fallback"] == 0
    assert table.loc["q2", "fallback"] == 2  # its judged document is not among its candidates
    plain = sample_negatives(off, positives, 1, rankings, CORPUS, scores, judged=judged).set_index("query_id")
    assert list(plain.loc["q1", "negative_ids"]) == list(table.loc["q1", "negative_ids"])
    assert not set(plain.loc["q0", "negative_ids"]) <= judged["q0"]
    assert "judged_only" not in off.model_dump(context=KEY_DUMP)  # an unset option leaves the stage keys as they were


def test_judged_only_with_a_sampler_of_no_ranking_is_refused():
    with pytest.raises(ValueError, match="judged_only: sampler 'random' draws from no ranking"):
        MiningConfig(sampler="random", judged_only=True)
