from pathlib import Path

import pandas as pd

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.config import MiningConfig
from ance_core.data import read_tables
from ance_core.samplers import fallback_stats, sample_negatives
from ance_core.search import score_pairs
from tasks.common import stage_task
from tasks.retrieve import POSITIVE_SCORES


@stage_task("mine-negatives")
def mine_negatives(run: ArtifactRef | None, data: ArtifactRef, split: str, cfg: MiningConfig, round_: int,
                   work_dir: str, scorer: dict[str, ArtifactRef] | None = None) -> ArtifactRef:
    """Negatives per (query, positive) with the configured sampler (ance_core/samplers.py) from a ranking (dense or
    BM25; none for random and in-batch samplers). `scorer` (a checkpoint and its index: the model training starts
    from) scores a BM25 ranking's candidates and the positives: for the `margin` false-negative control, and for a
    MaxP model, each document's best window."""

    def build(out):
        tables = read_tables(data.path)
        ranking = pd.read_parquet(f"{run.path}/run.parquet") if run is not None else None
        scores, windows = None, None  # the positives' exact scores (and MaxP windows): dense retrieval writes them
        table = None
        if run is not None and Path(run.path, POSITIVE_SCORES).is_file():
            table = pd.read_parquet(Path(run.path, POSITIVE_SCORES))
        elif scorer is not None:  # a BM25 ranking (or none), scored by the starting model
            ranking, table = dense_scores(ranking, tables, split, cfg.depth, scorer)
        if table is not None:
            pairs = list(zip(table["query_id"], table["doc_id"], strict=True))
            scores = dict(zip(pairs, table["score"], strict=True))
            windows = dict(zip(pairs, table["window"], strict=True)) if "window" in table else None
        negatives = sample_negatives(
            cfg.sampler, tables.positives(split), cfg.num_negatives, cfg.seed, round_, run=ranking, top_k=cfg.depth,
            positive_scores=scores, corpus_ids=tables.corpus["doc_id"].tolist(), a=cfg.simans_a, b=cfg.simans_b,
            skip_top=cfg.skip_top, margin=cfg.margin, relevant=tables.relevant(split), positive_windows=windows)
        negatives.to_parquet(out / "negatives.parquet", index=False)
        ranks = negatives["negative_ranks"].explode().dropna()
        return {"pairs": len(negatives), "sampler": cfg.sampler,
                "mean_negative_rank": float(ranks[ranks > 0].mean()) if (ranks > 0).any() else None,
                **fallback_stats(negatives)}

    config = {"mining": cfg, "split": split, "round": round_}
    inputs = {"run": run.digest if run is not None else None, "data": data.digest}
    if scorer is not None:
        inputs |= {"scorer_checkpoint": scorer["checkpoint"].digest, "scorer_index": scorer["index"].digest}
    return run_stage(work_dir, "mine", config, inputs, build)


def dense_scores(ranking: pd.DataFrame | None, tables, split: str, depth: int,
                 scorer: dict[str, ArtifactRef]) -> tuple[pd.DataFrame | None, pd.DataFrame]:
    """A BM25 ranking's top-`depth` rows with the scorer model's score and best (MaxP) window instead of BM25's score
    (rank kept: BM25's), and the scorer's scores and windows of the training positives."""
    top = ranking[ranking["rank"] <= depth] if ranking is not None else None
    positives = {(q, d) for q, ds in tables.positives(split).items() for d in ds}
    pairs = sorted(positives | (set(zip(top["query_id"], top["doc_id"], strict=True)) if top is not None else set()))
    scored = score_pairs(scorer["checkpoint"].path, scorer["index"].path, tables.queries, pairs)
    keys = list(zip(scored["query_id"], scored["doc_id"], strict=True))
    if top is not None:
        by_pair = scored.set_index(["query_id", "doc_id"])
        rows = pd.MultiIndex.from_arrays([top["query_id"], top["doc_id"]])
        top = top.assign(score=by_pair["score"].reindex(rows).to_numpy(),
                         window=by_pair["window"].reindex(rows).to_numpy())
    return top, scored[[p in positives for p in keys]]
