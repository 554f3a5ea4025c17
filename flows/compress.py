"""Embedding compression behind the `compress` deployment and the pipeline's `compression` option (ConAE Table 2):
from a trained checkpoint and its corpus encoding, fit ConAE and the PCA / truncation baselines for each L below h,
index every variant (flat, and HNSW / IVF-PQ when asked) and measure quality, index size and search latency.

Every step is a cached stage task: the teacher's corpus encoding is read from the encode stage (the pipeline's own
when it runs at the end of a pipeline), never recomputed. The latency measurement is the one step that is not
cached: all its figures come from one run. The table's files go to <work_dir>/compression/<digest>/, written whole
(`atomic_folder`).
"""

import json
from pathlib import Path

import pandas as pd
from prefect import flow

from ance_core.artifacts import (
    COMPRESSION_CSV,
    COMPRESSION_JSON,
    COMPRESSION_MD,
    ArtifactRef,
    atomic_folder,
    digest_of,
    read_manifest,
    write_json,
)
from ance_core.compression.conae import PROJECTOR_FILE
from ance_core.compression.config import CompressConfig
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.modeling.model import META_FILE, read_meta
from ance_core.pipeline.config import WorkDir
from ance_core.pipeline.report import markdown_table, read_metrics
from ance_core.retrieval.ann import check_ann_options
from ance_core.retrieval.config import EncodeConfig, EvalConfig, ExecutionConfig, IndexConfig
from ance_core.run_records import live_run
from flows.names import dataset_run_name
from flows.publish import flow_tags
from flows.start import held_checkpoint, trained_checkpoint
from tasks.common import run_task
from tasks.compress import ann_index, compress, compressed_model, encode_split_queries, measure_latency
from tasks.data import prepare_data
from tasks.encode import encode_corpus
from tasks.evaluate import evaluate, evaluation_for
from tasks.index import build_index
from tasks.retrieve import dense_run
from tracking.client import Tracker, flatten
from tracking.closing import closing_lines
from tracking.registry import check_model_name, dataset_source, model_name, register_models
from tracking.run import run_url, train_log
from tracking.uploads import log_checkpoint

DEPTH = 100  # the table's metrics (nDCG@10, MRR@10, R@100) need the top 100; latency is measured at the same depth
METRICS = ("ndcg_at_10", "mrr_at_10", "recall_at_100")


def compress_model(checkpoint: ArtifactRef, embeddings: ArtifactRef, data: ArtifactRef, c: CompressConfig,
                   train_split: str, eval_split: str, encode: EncodeConfig, index: IndexConfig, work_dir: str,
                   evaluation: EvalConfig = EvalConfig()) -> dict:
    """The compression table of one checkpoint: a row per (method, L, index type), the teacher's own first."""
    check_firstp(checkpoint.path)
    h = read_manifest(embeddings.path)["summary"]["dim"]
    dims = compressible_dims(c, h)
    if skipped := [d for d in c.dims if d >= h]:
        print(f"compression: skipping L = {skipped}, not below the model's dimension {h}")
    check_ann_options(c, [h, *dims], read_manifest(embeddings.path)["summary"]["documents"])
    train_queries = (run_task(encode_split_queries, checkpoint, data, train_split, encode, work_dir)
                     if "conae" in c.methods and dims else None)
    variants = [("teacher", h, None, checkpoint, embeddings)]
    for dim in dims:
        for method in c.methods:
            ref = run_task(compress, checkpoint, embeddings, train_queries, data, train_split, method, dim, c, work_dir)
            variants.append((method, dim, ref, compressed_model(ref), ref))
    searched = index.model_copy(update={"nprobe": c.ivf_nprobe, "ef_search": c.hnsw_ef_search})  # the table's
    rows = []
    for method, dim, folder, model, vectors in variants:
        for kind in c.index_types:
            built = (run_task(build_index, vectors, work_dir) if kind == "flat"
                     else run_task(ann_index, vectors, kind, c, work_dir))
            run = run_task(dense_run, model, built, data, eval_split, DEPTH, encode, searched, work_dir)
            evaluated = run_task(evaluate, run, data, eval_split, work_dir, evaluation)
            rows.append({"method": method, "dim": dim, "index": kind, "compress": folder, "checkpoint": model,
                         "index_ref": built, "evaluation": evaluated}
                        | {k: v for k, v in read_metrics(evaluated).items() if k in METRICS})  # (R@1000 of a ranking
            # DEPTH deep is R@100: not reported)
    eval_queries = run_task(encode_split_queries, checkpoint, data, eval_split, encode, work_dir)
    measured = measure_latency([(r["index_ref"], r["compress"]) for r in rows], eval_queries, DEPTH, c.latency_batch,
                               searched)
    for row, figures in zip(rows, measured, strict=True):
        row |= figures
    table = compression_table(rows, c.latency_batch)
    out = Path(work_dir) / "compression" / digest_of([checkpoint.digest, [r["evaluation"].digest for r in rows]])
    frame = pd.DataFrame(public_rows(rows))
    with atomic_folder(out) as tmp:  # a reader sees all three files of one run, or none
        frame.to_csv(tmp / COMPRESSION_CSV, index=False)
        (tmp / COMPRESSION_MD).write_text(table + "\n")
        write_json(tmp / COMPRESSION_JSON, {"checkpoint": checkpoint.path, "split": eval_split,
                                            "rows": frame.to_dict("records")})
    print(f"## Compression of {checkpoint.path}, {eval_split}\n\n{table}\n\ntable: {out / COMPRESSION_MD}")
    return {"table": table, "rows": rows, "files": str(out), "checkpoint": checkpoint.path, "split": eval_split}


def compressible_dims(c: CompressConfig, h: int) -> list[int]:
    """The compressed dimensions below the model's `h`, largest first (the others compress nothing)."""
    return sorted((d for d in c.dims if d < h), reverse=True)


def check_firstp(checkpoint: str) -> None:
    """A maxp checkpoint refused (a pretrained model, no ANCE checkpoint yet, is one a run trains: its config says)."""
    if Path(checkpoint, META_FILE).is_file() and read_meta(checkpoint).document_mode == "maxp":
        raise AnceError(f"{checkpoint}: compression of a maxp checkpoint (one vector per window) is not supported; "
                        "compress a firstp model")


def check_compression(checkpoint: str, c: CompressConfig, documents: int) -> None:
    """What a compression would refuse late, refused before any work: a maxp checkpoint, no `dims` below the model's
    dimension (nothing to compress), and approximate-index options the corpus cannot take (`check_ann_options`)."""
    check_firstp(checkpoint)
    config = Path(checkpoint, "config.json")
    try:
        h = int(json.loads(config.read_text())["hidden_size"])  # (the head keeps it: Linear(h, h))
    except (OSError, ValueError, KeyError, TypeError):
        return  # (a model config without it: the stage says what it finds)
    dims = compressible_dims(c, h)
    if not dims:
        raise AnceError(f"compression.dims {c.dims}: none is below the model's dimension {h}, so there is nothing to "
                        "compress; give dimensions below it")
    check_ann_options(c, [h, *dims], documents)


def compression_table(rows: list[dict], batch: int) -> str:
    """ConAE Table 2's layout: quality and size against the teacher's flat index (its first index when flat is not
    compared), and latency."""
    teacher = [r for r in rows if r["method"] == "teacher"]
    base = next((r for r in teacher if r["index"] == "flat"), teacher[0])
    header = ["method", "dim", "index", "nDCG@10", "MRR@10", "R@100", "nDCG@10 vs teacher", "index bytes",
              "size vs teacher", f"latency/query, batched {batch} (ms)", "latency/query, single (ms)"]
    body = [[r["method"], str(r["dim"]), r["index"], *(f"{r[k]:.4f}" for k in METRICS),
             f"{100 * (r['ndcg_at_10'] / base['ndcg_at_10'] - 1):+.1f}%" if base["ndcg_at_10"] else "n/a",
             f"{r['index_bytes']:,}",
             f"{r['index_bytes'] / base['index_bytes']:.2f}×", f"{r['latency_batched_ms']:.4f}",
             f"{r['latency_single_ms']:.4f}"] for r in rows]
    return markdown_table(header, body)


def log_compression(tracker: Tracker, parent: str | None, result: dict, config: CompressConfig, data: DataConfig,
                    tags: dict[str, str]) -> dict:
    """An MLflow run for the compression (nested under the pipeline's run when there is one): its config, the table
    as files, a nested run per row with its metrics, ConAE's training curve and every projector; each ConAE
    compressed checkpoint (teacher files + projector) is registered as a version of `ance-<collection>-compressed`
    (`DataConfig.collection`)."""
    run = tracker.start_run("compression", parent_id=parent, tags=tags | {"teacher": result["checkpoint"]})
    child = None
    with tracker.ended_on_failure(lambda: [child, run]):  # (interrupted: FAILED / KILLED, never left RUNNING)
        tracker.log_params(run, flatten(config))
        for name in (COMPRESSION_MD, COMPRESSION_CSV):
            tracker.log_artifact(run, Path(result["files"]) / name)
        versions, logged, digests, logged_by = [], set(), {}, {}
        for r in result["rows"]:
            label = f"{r['method']}-{r['dim']} {r['index']}"
            child = tracker.start_run(label, parent_id=run, tags=tags | {"method": r["method"], "dim": str(r["dim"]),
                                                                         "index": r["index"]})
            figures = {k: float(r[k]) for k in (*METRICS, "index_bytes", "latency_batched_ms", "latency_single_ms")}
            tracker.log_metrics(child, figures | {"dim": r["dim"]})
            if r["compress"] is not None and r["compress"].path not in logged:  # once per projector
                logged.add(r["compress"].path)
                tracker.log_artifact(child, Path(r["checkpoint"].path) / PROJECTOR_FILE, "projector")
                if r["method"] == "conae":
                    tracker.log_history(child, train_log(r["compress"].path), ["loss", "kl", "l_q", "l_d"])
                    if holder := log_checkpoint(tracker, child, r["checkpoint"].path):  # (undelivered: no version)
                        versions.append((label, holder, {k: float(r[k]) for k in METRICS} | {"dim": r["dim"]}))
                        digests[label] = r["checkpoint"].digest  # (a run again: the same version, not a new one)
                        logged_by[label] = child
            tracker.end_run(child)
        registered = register_models(tracker, f"{model_name(data.collection)}-compressed", versions, data.dataset,
                                     result["split"], source=dataset_source(data), digests=digests,
                                     logged_by=logged_by)
        tracker.end_run(run)
    return {"run_id": run, "registered": registered}


@flow(name="compress", flow_run_name=dataset_run_name, log_prints=True)
def compress_flow(checkpoint: str | None = None, data: DataConfig = DataConfig(), encode: EncodeConfig = EncodeConfig(),
                  index: IndexConfig = IndexConfig(), compression: CompressConfig = CompressConfig(),
                  work_dir: WorkDir = "work", execution: ExecutionConfig = ExecutionConfig(),
                  evaluation: EvalConfig = EvalConfig()) -> dict:
    """Compress a trained checkpoint's embeddings: `checkpoint`, else the champion `models:/ance-<dataset>@champion`,
    else the newest model of the work folder (<work_dir>/latest.json).

    Args:
        checkpoint: The trained checkpoint's folder; unset: the champion, else the work folder's newest model.
        data: The dataset and its splits.
        encode: Corpus and query encoding.
        index: The uncompressed model's index.
        compression: The methods, dimensions and indexes compared (ConAE, PCA, truncation).
        work_dir: Where stage outputs are kept.
        execution: Where mapped tasks (encoding shards) run.
        evaluation: Depth of the ranked lists scored.
    """
    check_model_name(data)  # (its compressed models are registered at the end)
    path, source = trained_checkpoint(work_dir, data.collection, checkpoint, "checkpoint")
    read_meta(path)
    if Path(path, PROJECTOR_FILE).is_file():
        raise AnceError(f"{path}: already a compressed checkpoint; compress its teacher")
    print(f"compressing {source}: {path}")
    with live_run(work_dir, "compress"):  # the stages it uses, which garbage collection leaves
        ref = held_checkpoint(path)  # the teacher too
        tables = run_task(prepare_data, data, work_dir)
        # what `ance compress` checks before the corpus is encoded, for runs from the UI or a deployment too
        check_compression(path, compression, read_manifest(tables.path)["summary"]["documents"])
        embeddings = run_task(encode_corpus, ref, tables, encode, work_dir, execution)
        result = compress_model(ref, embeddings, tables, compression, data.train_split, data.eval_split, encode,
                                index, work_dir, evaluation_for(evaluation, tables))
        tracker = Tracker(work_dir, "compress")  # (in the live run: a gc meanwhile leaves what is being logged)
        tracked = log_compression(tracker, None, result, compression, data, flow_tags())
    summary = tracker.summary() | tracked | {"run_url": run_url(tracker, tracked["run_id"])}
    print("\n".join(closing_lines(summary)))
    return {k: v for k, v in result.items() if k != "rows"} | {"rows": public_rows(result["rows"]), "tracking": summary}


def public_rows(rows: list[dict]) -> list[dict]:
    """The rows without their stage references, plus where each compressed checkpoint and index are."""
    return [{k: v for k, v in r.items() if k not in ("compress", "checkpoint", "index_ref", "evaluation")}
            | {"checkpoint_path": r["checkpoint"].path, "index_path": r["index_ref"].path} for r in rows]
