"""Negative samplers behind one interface, chosen per stage in the config (`MiningConfig.sampler`).

Mined samplers write n negatives per (query, positive) pair, never a labelled-relevant document, never twice,
deterministic for (seed, round, query id):

- `ance`: uniform from the retrieval top-k (default 200) minus all positives (ANCE eq. 10; the paper's sampler).
- `simans`: from the top-k (default 100) ranked negatives, without replacement, with
  p_i ∝ exp(-a (s(q, d_i) - s(q, d⁺) - b)²) (SimANS eq. 4), s(q, d⁺) the score of a positive drawn at random per
  pair. The positive's score is its exact dense score (the retrieval stage scores every labelled positive, also
  one the top-k did not retrieve), so the distribution is defined whether or not the positive was retrieved.
- `bm25`: uniform from the BM25 top-k (default 100) minus positives; `random`: uniform from the corpus minus
  positives; `bm25+random`: half of each (an odd one from either, with probability 1/2).

Each sampler is a `SamplerSpec` in `SAMPLER_SPECS`: which ranking it mines, how many of a pair's n negatives come from
that ranking, and with which weights; `sample_negatives` does the rest for all of them.

Fallback: a query whose ranking has fewer usable candidates than it needs (BM25 found nothing for it, or `skip_top` /
`margin` left too few) gets its missing negatives uniformly from the corpus minus its relevant documents, from the same
seeded generator. One warning names how many queries and which; the table's `fallback` column counts them per row.

Training-time samplers mine nothing (`negative_ids` is empty): `in-batch` contrasts each query with the other
queries' positives; `nce` keeps only the hardest of those (the n = `num_negatives` highest-scoring per query), see
ance_core.loss.

False-negative controls, off by default, for every sampler that mines from a ranking: `skip_top` drops the
top r ranks; `margin` m drops candidates scoring above (1 - m)·s(q, d⁺).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ance_core.config import DEFAULT_TOP_K, DENSE, SPARSE, MiningConfig, TrainConfig
from ance_core.errors import AnceError, preview, warn
from ance_core.mining import NEGATIVE_COLUMNS, drop_positives, query_rng, sample_uniform

RANKED = (*DENSE, *SPARSE)  # mine from a ranking (dense or BM25)
MINED = (*RANKED, "random")
IN_BATCH = ("in-batch", "nce")
SAMPLERS = (*MINED, *IN_BATCH)
# fallback: how many of the row's negatives the fallback drew; positive_window / negative_windows: the MaxP window each
# document is trained with (its best under the mining model; 0, the first, when nothing ranked it)
COLUMNS = [*NEGATIVE_COLUMNS, "fallback", "positive_window", "negative_windows"]
EMPTY_RANKING = pd.DataFrame({"doc_id": pd.Series(dtype=object), "rank": pd.Series(dtype=np.int64),
                              "score": pd.Series(dtype=np.float32)})


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


@dataclass(frozen=True)
class SamplerSpec:
    """What a mined sampler needs and does: the ranking it mines (None: none), how many of a pair's n negatives come
    from that ranking (the rest are random documents by design), and the sampling weights over the candidates
    (None: uniform)."""

    ranking: str | None
    from_ranking: Callable[[int, np.random.Generator], int]
    weights: Callable[[pd.DataFrame, float | None, float, float], np.ndarray | None] = lambda *_: None
    needs_positive_score: bool = False


def _all(n: int, rng: np.random.Generator) -> int:
    return n


def _half(n: int, rng: np.random.Generator) -> int:
    """bm25+random: 1:1 in expectation, an odd one goes either way with p = 1/2."""
    return n // 2 + (int(rng.random() < 0.5) if n % 2 else 0)


def _simans_weights(candidates: pd.DataFrame, s_pos: float | None, a: float, b: float) -> np.ndarray | None:
    return simans_probabilities(candidates["score"].to_numpy(), s_pos, a, b) if len(candidates) else None


SAMPLER_SPECS: dict[str, SamplerSpec] = {
    "ance": SamplerSpec("dense", _all),
    "simans": SamplerSpec("dense", _all, _simans_weights, needs_positive_score=True),
    "bm25": SamplerSpec("bm25", _all),
    "bm25+random": SamplerSpec("bm25", _half),
    "random": SamplerSpec(None, lambda n, rng: 0),
}


def _in_batch_table(positives: dict[str, set[str]], positive_windows: dict[tuple[str, str], int]) -> pd.DataFrame:
    return pd.DataFrame([(q, d, [], [], [], 0, positive_windows.get((q, d), 0), [])
                         for q in sorted(positives) for d in sorted(positives[q])], columns=COLUMNS)


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
    relevant: dict[str, set[str]] | None = None,
    positive_windows: dict[tuple[str, str], int] | None = None,
) -> pd.DataFrame:
    """One row per (query, positive): `n` negatives of `sampler` (COLUMNS; rank and score are those of the ranking they
    were mined from, 0 and NaN for random documents). In-batch samplers return empty negative lists.

    `positives` are the training positives; `relevant` (default: the positives) every labelled-relevant document of a
    query, none of which is ever a negative (graded qrels may train on the top grades only). `positive_windows`: the
    MaxP window of each (query, positive) under the mining model (default 0)."""
    if sampler not in SAMPLERS:
        raise AnceError(f"unknown sampler '{sampler}'; choose one of {', '.join(SAMPLERS)}")
    positive_windows = positive_windows or {}
    if sampler in IN_BATCH:
        return _in_batch_table(positives, positive_windows)
    spec = SAMPLER_SPECS[sampler]
    relevant = relevant or positives
    top_k = top_k or DEFAULT_TOP_K.get(sampler)
    if corpus_ids is None:
        raise AnceError(f"sampler '{sampler}' needs the corpus ids (random documents, and the fallback)")
    docs = np.asarray(sorted(corpus_ids), dtype=object)
    if spec.ranking is not None and run is None:
        raise AnceError(f"sampler '{sampler}' needs a ranking to mine from")
    if spec.needs_positive_score and positive_scores is None:
        raise AnceError(f"sampler '{sampler}' needs the positives' scores (a dense retrieval stage writes them)")
    grouped = dict(tuple(run.groupby("query_id", sort=False))) if spec.ranking is not None else {}
    rows, short = [], []
    for query_id in sorted(positives):
        rng = query_rng(seed, round_, query_id)
        exclude = relevant.get(query_id, set()) | positives[query_id]
        ranked = drop_positives(grouped.get(query_id, EMPTY_RANKING), exclude, top_k) if spec.ranking else None
        for positive_id in sorted(positives[query_id]):
            if spec.needs_positive_score:  # s(q, d⁺) of a positive drawn at random (SimANS §4.1)
                drawn = sorted(positives[query_id])[rng.integers(len(positives[query_id]))]
                s_pos = positive_scores.get((query_id, drawn))
                if s_pos is None:
                    raise AnceError(f"no score for positive '{drawn}' of query '{query_id}'")
            else:
                s_pos = (positive_scores or {}).get((query_id, positive_id))
            wanted = spec.from_ranking(n, rng)
            if spec.ranking is not None:
                candidates = filter_candidates(ranked, skip_top, margin, s_pos)
                weights = spec.weights(candidates, s_pos, a, b)
                # SimANS weights far from s(q, d+) can underflow to 0: those candidates cannot be drawn
                usable = len(candidates) if weights is None else int((weights > 0).sum())
                take = min(wanted, usable)
                neg = sample_uniform(candidates, take, rng, weights) if take else EMPTY_RANKING
            else:
                neg = EMPTY_RANKING
            ids, ranks, scores = neg["doc_id"].tolist(), neg["rank"].astype(int).tolist(), neg["score"].tolist()
            windows = neg["window"].astype(int).tolist() if "window" in neg else [0] * len(ids)
            fallback = wanted - len(ids)
            if fallback:
                short.append(query_id)
            extra = random_docs(docs, exclude | set(ids), n - len(ids), rng) if n > len(ids) else []
            rows.append((query_id, positive_id, ids + extra, ranks + [0] * len(extra),
                         [float(s) for s in scores] + [float("nan")] * len(extra), fallback,
                         positive_windows.get((query_id, positive_id), 0), windows + [0] * len(extra)))
    table = pd.DataFrame(rows, columns=COLUMNS)
    if short:
        queries = list(dict.fromkeys(short))
        warn(f"mining ({sampler}, top-{top_k}{f', skip_top {skip_top}' if skip_top else ''}"
             f"{f', margin {margin}' if margin is not None else ''}): {len(queries)} of {len(positives)} queries had "
             f"fewer than the {n} candidate negatives they need (nothing retrieved, or too few left after the "
             f"false-negative controls); their {int(table['fallback'].sum())} missing negatives were drawn uniformly "
             f"from the corpus minus their relevant documents: {preview(queries)}")
    return table


def fallback_stats(table: pd.DataFrame) -> dict[str, int]:
    """How many queries and negatives of a mined table came from the fallback (see the module docstring)."""
    used = table["fallback"] > 0 if "fallback" in table else pd.Series(False, index=table.index)
    return {"fallback_queries": int(table.loc[used, "query_id"].nunique()),
            "fallback_negatives": int(table["fallback"].sum()) if "fallback" in table else 0}


def ance_negatives(run: pd.DataFrame, positives: dict[str, set[str]], top_k: int, n: int, seed: int, round_: int,
                   corpus_ids: Sequence[str]) -> pd.DataFrame:
    """One row per (query, positive): n negatives from the query's top-k minus its positives (sampler `ance`)."""
    return sample_negatives("ance", positives, n, seed, round_, run=run, top_k=top_k, corpus_ids=corpus_ids)


def train_config_for(mining: MiningConfig, train: TrainConfig) -> TrainConfig:
    """What a sampler asks of training: in-batch samplers need in-batch negatives; nce keeps the hardest n."""
    if mining.sampler == "in-batch":
        return train.model_copy(update={"in_batch_negatives": True, "hardest_in_batch": None})
    if mining.sampler == "nce":
        return train.model_copy(update={"in_batch_negatives": True, "hardest_in_batch": mining.num_negatives})
    return train
