import numpy as np
import pandas as pd

from ance_core.data.dataset import load_dataset
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


def test_bm25_threaded_search_matches_one_thread(monkeypatch):
    """Over 1,000 queries the search runs a thread per core: the same run, row for row, as one thread."""
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(300)])
    corpus = pd.DataFrame({"doc_id": [f"d{i}" for i in range(400)], "title": "",
                           "text": [" ".join(rng.choice(words, 12)) for _ in range(400)]})
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(1500)],
                            "text": [" ".join(rng.choice(words, 3)) for _ in range(1500)]})
    bm25 = BM25(corpus, BM25Config())
    threads = []
    retrieve = bm25.retriever.retrieve
    monkeypatch.setattr(bm25.retriever, "retrieve", lambda *a, **kw: threads.append(kw["n_threads"]) or
                        retrieve(*a, **kw))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    threaded = bm25.search(queries, top_k=20)
    one = pd.concat([bm25.search(queries[i:i + 500], top_k=20) for i in range(0, 1500, 500)], ignore_index=True)
    assert threads == [2, 0, 0, 0]
    pd.testing.assert_frame_equal(threaded, one)
