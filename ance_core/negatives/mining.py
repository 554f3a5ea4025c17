"""Negative mining (ANCE eq. 10 and the samplers of ance_core/negatives/samplers.py): one row per (query, positive) with
`num_negatives` negatives, never a labelled-relevant document, never twice, deterministic for (seed, round, query id).

Per query: each ranking the sampler mines is cut to its top-depth minus every relevant document; per pair, the
false-negative controls (`skip_top`: drop the top r ranks; `margin` m: drop candidates scoring above
(1 - m)·s(q, d⁺)) leave the candidates the sampler draws from.

Fallback: a pair whose candidates are fewer than the sampler wants (BM25 found nothing for the query, or the controls
left too few) gets its missing negatives uniformly from the corpus minus the query's relevant documents, from the same
seeded generator. One warning names how many queries and which; the table's `fallback` column counts them per row.
"""

import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ance_core.errors import AnceError, preview, warn
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.samplers import EMPTY_RANKING, Pair, get_sampler

# fallback: how many of the row's negatives the fallback drew; positive_window / negative_windows: the MaxP window each
# document is trained with (its best under the mining model; 0, the first, when nothing ranked it)
COLUMNS = ["query_id", "positive_id", "negative_ids", "negative_ranks", "negative_scores", "fallback",
           "positive_window", "negative_windows"]


def drop_positives(ranked: pd.DataFrame, positives: set[str], top_k: int) -> pd.DataFrame:
    """The top-k rows of one query's ranked list (doc_id, rank, score) whose doc is not a labelled positive."""
    top = ranked[ranked["rank"] <= top_k].sort_values("rank", kind="stable")
    return top[~top["doc_id"].isin(positives)]


def query_rng(seed: int, round_: int, query_id: str) -> np.random.Generator:
    return np.random.default_rng([seed, round_, zlib.crc32(query_id.encode())])


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


class SortedIds(np.ndarray):
    """Document ids already in sorted order (an object array): `sample_negatives` uses them as they are."""


def sorted_ids(corpus_ids: Sequence[str]) -> SortedIds:
    """The corpus's ids sorted once (at 8.8M passages, seconds: not again for every part of the queries)."""
    return np.asarray(sorted(corpus_ids), dtype=object).view(SortedIds)


def sample_negatives(
    cfg: MiningConfig,
    positives: dict[str, set[str]],
    round_: int,
    rankings: Mapping[str, pd.DataFrame] | None = None,
    corpus_ids: Sequence[str] | None = None,
    positive_scores: dict[tuple[str, str], float] | None = None,
    relevant: dict[str, set[str]] | None = None,
    positive_windows: dict[tuple[str, str], int] | None = None,
    warn_short: bool = True,
) -> pd.DataFrame:
    """One row per (query, positive): `cfg.num_negatives` negatives of `cfg.sampler` (COLUMNS; rank and score are those
    of the ranking they were mined from, 0 and NaN for random documents). In-batch samplers get empty negative lists.

    `corpus_ids`: the corpus's document ids (random documents, the fallback), sorted here unless `sorted_ids` did it
    once for a caller that mines the queries in parts. `rankings`: each ranking the sampler mines (`dense`, `bm25`:
    query_id, doc_id, rank, score). `positives`: the training positives; `relevant` (default: the positives) every
    labelled-relevant document of a query, none of which is ever a negative (graded qrels may train on the top
    grades only). `positive_scores`: s(q, d⁺) (SimANS, margin). `positive_windows`: the MaxP window of each (query,
    positive) under the mining model (default 0). `warn_short`: warn about the queries given fallback negatives
    (`warn_fallback`); off for a caller that mines the queries in parts and warns once for all of them."""
    sampler, n, depth = get_sampler(cfg.sampler), cfg.num_negatives, cfg.depth
    positive_windows = positive_windows or {}
    if not sampler.mines:
        return pd.DataFrame([(q, d, [], [], [], 0, positive_windows.get((q, d), 0), [])
                             for q in sorted(positives) for d in sorted(positives[q])], columns=COLUMNS)
    relevant = relevant or positives
    if corpus_ids is None:
        raise AnceError(f"sampler '{sampler.name}' needs the corpus ids (random documents, and the fallback)")
    if missing := [r for r in sampler.rankings if (rankings or {}).get(r) is None]:
        raise AnceError(f"sampler '{sampler.name}' needs a {' and a '.join(missing)} ranking to mine from")
    if sampler.needs_positive_score and positive_scores is None:
        raise AnceError(f"sampler '{sampler.name}' needs the positives' scores (a dense retrieval stage writes them)")
    docs = corpus_ids if isinstance(corpus_ids, SortedIds) else sorted_ids(corpus_ids)
    grouped = {r: dict(tuple(rankings[r].groupby("query_id", sort=False))) for r in sampler.rankings}
    rows = []
    for query_id in sorted(positives):
        rng = query_rng(cfg.seed, round_, query_id)
        exclude = relevant.get(query_id, set()) | positives[query_id]
        ranked = {r: drop_positives(grouped[r].get(query_id, EMPTY_RANKING), exclude, depth) for r in grouped}
        for positive_id in sorted(positives[query_id]):
            if sampler.needs_positive_score:  # s(q, d⁺) of a positive drawn at random (SimANS §4.1)
                drawn = sorted(positives[query_id])[rng.integers(len(positives[query_id]))]
                s_pos = positive_scores.get((query_id, drawn))
                if s_pos is None:
                    raise AnceError(f"no score for positive '{drawn}' of query '{query_id}'")
            else:
                s_pos = (positive_scores or {}).get((query_id, positive_id))
            candidates = {r: filter_candidates(c, cfg.skip_top, cfg.margin, s_pos) for r, c in ranked.items()}
            neg, wanted = sampler.draw(Pair(query_id, candidates, s_pos, cfg.simans_a, cfg.simans_b), n, rng)
            ids, ranks, scores = neg["doc_id"].tolist(), neg["rank"].astype(int).tolist(), neg["score"].tolist()
            windows = neg["window"].fillna(0).astype(int).tolist() if "window" in neg else [0] * len(ids)
            extra = random_docs(docs, exclude | set(ids), n - len(ids), rng) if n > len(ids) else []
            rows.append((query_id, positive_id, ids + extra, ranks + [0] * len(extra),
                         [float(s) for s in scores] + [float("nan")] * len(extra), wanted - len(ids),
                         positive_windows.get((query_id, positive_id), 0), windows + [0] * len(extra)))
    table = pd.DataFrame(rows, columns=COLUMNS)
    if warn_short:
        warn_fallback(cfg, table)
    return table


def warn_fallback(cfg: MiningConfig, table: pd.DataFrame) -> None:
    """One warning naming the queries of a mined table that had too few candidates (their rows' `fallback` > 0)."""
    queries = list(dict.fromkeys(table.loc[table["fallback"] > 0, "query_id"]))
    if not queries:
        return
    warn(f"mining ({cfg.sampler}, top-{cfg.depth}{f', skip_top {cfg.skip_top}' if cfg.skip_top else ''}"
         f"{f', margin {cfg.margin}' if cfg.margin is not None else ''}): {len(queries)} of "
         f"{table['query_id'].nunique()} queries had fewer than the {cfg.num_negatives} candidate negatives they need "
         f"(nothing retrieved, or too few left after the false-negative controls); their "
         f"{int(table['fallback'].sum())} missing negatives were drawn uniformly from the corpus minus their "
         f"relevant documents: {preview(queries)}")


def fallback_stats(table: pd.DataFrame) -> dict[str, int]:
    """How many queries and negatives of a mined table came from the fallback (see the module docstring)."""
    used = table["fallback"] > 0 if "fallback" in table else pd.Series(False, index=table.index)
    return {"fallback_queries": int(table.loc[used, "query_id"].nunique()),
            "fallback_negatives": int(table["fallback"].sum()) if "fallback" in table else 0}
