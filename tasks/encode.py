"""The corpus encoding stage: one task per shard of `encode.shard_size` documents (its own cached, retried task run,
on the runner `execution` names: tasks/execution.py), then the encode folder assembled from the shards: the same
layout (emb_<k>.npy, docids.txt) whichever runner encoded them."""

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import torch

from ance_core.artifacts import ArtifactRef, read_manifest, run_stage
from ance_core.faults import fault_point
from ance_core.retrieval.config import EncodeConfig, ExecutionConfig
from ance_core.retrieval.encode import assemble_shards, release_checkpoint, shard_ranges
from ance_core.retrieval.encode import encode_shard as core_encode_shard
from ance_core.system_metrics import SystemSampler
from tasks.common import progress_artifact, stage_task
from tasks.execution import run_mapped

CORPUS = "corpus.parquet"  # the data stage's corpus table


@stage_task("encode-shard", ignore=("threads",), task_run_name="encode-shard-{shard}")
def encode_shard(checkpoint: ArtifactRef, data: ArtifactRef, cfg: EncodeConfig, shard: int, work_dir: str,
                 threads: int | None = None) -> ArtifactRef:
    """Documents [shard * shard_size, (shard + 1) * shard_size) of the corpus into an encode-shard folder."""
    if threads is not None:
        torch.set_num_threads(threads)
    inputs = {"checkpoint": checkpoint.digest, "data": data.digest, "shard": str(shard)}

    def build(out):
        corpus_file = pq.ParquetFile(Path(data.path, CORPUS))
        start, stop = shard_ranges(corpus_file.metadata.num_rows, cfg.shard_size)[shard]
        corpus = read_rows(corpus_file, start, stop)
        return core_encode_shard(checkpoint.path, corpus, cfg, out, label=f"encode shard {shard}")

    ref = run_stage(work_dir, "encode-shard", cfg, inputs, build)
    if not ref.cached:
        fault_point("encode-corpus", shard + 1)  # ANCE_FAULT=encode-corpus@N: after the N-th shard is written
    return ref


@stage_task("encode-corpus", ignore=("execution",))
def encode_corpus(checkpoint: ArtifactRef, data: ArtifactRef, cfg: EncodeConfig, work_dir: str,
                  execution: ExecutionConfig = ExecutionConfig()) -> ArtifactRef:
    """Encode every passage with a checkpoint into .npy shards, a task per shard on the `execution` runner."""
    inputs = {"checkpoint": checkpoint.digest, "data": data.digest}

    def build(out):
        documents = pq.ParquetFile(Path(data.path, CORPUS)).metadata.num_rows
        threads = None if execution.task_runner == "local" else execution.threads_per_worker
        calls = [dict(checkpoint=checkpoint, data=data, cfg=cfg, shard=k, work_dir=work_dir, threads=threads)
                 for k in range(len(shard_ranges(documents, cfg.shard_size)))]
        bar = progress_artifact(len(calls), f"encoding the corpus: {documents:,} documents in {len(calls)} shards")
        try:  # system metrics of this host (the shards' own, where they run here) while the shards are encoded
            with SystemSampler(out):
                shards = run_mapped(encode_shard, calls, execution, done=bar)
        finally:
            release_checkpoint()  # a local run loaded it in this process
        summaries = [read_manifest(ref.path)["summary"] for ref in shards]
        return assemble_shards([ref.path for ref in shards], out) | {
            "documents": documents, "dim": summaries[0]["dim"], "device": summaries[0]["device"],
            "task_runner": execution.task_runner, "cached_shards": sum(ref.cached for ref in shards),
            "workers": sorted({f"{s['host']}:{s['pid']}" for s in summaries})}

    return run_stage(work_dir, "encode", cfg, inputs, build)


def read_rows(table: pq.ParquetFile, start: int, stop: int) -> pd.DataFrame:
    """Rows [start, stop) of a parquet file, reading only the row groups that hold them (the whole corpus is never in
    a shard task's memory when the file has several groups)."""
    groups, offset, first = [], 0, None
    for k in range(table.metadata.num_row_groups):
        rows = table.metadata.row_group(k).num_rows
        if offset < stop and offset + rows > start:
            groups.append(k)
            first = offset if first is None else first
        offset += rows
    if not groups:
        return table.schema_arrow.empty_table().to_pandas()
    frame = table.read_row_groups(groups).to_pandas()
    return frame.iloc[start - first : stop - first].reset_index(drop=True)
