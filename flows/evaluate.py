"""Evaluation flows: `evaluate` (the `evaluate` deployment and `ance evaluate`) encodes the corpus with a checkpoint,
indexes it and reports the checkpoint's metrics on a split; `bm25-baseline` (`ance bm25`, no deployment) reports BM25's.
Both reuse the pipeline's cached stage tasks: a stage a pipeline run built with the same inputs is not built again."""

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from ance_core.data.config import DataConfig
from ance_core.pipeline.report import COLUMNS, read_metrics
from ance_core.retrieval.config import BM25Config, EncodeConfig, EvalConfig, ExecutionConfig, IndexConfig
from ance_core.run_records import live_run
from flows.publish import artifact_key, publish
from flows.start import held_checkpoint
from tasks.bm25 import bm25_run
from tasks.common import run_task
from tasks.data import prepare_data
from tasks.evaluate import evaluate, evaluation_for
from tasks.refresh import evaluate_stages


@flow(name="bm25-baseline")
def bm25_baseline(data: DataConfig = DataConfig(), bm25: BM25Config = BM25Config(), work_dir: str = "work",
                  evaluation: EvalConfig = EvalConfig(), split: str | None = None) -> dict:
    """BM25's metrics on `split` (default: data.eval_split)."""
    split = split or data.eval_split
    with live_run(work_dir, "bm25-baseline"):  # the stages it uses, which garbage collection leaves
        tables = run_task(prepare_data, data, work_dir)  # (recorded under their locks, cached or built: run_task)
        run = run_task(bm25_run, tables, bm25, split, bm25.top_k, work_dir)
        evaluation = evaluation_for(evaluation, tables)
        return read_metrics(run_task(evaluate, run, tables, split, work_dir, evaluation))


@flow(name="evaluate")
def evaluate_checkpoint(checkpoint: str, data: DataConfig = DataConfig(), encode: EncodeConfig = EncodeConfig(),
                        index: IndexConfig = IndexConfig(), evaluation: EvalConfig = EvalConfig(),
                        work_dir: str = "work", execution: ExecutionConfig = ExecutionConfig(),
                        split: str | None = None) -> dict:
    """The checkpoint's metrics on `split` (default: data.eval_split).

    Args:
        checkpoint: The checkpoint's folder (a path the worker can read).
        data: The dataset and its splits.
        encode: Corpus and query encoding.
        index: The index the split's queries are searched with.
        evaluation: Depth of the ranked lists scored.
        work_dir: Where stage outputs are kept.
        execution: Where mapped tasks (encoding shards) run.
        split: The split evaluated; unset: data.eval_split.
    """
    with live_run(work_dir, "evaluate"):  # the stages it uses, which garbage collection leaves
        ref = held_checkpoint(checkpoint)  # the checkpoint too
        tables = run_task(prepare_data, data, work_dir)
        split = split or data.eval_split
        evaluation = evaluation_for(evaluation, tables)
        refs = evaluate_stages(ref, tables, split, evaluation, encode, index, work_dir, execution=execution)
        metrics = read_metrics(refs["evaluate"])
    # what a run started from the UI shows on its page (its return value is not shown there)
    shown = ", ".join(f"{COLUMNS.get(k, k)} {v:.4f}" for k, v in metrics.items())
    get_run_logger().info(f"{checkpoint} on {data.collection} {split}: {shown}")
    publish(create_table_artifact, [{"checkpoint": checkpoint, "split": split} | {
        COLUMNS.get(k, k): round(v, 4) for k, v in metrics.items()}],
        key=artifact_key("evaluate", data.collection, split), description="the checkpoint's metrics on the split")
    return metrics
