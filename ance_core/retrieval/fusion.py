"""Hybrid retrieval: a dense model's ranking fused with BM25's, the way of fusing chosen on the dev split.

Two ways, each over the union of the two runs' hits per query:
- reciprocal-rank fusion (Cormack et al. 2009): score = 1/(k + rank_dense) + 1/(k + rank_bm25), k = 60, a hit missing
  from one run contributing nothing from it (BM25's rows of score 0, documents that match no query term and fill a
  query's run to its depth, are not hits);
- a convex combination of per-query normalised scores: score = w·s_dense + (1 − w)·s_bm25, each run's scores of the
  query min-max scaled to [0, 1] over its own hits (hits of one score, or a single hit, all 1), a hit missing from a
  run taking that run's minimum (0); BM25's hits are its matches, as in RRF.

Equal fused scores are ranked as trec_eval ranks them (the greater document id first), so the `rank` of a fused run,
its evaluation and a served search agree. With `ignore_identical_ids` (ArguAna's, Quora's queries are documents too) a
query's own id leaves both runs before they are fused: its hit would set the scale of the other scores.

`choose_fusion` scores every candidate (RRF, and the convex combination at each weight of `WEIGHTS`) on the dev runs by
nDCG@10 and keeps the best; on a tie the simpler one: RRF, which has no weight, then the weight nearest 0.5.
"""

from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from ance_core.errors import AnceError
from ance_core.retrieval.evaluate import evaluate_run, trec_order, without_identical_ids

RRF_K = 60
WEIGHTS = tuple(round(0.1 * k, 1) for k in range(1, 10))  # the dense run's weight in a convex combination


@dataclass(frozen=True)
class Fusion:
    method: str  # "rrf" or "convex"
    weight: float | None = None  # convex: the dense run's weight
    k: int = RRF_K  # rrf

    def label(self) -> str:
        return f"RRF (k={self.k})" if self.method == "rrf" else f"convex, dense weight {self.weight}"

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, record: dict) -> "Fusion":
        method, weight, k = record.get("method"), record.get("weight"), record.get("k", RRF_K)
        if method not in ("rrf", "convex"):
            raise AnceError(f"not a fusion record: {record!r} (method rrf or convex)")
        if method == "convex" and not (isinstance(weight, (int, float)) and 0 <= weight <= 1):
            raise AnceError(f"not a fusion record: {record!r} (a convex fusion's weight is a number from 0 to 1)")
        if method == "rrf" and not (isinstance(k, int) and k >= 0):
            raise AnceError(f"not a fusion record: {record!r} (RRF's k is a whole number >= 0)")
        return cls(method, weight, k)


def _ranked(run: pd.DataFrame, depth: int | None) -> pd.DataFrame:
    """The run's (query_id, doc_id, score, rank), best first per query, at most `depth` hits each; one row per
    document (a MaxP run's best window)."""
    run = run[["query_id", "doc_id", "score"]].astype({"query_id": str, "doc_id": str, "score": float})
    run = trec_order(run).drop_duplicates(["query_id", "doc_id"])
    run["rank"] = run.groupby("query_id").cumcount() + 1
    return run[run["rank"] <= depth] if depth is not None else run


def _normalised(run: pd.DataFrame) -> pd.Series:
    grouped = run.groupby("query_id")["score"]
    low, high = grouped.transform("min"), grouped.transform("max")
    span = (high - low).where(high > low, 1.0)
    return ((run["score"] - low) / span).where(high > low, 1.0)  # (one score: every hit the run's best, not absent)


def fuse(dense: pd.DataFrame, bm25: pd.DataFrame, fusion: Fusion, depth: int | None = 1000,
         ignore_identical_ids: bool = False) -> pd.DataFrame:
    """The fused run (query_id, doc_id, rank, score), best first, `depth` hits per query; every query of either run.
    `ignore_identical_ids`: a query's own id is no hit of either run (module docstring)."""
    if ignore_identical_ids:
        dense, bm25 = without_identical_ids(dense), without_identical_ids(bm25)
    dense, bm25 = _ranked(dense, depth), _ranked(bm25, depth)
    # BM25's score-0 rows match no query term: filler at arbitrary ranks, not hits. RRF ranked them; a convex
    # combination scaled BM25's hits by them (its minimum 0 where a query matches fewer documents than the depth, else
    # its weakest hit) and, where a query's own id was its only match, raised every filler row to 1
    bm25 = bm25[bm25["score"] > 0]
    if fusion.method == "rrf":
        parts = [run.assign(part=1.0 / (fusion.k + run["rank"])) for run in (dense, bm25)]
    else:
        parts = [dense.assign(part=fusion.weight * _normalised(dense)),
                 bm25.assign(part=(1.0 - fusion.weight) * _normalised(bm25))]
    both = pd.concat([p[["query_id", "doc_id", "part"]] for p in parts])
    fused = both.groupby(["query_id", "doc_id"], as_index=False)["part"].sum().rename(columns={"part": "score"})
    return _ranked(fused, depth)[["query_id", "doc_id", "rank", "score"]].reset_index(drop=True)


def candidates() -> list[Fusion]:
    """RRF, then the convex weights nearest 0.5 first (the order ties are broken in)."""
    return [Fusion("rrf"), *(Fusion("convex", w) for w in sorted(WEIGHTS, key=lambda w: (abs(w - 0.5), w)))]


def choose_fusion(dense: pd.DataFrame, bm25: pd.DataFrame, qrels: pd.DataFrame, ignore_identical_ids: bool = True,
                  depth: int | None = 1000) -> tuple[Fusion, list[dict]]:
    """The fusion with the best dev nDCG@10 (module docstring), and every candidate's score."""
    if dense.empty or bm25.empty:
        raise AnceError("hybrid retrieval: a dev run is empty; nothing to choose a fusion on")
    scored = []
    for fusion in candidates():
        run = fuse(dense, bm25, fusion, depth, ignore_identical_ids)
        scored.append(fusion.as_dict() | {"dev_ndcg_at_10": evaluate_run(run, qrels)[0]["ndcg_at_10"]})
    best = int(np.argmax([round(s["dev_ndcg_at_10"], 10) for s in scored]))  # the first of equals: the simpler
    return Fusion.of(scored[best]), scored
