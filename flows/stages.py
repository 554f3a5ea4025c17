"""Single-purpose flows behind the deployments `bm25-warmup` and `refresh-negatives` (the `evaluate` deployment's
flow is in flows/evaluate.py). Each reuses the stage tasks, so their outputs are shared with the full pipeline."""

from prefect import flow

from ance_core.artifacts import ArtifactRef
from ance_core.config import BM25Config, DataConfig, EncodeConfig, IndexConfig, MiningConfig, PipelineConfig
from ance_core.model import checkpoint_digest
from ance_core.report import read_metrics
from ance_core.samplers import SPARSE, train_config_for
from tasks.bm25 import bm25_run
from tasks.common import run_task
from tasks.data import prepare_data
from tasks.mine import mine_negatives
from tasks.model import init_checkpoint
from tasks.refresh import evaluate_stages, refresh_negatives
from tasks.train import train_round


@flow(name="bm25-warmup", log_prints=True)
def bm25_warmup(config: PipelineConfig = PipelineConfig()) -> dict:
    """Train the starting model on BM25 negatives (the paper's warm-up; `bm25_negatives.sampler` picks others) and
    evaluate it."""
    c, wd, split = config, config.work_dir, config.data.train_split
    data = run_task(prepare_data, c.data, wd)
    mining = c.bm25_negatives
    ranking = run_task(bm25_run, data, c.bm25, split, mining.depth, wd) if mining.sampler in SPARSE else None
    negatives = run_task(mine_negatives, ranking, data, split, mining, 0, wd)
    checkpoint = run_task(train_round, run_task(init_checkpoint, c.model, wd), negatives, data, split,
                          train_config_for(mining, c.warmup), wd)
    refs = evaluate_stages(checkpoint, data, c.data.eval_split, c.eval.top_k, c.encode, c.index, wd)
    metrics = read_metrics(refs["evaluate"])
    print(f"warm-up checkpoint {checkpoint.path}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
    return {"checkpoint": checkpoint.path, "metrics": metrics}


@flow(name="refresh-negatives", log_prints=True)
def refresh_negatives_flow(checkpoint: str, data: DataConfig = DataConfig(), encode: EncodeConfig = EncodeConfig(),
                           index: IndexConfig = IndexConfig(), mining: MiningConfig = MiningConfig(),
                           round_number: int = 1, work_dir: str = "work") -> dict[str, str]:
    """The inferencer alone: encode the corpus with a checkpoint, build the index, mine the next round's negatives
    (with `mining.sampler`; BM25 samplers mine from a BM25 run instead)."""
    ref = ArtifactRef(checkpoint, checkpoint_digest(checkpoint))
    tables = run_task(prepare_data, data, work_dir)
    bm25 = None
    if mining.sampler in SPARSE:
        bm25 = run_task(bm25_run, tables, BM25Config(), data.train_split, mining.depth, work_dir)
    refs = refresh_negatives(ref, tables, data.train_split, encode, index, mining, round_number, work_dir, bm25)
    print("negatives: " + refs["mine"].path)
    return {name: r.path for name, r in refs.items()}
