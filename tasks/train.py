import pandas as pd
from prefect import task

from ance_core.artifacts import ArtifactRef, run_stage
from ance_core.config import TrainConfig
from ance_core.data import read_tables
from ance_core.train import train
from tasks.common import TASK_DEFAULTS


@task(name="train", **TASK_DEFAULTS)
def train_round(checkpoint: ArtifactRef, negatives: ArtifactRef, data: ArtifactRef, split: str, cfg: TrainConfig,
                work_dir: str) -> ArtifactRef:
    """Train from a checkpoint on mined negatives; a retried or re-run task resumes from its last checkpoint."""

    def build(out):
        tables = read_tables(data.path)
        pairs = pd.read_parquet(f"{negatives.path}/negatives.parquet")
        return train(checkpoint.path, pairs, tables.corpus, tables.queries, tables.positives(split), cfg, out)

    inputs = {"checkpoint": checkpoint.digest, "negatives": negatives.digest, "data": data.digest}
    return run_stage(work_dir, "train", {"train": cfg, "split": split}, inputs, build, resumable=True)
