"""A synthetic collection of MS MARCO's shape in BEIR's layout, for bench/rehearsal.py and bench/gpu.py: passages of
log-normal length (mean ≈ 60 words, median ≈ 54, 1 in 2,000 of 300-2,000 words: MS MARCO's long tail), words drawn
Zipf-like from a 30,000-word vocabulary whose 33 most frequent are BM25's English stop words; training queries with
one positive each (6 of its positive's words plus 2 random ones) and 200 test queries."""

import json
from pathlib import Path

import numpy as np

from ance_core.retrieval.bm25 import bm25s  # (bm25s without JAX: ance_core/retrieval/bm25.py)

STOPWORDS_EN = bm25s.stopwords.STOPWORDS_EN

MEAN_WORDS, SIGMA = 60, 0.45  # log-normal passage length: mean exp(mu + sigma^2 / 2) = 60 words
LONG_EVERY, VOCABULARY = 2000, 30_000


def vocabulary(size: int, rng: np.random.Generator) -> np.ndarray:
    """`size` distinct pseudo-words of 2-4 syllables."""
    syllables = np.array([c + v for c in "bcdfghklmnprstvz" for v in ("a", "e", "i", "o", "u", "ai", "ou")])
    words: dict[str, None] = dict.fromkeys(sorted(STOPWORDS_EN))  # the most frequent words, as in English
    while len(words) < size:
        n = rng.integers(2, 5)
        words["".join(rng.choice(syllables, n))] = None
    return np.array(list(words), dtype=object)


def synthetic_msmarco(folder: Path, passages: int, queries: int, dev_queries: int, seed: int = 0) -> dict:
    """A BEIR folder of MS MARCO's shape (see the module docstring), written a block of passages at a time."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(VOCABULARY, rng)
    zipf = 1 / np.arange(1, len(vocab) + 1) ** 1.05
    zipf /= zipf.sum()
    (folder / "qrels").mkdir(parents=True)
    mu = np.log(MEAN_WORDS) - SIGMA ** 2 / 2
    positives = rng.integers(0, passages, queries + 200)
    wanted = np.zeros(passages, dtype=bool)
    wanted[positives] = True
    words_of: dict[int, np.ndarray] = {}  # the positives' words, for their queries
    lengths_total = 0
    with open(folder / "corpus.jsonl", "w") as f:
        for start in range(0, passages, 100_000):
            n = min(100_000, passages - start)
            lengths = np.maximum(5, rng.lognormal(mu, SIGMA, n).astype(np.int64))
            long = rng.random(n) < 1 / LONG_EVERY
            lengths[long] = rng.integers(300, 2001, long.sum())
            lengths_total += int(lengths.sum())
            ids = rng.choice(len(vocab), size=int(lengths.sum()), p=zipf)
            bounds = np.concatenate([[0], np.cumsum(lengths)])
            lines = []
            for i in range(n):
                words = ids[bounds[i]:bounds[i + 1]]
                if wanted[start + i]:
                    words_of[start + i] = words
                lines.append(json.dumps({"_id": f"d{start + i}", "title": "", "text": " ".join(vocab[words])}))
            f.write("\n".join(lines) + "\n")
    with open(folder / "queries.jsonl", "w") as f, open(folder / "qrels" / "train.tsv", "w") as train, \
            open(folder / "qrels" / "test.tsv", "w") as test:
        train.write("query-id\tcorpus-id\tscore\n")
        test.write("query-id\tcorpus-id\tscore\n")
        for i, doc in enumerate(positives):
            words = words_of[int(doc)]
            text = " ".join(vocab[np.concatenate([rng.choice(words, min(6, len(words)), replace=False),
                                                  rng.integers(0, len(vocab), 2)])])
            f.write(json.dumps({"_id": f"q{i}", "text": text}) + "\n")
            (train if i < queries else test).write(f"q{i}\td{doc}\t1\n")
    return {"passages": passages, "mean_words": lengths_total / passages, "queries": queries,
            "dev_fraction": dev_queries / queries}
