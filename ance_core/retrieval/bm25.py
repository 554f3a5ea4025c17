"""BM25 with bm25s and a Snowball stemmer: the baseline run and the source of BM25 negatives."""

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bm25s
import numpy as np
import pandas as pd
import Stemmer
from tqdm.auto import tqdm

from ance_core.data.dataset import passage_texts
from ance_core.retrieval.config import BM25Config
from ance_core.retrieval.search import run_frame

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG when imported
DOC_IDS = "doc_ids.parquet"  # beside bm25s's files in a saved index: the corpus's ids, in its rows' order


class BM25:
    """A BM25 index of a corpus (`BM25(corpus, cfg)`), saved once (`save`) and memory-mapped by each search after
    (`BM25.load`): the same scores, without indexing the corpus again."""

    def __init__(self, corpus: pd.DataFrame | None, cfg: BM25Config):
        self.cfg = cfg
        self.stemmer = Stemmer.Stemmer(cfg.stemmer) if cfg.stemmer else None
        if corpus is None:  # (load)
            return
        self.doc_ids = corpus["doc_id"].astype(str).to_numpy(dtype=object)
        tokens = bm25s.tokenize(passage_texts(corpus), stopwords=cfg.stopwords, stemmer=self.stemmer,
                                show_progress=False)
        self.retriever = bm25s.BM25(k1=cfg.k1, b=cfg.b, method=cfg.method)
        self.retriever.index(tokens, show_progress=False)

    def save(self, folder: Path) -> dict:
        self.retriever.save(folder, show_progress=False)
        pd.DataFrame({"doc_id": self.doc_ids}).to_parquet(folder / DOC_IDS, index=False)
        return {"documents": len(self.doc_ids), "vocabulary": len(self.retriever.vocab_dict)}

    @classmethod
    def load(cls, folder: Path, cfg: BM25Config) -> "BM25":
        """A saved index, its score matrix memory-mapped (`cfg` must be the one it was built with: the stage key)."""
        bm25 = cls(None, cfg)
        bm25.retriever = bm25s.BM25.load(folder, mmap=True, show_progress=False)
        bm25.doc_ids = pd.read_parquet(folder / DOC_IDS)["doc_id"].astype(str).to_numpy(dtype=object)
        return bm25

    def search(self, queries: pd.DataFrame, top_k: int) -> pd.DataFrame:
        """Run (query_id, doc_id, rank, score) with min(top_k, corpus size) hits per query."""
        k = min(top_k, len(self.doc_ids))
        tokens = bm25s.tokenize(queries["text"].tolist(), stopwords=self.cfg.stopwords, stemmer=self.stemmer,
                                return_ids=False, show_progress=False)
        vocab = self.retriever.vocab_dict
        ids = [[vocab[t] for t in q if t and t in vocab] for q in tokens]
        # A query with no indexed term (only stopwords, or unseen words) matches nothing: no hits, not an error.
        keep = [i for i, q in enumerate(ids) if q]
        query_ids = queries["query_id"].to_numpy(dtype=object)[keep].tolist()
        if not keep:
            return run_frame([], np.empty((0, k), dtype=object), np.empty((0, k), dtype=np.float32))
        workers = len(os.sched_getaffinity(0)) if len(keep) > 1000 else 1
        with ThreadPoolExecutor(workers) as pool:  # numpy's calls release the GIL: a thread per core
            hits = pool.map(lambda q: best_of(self.retriever.get_scores_from_ids(q), k), (ids[i] for i in keep))
            hits = list(tqdm(hits, total=len(keep), desc="bm25", unit="query", dynamic_ncols=True,
                             disable=len(keep) <= 100 or bool(os.environ.get("TQDM_DISABLE"))))
        return run_frame(query_ids, self.doc_ids[np.stack([rows for _, rows in hits])],
                         np.stack([scores for scores, _ in hits]).astype(np.float32))


EXACT_SELECTION_MAX_DOCS = 200_000  # up to this corpus size the top k is bm25s's own selection


def best_of(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The top k of one query's scores over the corpus: (scores, rows), descending.

    Up to EXACT_SELECTION_MAX_DOCS documents, bm25s's own selection (a partition of every document's score; the runs,
    and so the README's numbers, are those bm25s gives). Above, that partition is the search's cost: numpy's partition
    of an array that is mostly zeros (the documents matching no query term) takes 0.8 s per query at 2M passages,
    against 3 ms to score them. There the top k is taken among the matching documents, ties broken by corpus row
    (bm25s breaks them as its partition happens to fall), then, when fewer than k match, the first unmatched rows at
    score 0."""
    if len(scores) <= EXACT_SELECTION_MAX_DOCS:
        return bm25s.selection.topk(scores, k=k, sorted=True)
    matched = np.flatnonzero(scores)
    if len(matched) > k:  # a partition of the matches' negated scores, then the k best by (score, row)
        kth = np.partition(-scores[matched], k - 1)[k - 1]
        matched = matched[-scores[matched] <= kth]
    best = matched[np.lexsort((matched, -scores[matched]))][:k]
    if len(best) < k:
        unmatched = np.ones(len(scores), bool)
        unmatched[best] = False
        best = np.concatenate([best, np.flatnonzero(unmatched)[: k - len(best)]])
    return scores[best], best
