"""Corpus encoding on Ray vs in the flow's process (issue 15): the `encode` flow (a task per shard) with
execution.task_runner ray, 1 worker x 2 threads then 2 workers x 1 thread, against local (the flow's process, torch's
own threads), on this machine, one run each, nothing cached. Ray's start-up (ray.init until each worker has imported
the stage code) is timed apart; the encode stage's time includes the workers loading the model. Prints each run's
seconds, its ratio to local and the processes that encoded the shards.
    python bench/scale.py [--dataset scifact] [--documents 1024] [--model minilm] [--shards 4] [--max-length 256]
"""

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from ance_core.artifacts import read_manifest
from ance_core.config import DataConfig, EncodeConfig, ExecutionConfig, ModelConfig
from ance_core.data import resolve_dataset
from ance_core.model import init_model
from flows.stages import encode_flow
from tasks.execution import start_ray

RUNS = [("local", ExecutionConfig()),
        ("ray 1x2", ExecutionConfig(task_runner="ray", workers=1, threads_per_worker=2)),
        ("ray 2x1", ExecutionConfig(task_runner="ray", workers=2, threads_per_worker=1))]


def subset(dataset: Path, documents: int, out: Path) -> Path:
    """The first `documents` documents of a BEIR dataset, with the queries and qrels that point into them."""
    (out / "qrels").mkdir(parents=True)
    lines = (dataset / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:documents]
    (out / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    kept = {json.loads(line)["_id"] for line in lines}
    (out / "queries.jsonl").write_text((dataset / "queries.jsonl").read_text(encoding="utf-8"), encoding="utf-8")
    for split in ("train", "test"):
        rows = (dataset / "qrels" / f"{split}.tsv").read_text().splitlines()
        rows = rows[:1] + [r for r in rows[1:] if r.split("\t")[1] in kept]
        (out / "qrels" / f"{split}.tsv").write_text("\n".join(rows) + "\n")
    return out


def ray_startup(execution: ExecutionConfig) -> float:
    """Seconds from ray.init until each worker has imported the stage code (tasks/execution.py `start_ray`)."""
    import ray

    ray.shutdown()
    started = time.perf_counter()
    start_ray(execution)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--documents", type=int, default=1024)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = DataConfig(dataset=str(subset(resolve_dataset(args.dataset), args.documents, tmp / "data")))
        checkpoint = tmp / "checkpoint"
        init_model(ModelConfig(name=args.model, passage_max_length=args.max_length), checkpoint)
        encode = EncodeConfig(shard_size=-(-args.documents // args.shards), batch_size=args.batch_size)
        encode_flow(str(checkpoint), data, encode, str(tmp / "warm-up"), ExecutionConfig())  # Prefect's server
        rows, files = [], {}
        for name, execution in RUNS:
            startup = ray_startup(execution) if execution.task_runner == "ray" else 0.0
            started = time.perf_counter()
            result = encode_flow(str(checkpoint), data, encode, str(tmp / name.replace(" ", "-")), execution)
            wall = time.perf_counter() - started
            summary = read_manifest(result["encode"])["summary"]
            files[name] = [p.read_bytes() for p in sorted(Path(result["encode"]).glob("emb_*.npy"))]
            rows.append((name, startup, result["seconds"], wall, summary["workers"]))
    local = rows[0][2]
    print(f"\n{args.documents} documents of {args.dataset}, {args.model} at {args.max_length} tokens, "
          f"{args.shards} shards, {os.cpu_count()} cores")
    print(f"{'runner':10} {'ray start-up s':>14} {'encode s':>9} {'flow s':>7} {'encode ÷ local':>15}  workers (pids)")
    for name, startup, seconds, wall, workers in rows:
        print(f"{name:10} {startup:14.1f} {seconds:9.1f} {wall:7.1f} {seconds / local:14.2f}x  {' '.join(workers)}")
    print("embeddings identical to local: " + ", ".join(f"{n} {files[n] == files['local']}" for n, *_ in rows[1:]))


if __name__ == "__main__":
    main()
