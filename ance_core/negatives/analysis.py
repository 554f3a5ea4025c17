"""Analyses of the negatives a model trains on (ANCE 000 Fig. 3, ICLR §6.2).

`negative_stats`: the mean rank of the sampled training negatives in the ranking they were mined from, and the
overlap between those negatives and the trained model's own top-100 negatives (its retrieval minus positives) on a
fixed sample of the training queries. The paper measures ~15% for BM25 negatives, and ANCE negatives rising towards
100% as the model that mines them and the model that is tested become the same.
"""

import json
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from ance_core.artifacts import STATS, ArtifactRef
from ance_core.data.dataset import passage_texts


def query_sample(query_ids, size: int, seed: int) -> list[str]:
    """A fixed sample of queries: the same ids for every round of a run (depends only on the ids and seed)."""
    ids = sorted(set(query_ids))
    if len(ids) <= size:
        return ids
    keyed = sorted(ids, key=lambda q: zlib.crc32(f"{seed}:{q}".encode()))
    return sorted(keyed[:size])


def negative_stats(negatives: pd.DataFrame, run: pd.DataFrame, positives: dict[str, set[str]], sample: list[str],
                   depth: int = 100) -> dict:
    """Mean mined rank of the training negatives, and their overlap with `run`'s top-`depth` negatives.

    negatives: the mining output (query_id, positive_id, negative_ids, negative_ranks); run: the trained model's
    ranking of the same queries (query_id, doc_id, rank). Overlap = |training negatives ∩ model's top-depth
    non-positive documents| / |training negatives|, pooled over the sampled queries.
    """
    ranks = np.concatenate([np.asarray(r, dtype=float) for r in negatives["negative_ranks"]])
    ranks = ranks[ranks > 0]  # random documents have no mined rank
    used = negatives[negatives["query_id"].isin(sample)].groupby("query_id")["negative_ids"].agg(
        lambda lists: {d for ids in lists for d in ids})
    run = run[run["query_id"].isin(used.index)].sort_values(["query_id", "rank"], kind="stable")
    hit = total = 0
    for query_id, docs in run.groupby("query_id", sort=False)["doc_id"]:
        tops = [d for d in docs if d not in positives.get(query_id, set())][:depth]
        train_negs = used[query_id]
        hit += len(train_negs & set(tops))
        total += len(train_negs)
    return {"mean_negative_rank": float(ranks.mean()) if len(ranks) else None,
            "median_negative_rank": float(np.median(ranks)) if len(ranks) else None,
            "overlap": hit / total if total else float("nan"), "overlap_queries": int(len(used)),
            "overlap_depth": depth}


def negatives_above_positive(negatives: pd.DataFrame, scores: pd.DataFrame) -> dict:
    """How many sampled negatives a model scores above their pair's positive: a sign of false negatives (unlabelled
    relevant documents) when the model is the one training starts from. `scores`: (query_id, doc_id, score) for every
    (query, positive) and (query, negative) pair of the table."""
    score = dict(zip(zip(scores["query_id"], scores["doc_id"], strict=True), scores["score"], strict=True))
    above = total = 0
    for row in negatives.itertuples():
        positive = score[(row.query_id, row.positive_id)]
        for d in row.negative_ids:
            above += score[(row.query_id, d)] > positive
            total += 1
    return {"above_positive": above / total if total else None, "above_positive_count": above,
            "negatives": total}


def scored_pairs(negatives: pd.DataFrame) -> list[tuple[str, str]]:
    """Every distinct (query, positive) and (query, negative) pair of a negatives table."""
    pairs = {(r.query_id, r.positive_id) for r in negatives.itertuples()}
    pairs |= {(r.query_id, d) for r in negatives.itertuples() for d in r.negative_ids}
    return sorted(pairs)


def _clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _sampled_rows(negatives: pd.DataFrame, n_queries: int, seed: int) -> pd.DataFrame:
    chosen = set(query_sample(negatives["query_id"], n_queries, seed))
    return negatives[negatives["query_id"].isin(chosen)].drop_duplicates("query_id")


def negatives_sample_docs(negatives: pd.DataFrame, n_queries: int = 10, seed: int = 0) -> list[str]:
    """The documents `negatives_sample` shows (the positives and negatives of its sampled queries): the corpus rows
    it needs."""
    rows = _sampled_rows(negatives, n_queries, seed)
    return sorted({*rows["positive_id"], *(d for ids in rows["negative_ids"] for d in ids)})


def negatives_sample(negatives: pd.DataFrame, corpus: pd.DataFrame, queries: pd.DataFrame, n_queries: int = 10,
                     seed: int = 0, width: int = 300) -> str:
    """A readable sample of mined negatives (markdown): per query its text, a positive and the negatives with the
    rank and score they were mined at, so a person can judge whether they are true negatives. `corpus`: at least
    the rows of `negatives_sample_docs`."""
    text = dict(zip(corpus["doc_id"], passage_texts(corpus), strict=True))
    query_text = dict(zip(queries["query_id"], queries["text"], strict=True))
    rows = _sampled_rows(negatives, n_queries, seed)
    parts = [f"# {len(rows)} sampled queries and their training negatives\n"]
    for row in rows.itertuples():
        parts.append(f"## Query {row.query_id}: {_clip(query_text.get(row.query_id, ''), width)}\n")
        parts.append(f"- **positive** `{row.positive_id}`: {_clip(text.get(row.positive_id, ''), width)}")
        scores = getattr(row, "negative_scores", None)
        for i, (doc, rank) in enumerate(zip(row.negative_ids, row.negative_ranks, strict=True)):
            score = scores[i] if scores is not None else None
            where = f"rank {int(rank)}" if rank else "random"  # random documents have no rank or score
            where += f", score {score:.3f}" if score is not None and np.isfinite(score) else ""
            parts.append(f"- negative `{doc}` ({where}): {_clip(text.get(doc, ''), width)}")
        parts.append("")
    return "\n".join(parts)


def score_profile(queries: np.ndarray, docs: np.ndarray, depth: int = 100) -> np.ndarray:
    """(n, depth): each query's top-`depth` scores over the whole corpus minus its mean score over the corpus
    (ANCE ICLR Fig. 3: a few high scores, then a long flat tail)."""
    scores = queries.astype(np.float32) @ docs.astype(np.float32).T
    top = -np.sort(-scores, axis=1)[:, :depth]
    return top - scores.mean(axis=1, keepdims=True)


def ranks_relative_to_positive(negatives: pd.DataFrame, run: pd.DataFrame) -> np.ndarray:
    """Mined rank of each sampled negative minus the rank of its pair's positive in the same ranking (SimANS samples
    around the positive: centred near 0). Pairs whose positive the ranking did not retrieve are left out."""
    rank_of = dict(zip(zip(run["query_id"], run["doc_id"], strict=True), run["rank"], strict=True))
    out = []
    for row in negatives.itertuples():
        positive = rank_of.get((row.query_id, row.positive_id))
        if positive is not None:
            out += [int(r) - int(positive) for r in row.negative_ranks if r]
    return np.asarray(out, dtype=np.int64)


def read_stats(ref: ArtifactRef) -> dict:
    """What a negative-stats stage measured (`negative_stats` and the rest, written by tasks/analysis.py)."""
    return json.loads(Path(ref.path, STATS).read_text())
