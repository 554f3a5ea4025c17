import pandas as pd

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.config import MiningConfig
from ance_core.data import read_tables
from ance_core.mining import ance_negatives
from tasks.common import stage_task


@stage_task("mine-negatives")
def mine_negatives(run: ArtifactRef, data: ArtifactRef, split: str, cfg: MiningConfig, round_: int,
                   work_dir: str) -> ArtifactRef:
    """Negatives = top-k of a run minus all positives, n sampled uniformly per (query, positive)."""

    def build(out):
        positives = read_tables(data.path).positives(split)
        negatives = ance_negatives(pd.read_parquet(f"{run.path}/run.parquet"), positives, cfg.top_k,
                                   cfg.num_negatives, cfg.seed, round_)
        negatives.to_parquet(out / "negatives.parquet", index=False)
        return {"pairs": len(negatives), "mean_negative_rank": float(negatives["negative_ranks"].explode().mean())}

    config = {"mining": cfg, "split": split, "round": round_}
    return run_stage(work_dir, "mine", config, {"run": run.digest, "data": data.digest}, build)
