import pandas as pd

from ance_core.analysis import negative_stats, query_sample
from ance_core.artifacts import ArtifactRef, run_stage, write_json
from ance_core.data import read_tables
from tasks.common import stage_task

SAMPLE_QUERIES, SAMPLE_SEED, DEPTH = 200, 0, 100


@stage_task("negative-stats")
def negatives_analysis(negatives: ArtifactRef, run: ArtifactRef, data: ArtifactRef, split: str,
                       work_dir: str) -> ArtifactRef:
    """How the negatives a model trained on relate to its own ranking (ance_core.analysis), on a fixed query sample."""

    def build(out):
        tables = read_tables(data.path)
        positives = tables.positives(split)
        table = pd.read_parquet(f"{negatives.path}/negatives.parquet")
        sample = query_sample(table["query_id"], SAMPLE_QUERIES, SAMPLE_SEED)
        stats = negative_stats(table, pd.read_parquet(f"{run.path}/run.parquet"), positives, sample, DEPTH)
        write_json(out / "stats.json", stats)
        return stats

    config = {"split": split, "sample": SAMPLE_QUERIES, "seed": SAMPLE_SEED, "depth": DEPTH}
    inputs = {"negatives": negatives.digest, "run": run.digest, "data": data.digest}
    return run_stage(work_dir, "negative-stats", config, inputs, build)
