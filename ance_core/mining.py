"""Negative mining (ANCE eq. 10): D- = retrieval top-k minus ALL labelled positives; n sampled uniformly.

retrieve -> drop positives -> sample, each its own function. The same code mines BM25 negatives (from a BM25
run, the warm-up's "BM25 Neg") and ANCE negatives (from the ANN run of the current checkpoint).
Deterministic: the sample for a query depends only on (seed, round, query id).
"""

import zlib

import numpy as np
import pandas as pd

from ance_core.errors import AnceError

NEGATIVE_COLUMNS = ["query_id", "positive_id", "negative_ids", "negative_ranks", "negative_scores"]


def drop_positives(ranked: pd.DataFrame, positives: set[str], top_k: int) -> pd.DataFrame:
    """The top-k rows of one query's ranked list (doc_id, rank, score) whose doc is not a labelled positive."""
    top = ranked[ranked["rank"] <= top_k].sort_values("rank", kind="stable")
    return top[~top["doc_id"].isin(positives)]


def query_rng(seed: int, round_: int, query_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, round_, zlib.crc32(query_id.encode())])


def sample_uniform(candidates: pd.DataFrame, n: int, rng: np.random.Generator,
                   p: np.ndarray | None = None) -> pd.DataFrame:
    """n distinct candidates without replacement, uniformly (or with probabilities `p`), kept in rank order."""
    if len(candidates) < n:
        raise AnceError(f"only {len(candidates)} negative candidates but {n} requested")
    picked = np.sort(rng.choice(len(candidates), size=n, replace=False, p=p))
    return candidates.iloc[picked]

