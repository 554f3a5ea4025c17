"""Negative samplers behind one interface, chosen per stage in the config (`MiningConfig.sampler`).

Mined samplers write n negatives per (query, positive) pair, never a labelled positive, never twice, deterministic
for (seed, round, query id):

- `ance`: uniform from the retrieval top-k (default 200) minus all positives (ANCE eq. 10; the paper's sampler).
- `simans`: from the top-k (default 100) ranked negatives, without replacement, with
  p_i ∝ exp(-a (s(q, d_i) - s(q, d⁺) - b)²) (SimANS eq. 4), s(q, d⁺) the score of a positive drawn at random per
  pair. The positive's score is its exact dense score (the retrieval stage scores every labelled positive, also
  one the top-k did not retrieve), so the distribution is defined whether or not the positive was retrieved.
- `bm25`: uniform from the BM25 top-k (default 100) minus positives; `random`: uniform from the corpus minus
  positives; `bm25+random`: half of each (an odd one from either, with probability 1/2).

Training-time samplers mine nothing (`negative_ids` is empty): `in-batch` contrasts each query with the other
queries' positives; `nce` keeps only the hardest of those (the highest-scoring, `TrainConfig`-independent: the
n = `num_negatives` best per query), see ance_core.loss.

False-negative controls, off by default, for every sampler that mines from a ranking: `skip_top` drops the
top r ranks; `margin` m drops candidates scoring above (1 - m)·s(q, d⁺).
"""

from collections.abc import Sequence

import numpy as np
import pandas as pd

from ance_core.config import DEFAULT_TOP_K, DENSE, SPARSE, MiningConfig, TrainConfig
from ance_core.errors import AnceError
from ance_core.mining import NEGATIVE_COLUMNS, drop_positives, query_rng, sample_uniform

RANKED = (*DENSE, *SPARSE)  # mine from a ranking (dense or BM25)
MINED = (*RANKED, "random")
IN_BATCH = ("in-batch", "nce")
SAMPLERS = (*MINED, *IN_BATCH)


def simans_probabilities(scores: np.ndarray, positive_score: float, a: float, b: float) -> np.ndarray:
    """SimANS eq. 4 over candidate scores, normalised (computed in log space: no underflow for large a)."""
    logits = -a * (np.asarray(scores, dtype=np.float64) - positive_score - b) ** 2
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def filter_candidates(candidates: pd.DataFrame, skip_top: int, margin: float | None,
                      positive_score: float | None) -> pd.DataFrame:
    """The false-negative controls: drop the top `skip_top` ranks, and scores above (1 - margin)·s(q, d⁺)."""
    if skip_top:
        candidates = candidates[candidates["rank"] > skip_top]
    if margin is not None:
        if positive_score is None:
            raise AnceError("mining.margin needs the positives' scores, which this ranking does not have")
        candidates = candidates[candidates["score"] <= (1 - margin) * positive_score]
    return candidates


def random_docs(doc_ids: np.ndarray, exclude: set[str], n: int, rng: np.random.Generator) -> list[str]:
    """n distinct documents uniformly from the corpus minus `exclude`."""
    if len(doc_ids) - len(exclude) < n:
        raise AnceError(f"the corpus has fewer than {n} documents that are not positives")
    out: list[str] = []
    while len(out) < n:
        for i in rng.choice(len(doc_ids), size=2 * n, replace=False if len(doc_ids) >= 2 * n else True):
            d = doc_ids[i]
            if d not in exclude and d not in out:
                out.append(d)
                if len(out) == n:
                    break
    return out


def sample_negatives(
    sampler: str,
    positives: dict[str, set[str]],
    n: int,
    seed: int,
    round_: int,
    run: pd.DataFrame | None = None,
    top_k: int | None = None,
    positive_scores: dict[tuple[str, str], float] | None = None,
    corpus_ids: Sequence[str] | None = None,
    a: float = 0.5,
    b: float = 0.0,
    skip_top: int = 0,
    margin: float | None = None,
) -> pd.DataFrame:
    """One row per (query, positive): `n` negatives of `sampler` (NEGATIVE_COLUMNS; rank and score are those of the
    ranking they were mined from, 0 and NaN for random documents). In-batch samplers return empty negative lists."""
    if sampler not in SAMPLERS:
        raise AnceError(f"unknown sampler '{sampler}'; choose one of {', '.join(SAMPLERS)}")
    if sampler in IN_BATCH:
        return pd.DataFrame([(q, d, [], [], []) for q in sorted(positives) for d in sorted(positives[q])],
                            columns=NEGATIVE_COLUMNS)
    top_k = top_k or DEFAULT_TOP_K.get(sampler)
    docs = np.asarray(sorted(corpus_ids), dtype=object) if corpus_ids is not None else None
    if sampler in ("random", "bm25+random") and docs is None:
        raise AnceError(f"sampler '{sampler}' needs the corpus ids")
    if sampler in RANKED and run is None:
        raise AnceError(f"sampler '{sampler}' needs a ranking to mine from")
    if sampler == "simans" and positive_scores is None:
        raise AnceError("sampler 'simans' needs the positives' scores (a dense retrieval stage writes them)")
    grouped = dict(tuple(run.groupby("query_id", sort=False))) if run is not None else {}
    rows = []
    for query_id in sorted(positives):
        rng = query_rng(seed, round_, query_id)
        ranked = None
        if sampler in RANKED:
            if query_id not in grouped:
                raise AnceError(f"query '{query_id}' has labelled positives but no retrieval results")
            ranked = drop_positives(grouped[query_id], positives[query_id], top_k)
        for positive_id in sorted(positives[query_id]):
            if sampler == "simans":  # s(q, d⁺) of a positive drawn at random (SimANS §4.1)
                drawn = sorted(positives[query_id])[rng.integers(len(positives[query_id]))]
                s_pos = positive_scores.get((query_id, drawn))
                if s_pos is None:
                    raise AnceError(f"no score for positive '{drawn}' of query '{query_id}'")
            else:
                s_pos = (positive_scores or {}).get((query_id, positive_id))
            if sampler == "random":
                ids = random_docs(docs, positives[query_id], n, rng)
                rows.append((query_id, positive_id, ids, [0] * n, [float("nan")] * n))
                continue
            candidates = filter_candidates(ranked, skip_top, margin, s_pos)
            if sampler == "simans":
                p = simans_probabilities(candidates["score"].to_numpy(), s_pos, a, b)
                neg = sample_uniform(candidates, n, rng, p)
            elif sampler == "bm25+random":  # 1:1 in expectation: an odd one goes either way with p = 1/2
                from_bm25 = n // 2 + (int(rng.random() < 0.5) if n % 2 else 0)
                neg = sample_uniform(candidates, from_bm25, rng)
            else:
                neg = sample_uniform(candidates, n, rng)
            ids, ranks, scores = neg["doc_id"].tolist(), neg["rank"].astype(int).tolist(), neg["score"].tolist()
            if sampler == "bm25+random":
                extra = random_docs(docs, positives[query_id] | set(ids), n - len(ids), rng)
                ids, ranks, scores = ids + extra, ranks + [0] * len(extra), scores + [float("nan")] * len(extra)
            rows.append((query_id, positive_id, ids, ranks, [float(s) for s in scores]))
    return pd.DataFrame(rows, columns=NEGATIVE_COLUMNS)


def train_config_for(mining: MiningConfig, train: TrainConfig) -> TrainConfig:
    """What a sampler asks of training: in-batch samplers need in-batch negatives; nce keeps the hardest n."""
    if mining.sampler == "in-batch":
        return train.model_copy(update={"in_batch_negatives": True, "hardest_in_batch": None})
    if mining.sampler == "nce":
        return train.model_copy(update={"in_batch_negatives": True, "hardest_in_batch": mining.num_negatives})
    return train
