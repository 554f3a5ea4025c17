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
