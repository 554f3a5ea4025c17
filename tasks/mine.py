from pathlib import Path

import pandas as pd

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.config import MiningConfig
from ance_core.data import read_tables
from ance_core.samplers import sample_negatives
from tasks.common import stage_task
from tasks.retrieve import POSITIVE_SCORES


@stage_task("mine-negatives")
def mine_negatives(run: ArtifactRef | None, data: ArtifactRef, split: str, cfg: MiningConfig, round_: int,
                   work_dir: str) -> ArtifactRef:
    """Negatives per (query, positive) with the configured sampler (ance_core/samplers.py) from a ranking (dense or
    BM25; none for random and in-batch samplers)."""

    def build(out):
        tables = read_tables(data.path)
        ranking = pd.read_parquet(f"{run.path}/run.parquet") if run is not None else None
        scores = None  # the positives' exact scores: written by dense retrieval, not by BM25
        if run is not None and Path(run.path, POSITIVE_SCORES).is_file():
            table = pd.read_parquet(Path(run.path, POSITIVE_SCORES))
            scores = dict(zip(zip(table["query_id"], table["doc_id"], strict=True), table["score"], strict=True))
        negatives = sample_negatives(
            cfg.sampler, tables.positives(split), cfg.num_negatives, cfg.seed, round_, run=ranking, top_k=cfg.depth,
            positive_scores=scores, corpus_ids=tables.corpus["doc_id"].tolist(), a=cfg.simans_a, b=cfg.simans_b,
            skip_top=cfg.skip_top, margin=cfg.margin)
        negatives.to_parquet(out / "negatives.parquet", index=False)
        ranks = negatives["negative_ranks"].explode().dropna()
        return {"pairs": len(negatives), "sampler": cfg.sampler,
                "mean_negative_rank": float(ranks[ranks > 0].mean()) if (ranks > 0).any() else None}

    config = {"mining": cfg, "split": split, "round": round_}
    inputs = {"run": run.digest if run is not None else None, "data": data.digest}
    return run_stage(work_dir, "mine", config, inputs, build)
