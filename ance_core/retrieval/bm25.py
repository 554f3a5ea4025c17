"""BM25 with bm25s and a Snowball stemmer: the baseline run and the source of BM25 negatives."""

import importlib
import logging
import os
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import Stemmer
from tqdm.auto import tqdm

from ance_core.data.dataset import passage_texts
from ance_core.errors import AnceError
from ance_core.retrieval.config import BM25Config
from ance_core.retrieval.search import run_frame


def _bm25s_without_jax():
    """bm25s, imported with JAX kept out. Where JAX is installed bm25s imports it and starts it (a top-k of five
    numbers, for its `jax` backend): JAX's threads then make every later fork of the process unsafe (the training
    loader's worker processes: JAX warned of a deadlock on the GPU machine), and on a GPU its first backend took 75%
    of the memory. BM25 searches with numpy (bm25s's backend without JAX, the one measured here). A process that
    imported JAX already keeps it; `import jax` works after this as before."""
    if "jax" in sys.modules or "bm25s" in sys.modules:
        return importlib.import_module("bm25s")
    sys.modules["jax"] = None  # `import jax` raises ImportError while bm25s is imported
    try:
        return importlib.import_module("bm25s")
    finally:
        del sys.modules["jax"]


bm25s = _bm25s_without_jax()
scoring = importlib.import_module("bm25s.scoring")

logging.getLogger("bm25s").setLevel(logging.WARNING)  # bm25s sets its own logger to DEBUG when imported
DOC_IDS = "doc_ids.parquet"  # beside bm25s's files in a saved index: the corpus's ids, in its rows' order
INDEX_CHUNK = 50_000  # documents tokenized at a time while indexing
NONOCCURRENCE = ("bm25l", "bm25+")  # the methods that score a term's not occurring in a document (`BM25.scores`)


class BM25:
    """A BM25 index of a corpus (`BM25(corpus, cfg)`, or `BM25.build` over a corpus read a chunk at a time), saved
    once (`save`) and memory-mapped by each search after (`BM25.load`): the same scores, without indexing the corpus
    again."""

    def __init__(self, corpus: pd.DataFrame | None, cfg: BM25Config):
        self.cfg = cfg
        self.stemmer = Stemmer.Stemmer(cfg.stemmer) if cfg.stemmer else None
        if corpus is not None:
            self._index(corpus.iloc[start:start + INDEX_CHUNK] for start in range(0, len(corpus), INDEX_CHUNK))

    @classmethod
    def build(cls, chunks: Iterable[pd.DataFrame], cfg: BM25Config, spill: Path | None = None) -> "BM25":
        """The index of a corpus given as consecutive chunks of rows (doc_id, title, text). With `spill` (a folder),
        each chunk's (document, term) counts wait there, not in memory, until the score matrix is filled."""
        bm25 = cls(None, cfg)
        bm25._index(chunks, spill)
        return bm25

    def _index(self, chunks: Iterable[pd.DataFrame], spill: Path | None = None) -> None:
        """bm25s's index (the same score per document and term, built by bm25s's own scoring functions) from one chunk
        of documents at a time: memory holds one chunk's tokens and the score matrix, where bm25s.tokenize and
        BM25.index hold the whole tokenized corpus as Python lists (4.5 GB at 2M passages)."""
        vocab: dict[str, int] = {}
        ids, parts, doc_lengths, frequencies = [], [], [], np.zeros(0, np.int64)
        for k, chunk in enumerate(chunks):
            ids.append(chunk["doc_id"].astype(str).to_numpy(dtype=object))
            tokens = bm25s.tokenize(passage_texts(chunk), stopwords=self.cfg.stopwords, stemmer=self.stemmer,
                                    return_ids=False, show_progress=False)
            flat = np.fromiter((vocab.setdefault(t, len(vocab)) for doc in tokens for t in doc), np.int64)
            lengths = np.fromiter((len(doc) for doc in tokens), np.int64, len(tokens))
            del tokens
            pairs, counts = np.unique(np.repeat(np.arange(len(lengths)), lengths) * len(vocab) + flat,
                                      return_counts=True)  # (document, term), by document then term
            part = Pairs(terms=(pairs % len(vocab)).astype(np.int32), tfs=counts.astype(np.float32),
                         per_doc=np.bincount(pairs // len(vocab), minlength=len(lengths)))
            frequencies = np.pad(frequencies, (0, len(vocab) - len(frequencies)))  # (the vocabulary grew)
            frequencies += np.bincount(part.terms, minlength=len(vocab))
            parts.append(part if spill is None else part.spill(spill / f"pairs-{k}.npz"))
            doc_lengths.append(lengths)
        if not doc_lengths or not sum(map(len, doc_lengths)):
            raise AnceError("BM25: the corpus has no documents to index")
        self.doc_ids = np.concatenate(ids)
        self.retriever = bm25s.BM25(k1=self.cfg.k1, b=self.cfg.b, method=self.cfg.method)
        self.retriever.scores = _score_matrix(self.retriever, parts, np.concatenate(doc_lengths), frequencies)
        vocab[""] = len(vocab)  # bm25s's empty token, after the matrix's columns
        self.retriever.vocab_dict = vocab
        self.retriever.unique_token_ids_set = set(vocab.values())

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

    def search(self, queries: pd.DataFrame, top_k: int, progress: bool = True) -> pd.DataFrame:
        """Run (query_id, doc_id, rank, score) with min(top_k, corpus size) hits per query (a progress bar over more
        than 100 queries unless `progress` is False: a served model's requests, whose bars would fill its log)."""
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
            hits = pool.map(lambda q: best_of(self.scores(q), k), (ids[i] for i in keep))
            hits = list(tqdm(hits, total=len(keep), desc="bm25", unit="query", dynamic_ncols=True,
                             disable=not progress or len(keep) <= 100 or bool(os.environ.get("TQDM_DISABLE"))))
        return run_frame(query_ids, self.doc_ids[np.stack([rows for _, rows in hits])],
                         np.stack([scores for scores, _ in hits]).astype(np.float32))

    def scores(self, term_ids: list[int]) -> np.ndarray:
        """Every document's score for a query's term ids, a document that matches no term scoring 0: bm25l and bm25+
        give every document the score of the query's terms not occurring (bm25s adds it to all), so that the
        documents matching nothing were ranked as hits after the matches (BM25's R@1000, fusion, the warm-up's
        candidates) where lucene, robertson and atire score them 0 and they are dropped as filler."""
        scores = self.retriever.get_scores_from_ids(term_ids)
        if self.retriever.nonoccurrence_array is not None:  # (the same sum bm25s added: what it added is taken away)
            scores -= self.retriever.nonoccurrence_array[np.asarray(term_ids, dtype=self.retriever.int_dtype)].sum()
        return scores


@dataclass
class Pairs:
    """A chunk's (document, term) pairs, by document then term: `terms`, their frequencies `tfs`, and `per_doc` the
    number of terms of each of its documents; or (`spill`) the file that holds them."""

    terms: np.ndarray
    tfs: np.ndarray
    per_doc: np.ndarray

    def spill(self, path: Path) -> Path:
        np.savez(path, terms=self.terms, tfs=self.tfs, per_doc=self.per_doc)
        return path

    @staticmethod
    def of(part: "Pairs | Path") -> "Pairs":
        if isinstance(part, Pairs):
            return part
        with np.load(part) as f:
            return Pairs(f["terms"], f["tfs"], f["per_doc"])


def _score_matrix(retriever: bm25s.BM25, parts: list, lengths: np.ndarray, frequencies: np.ndarray) -> dict:
    """bm25s's score matrix (CSC: a column per term, its documents in order) from each chunk's (document, term) pairs
    (`Pairs`, or their files: each is removed once read), with bm25s's idf and term-frequency functions (a pair's score
    is bm25s's to the bit)."""
    r, n_docs = retriever, len(lengths)
    average = lengths.mean() if n_docs else 0.0  # (float64, as bm25s)
    df = {token: int(f) for token, f in enumerate(frequencies)}
    idf_of, tfc = scoring._select_idf_scorer(r.idf_method), scoring._select_tfc_scorer(r.method)
    idf = scoring._build_idf_array(df, n_docs, idf_of, r.dtype)
    r.nonoccurrence_array = scoring._build_nonoccurrence_array(
        df, n_docs, idf_of, tfc, average, average, r.k1, r.b, r.delta, r.dtype) \
        if r.method in r.methods_requiring_nonoccurrence else None
    indptr = np.concatenate([[0], np.cumsum(frequencies)]).astype(np.int64)
    data, indices = np.empty(indptr[-1], dtype=r.dtype), np.empty(indptr[-1], dtype=r.int_dtype)
    filled, first = indptr[:-1].copy(), 0
    for part in parts:  # a chunk of documents at a time
        pairs = Pairs.of(part)
        if isinstance(part, Path):
            part.unlink()
        docs = np.repeat(np.arange(first, first + len(pairs.per_doc)), pairs.per_doc)
        first += len(pairs.per_doc)
        score = idf[pairs.terms] * tfc(tf_array=pairs.tfs, l_d=lengths[docs], l_avg=average, k1=r.k1, b=r.b,
                                       delta=r.delta)
        if r.nonoccurrence_array is not None:
            score -= r.nonoccurrence_array[pairs.terms]
        order = np.argsort(pairs.terms, kind="stable")  # each term's documents in order, as in a CSC column
        sorted_terms = pairs.terms[order]
        starts = np.searchsorted(sorted_terms, sorted_terms)  # where each term's run begins
        at = filled[sorted_terms] + np.arange(len(order)) - starts
        data[at], indices[at] = score[order], docs[order]
        filled += np.bincount(pairs.terms, minlength=len(filled))
    return {"data": data, "indices": indices, "indptr": indptr, "num_docs": n_docs}


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
