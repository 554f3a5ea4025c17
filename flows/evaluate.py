"""Evaluation flows: `evaluate` (the `evaluate` deployment and `ance evaluate`) encodes the corpus with a checkpoint,
indexes it and reports the checkpoint's metrics on a split; `bm25-baseline` (`ance bm25`, no deployment) reports BM25's.
Both reuse the pipeline's cached stage tasks: a stage a pipeline run built with the same inputs is not built again."""


from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from pydantic import ValidationError

from ance_core.artifacts import ArtifactRef, read_manifest
from ance_core.data.config import DataConfig
from ance_core.data.sources import BEIR_MD5, resolve_dataset
from ance_core.errors import AnceError
from ance_core.pipeline.config import WorkDir, validation_message
from ance_core.pipeline.report import COLUMNS, read_metrics
from ance_core.retrieval.config import BM25Config, EncodeConfig, EvalConfig, ExecutionConfig, IndexConfig
from ance_core.retrieval.fusion import Fusion
from ance_core.run_records import live_run
from flows.names import dataset_run_name
from flows.publish import artifact_key, publish
from flows.start import held_checkpoint, local_checkpoint
from tasks.bm25 import bm25_run
from tasks.common import run_task
from tasks.data import prepare_data
from tasks.evaluate import evaluate, evaluation_for
from tasks.fusion import fused_run, fusion_choice
from tasks.refresh import evaluate_stages


@flow(name="bm25-baseline", flow_run_name=dataset_run_name)
def bm25_baseline(data: DataConfig = DataConfig(), bm25: BM25Config = BM25Config(),
                  work_dir: WorkDir = "work", evaluation: EvalConfig = EvalConfig(), split: str | None = None) -> dict:
    """BM25's metrics on `split` (default: data.eval_split)."""
    split = split or data.eval_split
    with live_run(work_dir, "bm25-baseline"):  # the stages it uses, which garbage collection leaves
        tables = run_task(prepare_data, data, work_dir)  # (recorded under their locks, cached or built: run_task)
        run = run_task(bm25_run, tables, bm25, split, bm25.top_k, work_dir)
        evaluation = evaluation_for(evaluation, tables)
        return read_metrics(run_task(evaluate, run, tables, split, work_dir, evaluation))


@flow(name="evaluate", flow_run_name=dataset_run_name)
def evaluate_checkpoint(checkpoint: str, data: DataConfig = DataConfig(), encode: EncodeConfig = EncodeConfig(),
                        index: IndexConfig = IndexConfig(), evaluation: EvalConfig = EvalConfig(),
                        work_dir: WorkDir = "work", execution: ExecutionConfig = ExecutionConfig(),
                        split: str | None = None, hybrid: dict | None = None) -> dict:
    """The checkpoint's metrics on `split` (default: data.eval_split); with `hybrid`, those of its ranking fused with
    BM25's, as a pipeline's hybrid row (`dense`: the checkpoint's own).

    Args:
        checkpoint: The checkpoint's folder (a path the worker can read), or a registered model's URI,
            models:/<name>@<alias> or models:/<name>/<version> (downloaded into <work_dir>/champion/).
        data: The dataset and its splits.
        encode: Corpus and query encoding.
        index: The index the split's queries are searched with.
        evaluation: Depth of the ranked lists scored.
        work_dir: Where stage outputs are kept.
        execution: Where mapped tasks (encoding shards) run.
        split: The split evaluated; unset: data.eval_split.
        hybrid: Fuse with BM25: {"fusion": {"method": "rrf" or "convex", "weight": the dense ranking's (convex),
            "k": RRF's} (a pipeline run's choice on its dev split; null: reciprocal-rank fusion), "bm25": the BM25
            settings it fused with}.
    """
    fusing = checked_hybrid(hybrid) if hybrid is not None else None  # (before any work: a UI form's JSON box)
    try:  # a missing dataset: said before a registered model is looked up (one still to download: after it)
        resolve_dataset(data.dataset, data.data_home, download=False)
    except AnceError:
        if not (data.download and data.dataset in BEIR_MD5):  # nothing to download: said in the user's terms
            resolve_dataset(data.dataset, data.data_home, data.download)
    with live_run(work_dir, "evaluate"):  # the stages it uses, which garbage collection leaves
        ref = held_checkpoint(local_checkpoint(work_dir, checkpoint))  # the checkpoint too
        tables = run_task(prepare_data, data, work_dir)
        split = split or data.eval_split
        if split not in (splits := read_manifest(tables.path)["summary"].get("splits", [])):  # (before the corpus
            # is encoded: a misspelt split was said once the index was built)
            raise AnceError(f"split '{split}': {data.collection} has no such split (its splits: {', '.join(splits)})")
        evaluation = evaluation_for(evaluation, tables)
        refs = evaluate_stages(ref, tables, split, evaluation, encode, index, work_dir, execution=execution)
        metrics = read_metrics(refs["evaluate"])
        if hybrid is not None:
            metrics = fused_metrics(refs["retrieve"], tables, split, evaluation, *fusing, work_dir) | {"dense": metrics}
    # what a run started from the UI shows on its page (its return value is not shown there)
    flat = {k: v for k, v in metrics.items() if k != "dense"}
    fused = hybrid is not None  # (`{}` fuses too, by RRF: said as fused, not as the checkpoint's own)
    shown = ", ".join(f"{COLUMNS.get(k, k)} {v:.4f}" for k, v in flat.items()) + (" (+ BM25)" if fused else "")
    get_run_logger().info(f"{checkpoint} on {data.collection} {split}: {shown}")
    publish(create_table_artifact, [{"checkpoint": checkpoint, "split": split} | {
        COLUMNS.get(k, k): round(v, 4) for k, v in flat.items()} | ({"hybrid": "+ BM25"} if fused else {})],
        key=artifact_key("evaluate", data.collection, split), description="the checkpoint's metrics on the split")
    return metrics


HYBRID_KEYS = ("fusion", "bm25")


def checked_hybrid(hybrid: dict) -> tuple[BM25Config, dict | None]:
    """`evaluate_checkpoint`'s `hybrid` read: its BM25 settings and its fusion (None: RRF), or an error naming what
    is wrong in it (a misspelt key was ignored, and a bad fusion said once the corpus was encoded)."""
    if not isinstance(hybrid, dict):
        raise AnceError(f"hybrid: a mapping of {' and '.join(HYBRID_KEYS)}, not {hybrid!r}")
    if unknown := [k for k in hybrid if k not in HYBRID_KEYS]:
        raise AnceError(f"hybrid: {', '.join(map(repr, unknown))} is no key of it; it takes "
                        f"{' and '.join(HYBRID_KEYS)}")
    try:
        bm25 = BM25Config.model_validate(hybrid.get("bm25") or {})
    except ValidationError as e:
        raise AnceError("; ".join(
            f"hybrid.bm25.{'.'.join(map(str, err['loc']))}: " + (
                f"not a setting of hybrid.bm25 (its settings: {', '.join(BM25Config.model_fields)})"
                if err["type"] == "extra_forbidden" else validation_message(err)) for err in e.errors())) from None
    try:
        given = Fusion.of(hybrid["fusion"]).as_dict() if hybrid.get("fusion") else None
    except AnceError as e:
        raise AnceError(f"hybrid.fusion: {e}; null for RRF") from None
    return bm25, given


def fused_metrics(dense: ArtifactRef, tables: ArtifactRef, split: str, evaluation: EvalConfig, bm25: BM25Config,
                  given: dict | None, work_dir: str) -> dict:
    """The metrics of the dense run `dense` fused with BM25's (`evaluate_checkpoint`'s `hybrid`, `checked_hybrid`),
    by the pipeline's hybrid-row stages: BM25's run of the split, the fusion (`given`, or RRF), the fused run and its
    evaluation."""
    sparse = run_task(bm25_run, tables, bm25, split, bm25.top_k, work_dir)
    choice = run_task(fusion_choice, None, None, tables, None, work_dir, evaluation, given)
    fused = run_task(fused_run, dense, sparse, choice, work_dir, evaluation.top_k, evaluation.ignore_identical_ids)
    return read_metrics(run_task(evaluate, fused, tables, split, work_dir, evaluation))
