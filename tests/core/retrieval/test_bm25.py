import numpy as np
import pandas as pd
import pytest

from ance_core.data.dataset import load_dataset, passage_texts
from ance_core.retrieval.bm25 import BM25
from ance_core.retrieval.config import BM25Config
from ance_core.retrieval.evaluate import evaluate_run


def test_bm25_ranks_matching_document_first():
    corpus = pd.DataFrame({"doc_id": ["a", "b", "c"], "title": ["", "Proteins", ""],
                           "text": ["the cat sat", "protein folding in cells", "stock markets fell"]})
    queries = pd.DataFrame({"query_id": ["q1", "q2"], "text": ["folded proteins", "the of and"]})
    run = BM25(corpus, BM25Config()).search(queries, top_k=1000)
    first = run[run["rank"] == 1].set_index("query_id")["doc_id"]
    assert first["q1"] == "b"  # matched through stemming: folded -> fold, proteins -> protein
    assert run.groupby("query_id").size().to_dict() == {"q1": 3}  # depth capped at corpus size
    # a query of only stopwords has no hits rather than an error


def test_bm25_scifact_test_ndcg_in_published_band(scifact_dir):
    ds = load_dataset(scifact_dir)
    run = BM25(ds.corpus, BM25Config()).search(ds.split_queries("test"), top_k=1000)
    metrics, _ = evaluate_run(run, ds.split_qrels("test"))
    assert 0.665 <= metrics["ndcg_at_10"] <= 0.70, metrics


def test_bm25_search_is_bm25s_run_and_above_the_exact_size_breaks_ties_by_row(monkeypatch):
    """Up to EXACT_SELECTION_MAX_DOCS documents the search (a thread per core over 1,000 queries) gives the run
    bm25s.retrieve gives, row for row; above, the top k by (score descending, corpus row), zero-scored rows after the
    matches: here with duplicate documents (tied scores) and queries that match fewer documents than k."""
    import bm25s

    from ance_core.retrieval import bm25 as module

    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(300)])
    texts = [" ".join(rng.choice(words, rng.integers(8, 40))) for _ in range(400)]
    texts[10:20] = [texts[5]] * 10  # tied scores for every query that matches them
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(400)], "title": "", "text": texts})
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(1500)],
                            "text": [" ".join(rng.choice(words, 1 + i % 3)) for i in range(1500)]})
    bm25 = BM25(corpus, BM25Config())
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    run = bm25.search(queries, top_k=20)
    tokens = bm25s.tokenize(queries["text"].tolist(), stopwords="en", stemmer=bm25.stemmer, return_ids=False,
                            show_progress=False)
    ids = [[bm25.retriever.vocab_dict[t] for t in q if t in bm25.retriever.vocab_dict] for q in tokens]
    rows, scores = bm25.retriever.retrieve(ids, k=20, n_threads=0, show_progress=False)
    pd.testing.assert_frame_equal(run, module.run_frame(queries["query_id"].tolist(), bm25.doc_ids[rows],
                                                        scores.astype(np.float32)))

    monkeypatch.setattr(module, "EXACT_SELECTION_MAX_DOCS", 0)
    large = bm25.search(queries, top_k=20)
    every = np.stack([bm25.retriever.get_scores_from_ids(q) for q in ids])  # (queries, documents)
    order = np.stack([np.lexsort((np.arange(400), -row)) for row in every])[:, :20]
    expected = module.run_frame(queries["query_id"].tolist(), bm25.doc_ids[order],
                                np.take_along_axis(every, order, 1).astype(np.float32))
    pd.testing.assert_frame_equal(large, expected)
    assert (every > 0).sum(axis=1).min() < 20 and not large.equals(run)  # short matches and ties did occur


def test_bm25s_debug_lines_are_not_printed(caplog):
    """bm25s sets its logger to DEBUG when imported ("Building index from IDs objects" on every run's console)."""
    import logging

    with caplog.at_level(logging.DEBUG):
        corpus = pd.DataFrame({"doc_id": ["a", "b"], "title": ["", ""], "text": ["apple banana", "banana cherry"]})
        BM25(corpus, BM25Config())
    assert not [r for r in caplog.records if r.name.startswith("bm25s") and r.levelno < logging.WARNING]


@pytest.mark.parametrize("method", ["lucene", "robertson", "bm25+"])
def test_the_index_built_a_chunk_at_a_time_scores_as_bm25s_own_index_to_the_bit(method, tmp_path):
    """The index is built a chunk of documents at a time (its memory no longer holds the whole tokenized corpus), the
    chunks' counts kept in memory or spilled to files; every document's score for every query is bm25s's, whatever the
    chunk size, empty documents included."""
    import bm25s

    rng = np.random.default_rng(1)
    words = np.array(["running", "runs", "ran", "protein", "proteins", "cell", "cells", "the", "of", "folding",
                      "folded", *[f"w{i}" for i in range(200)]])
    texts = [" ".join(rng.choice(words, rng.integers(0, 60))) for _ in range(500)]
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(500)], "title": ["Cells"] * 50 + [""] * 450,
                           "text": texts})
    cfg = BM25Config(method=method)
    reference = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=method)
    stemmer = BM25(None, cfg).stemmer
    reference.index(bm25s.tokenize(passage_texts(corpus), stopwords="en", stemmer=stemmer, show_progress=False),
                    show_progress=False)
    queries = bm25s.tokenize([" ".join(rng.choice(words, 4)) for _ in range(100)], stopwords="en", stemmer=stemmer,
                             return_ids=False, show_progress=False)
    for chunk, spill in ((500, None), (64, None), (7, tmp_path)):
        built = BM25.build((corpus.iloc[s:s + chunk] for s in range(0, len(corpus), chunk)), cfg, spill).retriever
        assert not list(tmp_path.iterdir())  # the spilled counts are removed once read
        assert set(built.vocab_dict) == set(reference.vocab_dict)
        for q in queries:
            ours = built.get_scores_from_ids([built.vocab_dict[t] for t in q if t in built.vocab_dict])
            theirs = reference.get_scores_from_ids([reference.vocab_dict[t] for t in q if t in reference.vocab_dict])
            assert np.array_equal(ours, theirs)


def test_an_empty_corpus_is_one_clear_error():
    from ance_core.errors import AnceError

    with pytest.raises(AnceError, match="no documents to index"):
        BM25.build([], BM25Config())


@pytest.mark.parametrize("method", ["bm25l", "bm25+", "lucene"])
def test_a_document_that_matches_no_query_term_scores_0_under_every_method(method):
    """bm25l and bm25+ score a term's not occurring in a document, and bm25s adds that to every document: those that
    match nothing scored 0.46 here, above the 0 that marks BM25's filler, so they counted as hits (BM25's R@1000,
    RRF, the warm-up's candidates). They score 0 now, and the matches keep their order."""
    corpus = pd.DataFrame({"doc_id": ["d0", "d1", "d2", "d3"], "title": "",
                           "text": ["apple pie", "cherry tart", "plum jam", "apple apple crumble"]})
    queries = pd.DataFrame({"query_id": ["q"], "text": ["apple"]})
    bm25 = BM25(corpus, BM25Config(method=method))
    run = bm25.search(queries, top_k=4).set_index("doc_id")["score"]
    assert run["d1"] == run["d2"] == 0 and run["d3"] > run["d0"] > 0
    raw = bm25.retriever.get_scores_from_ids([bm25.retriever.vocab_dict["appl"]])
    assert (raw[[1, 2]] > 0).all() == (method != "lucene")  # (what bm25s gives these methods)
    from ance_core.retrieval.fusion import Fusion, fuse

    dense = pd.DataFrame({"query_id": ["q"] * 2, "doc_id": ["d0", "d3"], "score": [0.9, 0.8]})
    assert "d1" not in set(fuse(dense, run.reset_index().assign(query_id="q"), Fusion("rrf"))["doc_id"])
