"""Corpus encoding on Ray vs in the flow's process (issue 15): the `encode` flow (a task per shard) with
execution.task_runner ray, 1 worker x 2 threads then 2 workers x 1 thread, against local (the flow's process, torch's
own threads), on this machine, one run each, nothing cached. Ray's start-up (ray.init until each worker has imported
the stage code) is timed apart; the encode stage's time includes the workers loading the model. Prints each run's
seconds, its ratio to local and the processes that encoded the shards.
    python bench/scale.py [--dataset scifact] [--documents 1024] [--model minilm] [--shards 4] [--max-length 256]

With --memory, the memory-flat measurement instead: the pipeline's stage tasks (data, encode, index, retrieve, mine;
their `.fn`, in the flow's process as the local runner runs them) on synthetic corpora of each size, with the tiny
test model (2 layers, 32-d) and `--queries` training queries; each stage in a fresh process, which reports its peak
RSS (ru_maxrss) and wall time. Prints a row per (corpus size, stage) and the ratios of the largest size to the first.
    python bench/scale.py --memory 100000 1000000 [--queries 20000] [--depth 200] [--index-type flat]
"""

import argparse
import dataclasses
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ance_core.artifacts import read_manifest
from ance_core.data.config import DataConfig
from ance_core.data.sources import resolve_dataset
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model
from ance_core.retrieval.config import EncodeConfig, ExecutionConfig
from ance_core.retrieval.index import index_bytes
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
    start_ray(execution, preload=("tasks.encode",))
    return time.perf_counter() - started


WORDS = ("cell protein gene cancer patients study risk effect mice treatment increase expression blood disease "
         "clinical results human response level activity associated reduced").split()
STAGES = ("data", "encode", "index", "retrieve", "mine")


def synthetic_beir(folder: Path, passages: int, queries: int, seed: int = 0) -> Path:
    """A BEIR folder of `passages` random 30-word passages and `queries` 6-word training queries, each with one
    relevant passage (plus 100 test queries); written line by line."""
    rng = random.Random(seed)
    (folder / "qrels").mkdir(parents=True)
    with open(folder / "corpus.jsonl", "w") as f:
        for i in range(passages):
            f.write(json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(rng.choices(WORDS, k=30))}) + "\n")
    with open(folder / "queries.jsonl", "w") as f, open(folder / "qrels" / "train.tsv", "w") as train, \
            open(folder / "qrels" / "test.tsv", "w") as test:
        train.write("query-id\tcorpus-id\tscore\n")
        test.write("query-id\tcorpus-id\tscore\n")
        for i in range(queries + 100):
            f.write(json.dumps({"_id": f"q{i}", "text": " ".join(rng.choices(WORDS, k=6))}) + "\n")
            (train if i < queries else test).write(f"q{i}\td{rng.randrange(passages)}\t1\n")
    return folder


def run_stage_process(stage: str, work: Path) -> dict:
    """One stage of the memory bench in this process (the child's side): its refs from work/refs.json."""
    from ance_core.artifacts import ArtifactRef
    from ance_core.data.config import DataConfig
    from ance_core.negatives.config import MiningConfig
    from ance_core.retrieval.config import EncodeConfig, IndexConfig
    from tasks.data import prepare_data
    from tasks.encode import encode_corpus
    from tasks.index import build_index
    from tasks.mine import mine_negatives
    from tasks.model import init_checkpoint
    from tasks.retrieve import dense_run

    settings = json.loads((work / "settings.json").read_text())
    refs_file = work / "refs.json"
    refs = {k: ArtifactRef(**v) for k, v in json.loads(refs_file.read_text()).items()} if refs_file.exists() else {}
    wd, encode = str(work / "stages"), EncodeConfig(batch_size=256, shard_size=100_000)
    index_cfg = IndexConfig(type=settings["index_type"])
    started = time.perf_counter()
    if stage == "data":
        from ance_core.modeling.config import ModelConfig

        refs["data"] = prepare_data.fn(DataConfig(dataset=settings["dataset"], dev_fraction=0), wd)
        refs["checkpoint"] = init_checkpoint.fn(ModelConfig(name=settings["model"], passage_max_length=48), wd)
    elif stage == "encode":
        refs["encode"] = encode_corpus.fn(refs["checkpoint"], refs["data"], encode, wd)
    elif stage == "index":
        refs["index"] = build_index.fn(refs["encode"], wd, index_cfg)
    elif stage == "retrieve":
        refs["retrieve"] = dense_run.fn(refs["checkpoint"], refs["index"], refs["data"], "train", settings["depth"],
                                        encode, index_cfg, wd)
    elif stage == "mine":
        refs["mine"] = mine_negatives.fn({"dense": refs["retrieve"]}, refs["data"], "train",
                                         MiningConfig(top_k=settings["depth"]), 1, wd)
    seconds = time.perf_counter() - started
    refs_file.write_text(json.dumps({k: dataclasses.asdict(v) for k, v in refs.items()}))
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"stage": stage, "seconds": seconds, "peak_rss_mb": peak_mb}


def memory_bench(args) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' tiny model
    from tests.tiny import build_tiny_model

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = build_tiny_model(tmp / "tiny-model")
        for passages in args.memory:
            work = tmp / f"n{passages}"
            work.mkdir()
            dataset = synthetic_beir(work / "beir", passages, args.queries)
            (work / "settings.json").write_text(json.dumps({"dataset": str(dataset), "model": str(model),
                                                            "depth": args.depth, "index_type": args.index_type}))
            for stage in STAGES:
                out = subprocess.run([sys.executable, __file__, "--stage", stage, "--work", str(work)],
                                     capture_output=True, text=True, env=os.environ | {"TQDM_DISABLE": "1"})
                if out.returncode:
                    raise SystemExit(f"{stage} at {passages} passages failed:\n{out.stderr[-3000:]}")
                row = json.loads(out.stdout.strip().splitlines()[-1]) | {"passages": passages}
                index_dirs = [p for p in (work / "stages" / "index").glob("*") if p.name[0] != "."] \
                    if stage == "index" else []
                row["index_mb"] = index_bytes(index_dirs[0]) / 2**20 if index_dirs else None  # its size in memory
                rows.append(row)
                print(json.dumps(row), flush=True)
            shutil.rmtree(work)
    print(f"\n{args.queries} training queries, top-{args.depth}, index {args.index_type}, tiny model (32-d), "
          f"{os.cpu_count()} cores")
    print(f"{'passages':>9} {'stage':9} {'seconds':>8} {'µs/passage':>11} {'peak RSS MB':>12}")
    for r in rows:
        print(f"{r['passages']:9d} {r['stage']:9} {r['seconds']:8.1f} {1e6 * r['seconds'] / r['passages']:11.1f} "
              f"{r['peak_rss_mb']:12.0f}" + (f"   (index {r['index_mb']:.0f} MB)" if r["index_mb"] else ""))
    first, last = args.memory[0], args.memory[-1]
    peak = {n: max(r["peak_rss_mb"] for r in rows if r["passages"] == n) for n in (first, last)}
    per = {n: sum(r["seconds"] for r in rows if r["passages"] == n) / n for n in (first, last)}
    index = {n: next(r["index_mb"] for r in rows if r["passages"] == n and r["stage"] == "index")
             for n in (first, last)}
    print(f"peak RSS {last} ÷ {first}: {peak[last] / peak[first]:.2f}x ({peak[last]:.0f} vs {peak[first]:.0f} MB; "
          f"indexes {index[last]:.0f} vs {index[first]:.0f} MB); time per passage {last} ÷ {first}: "
          f"{per[last] / per[first]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--documents", type=int, default=1024)
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--memory", type=int, nargs="+", help="the memory-flat bench on corpora of these sizes")
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--depth", type=int, default=200)
    parser.add_argument("--index-type", default="flat")
    parser.add_argument("--runners", nargs="+", choices=[name for name, _ in RUNS], default=[name for name, _ in RUNS],
                        help="which runners encode the corpus (local always: the others are compared with it)")
    parser.add_argument("--stage", help=argparse.SUPPRESS)  # a memory-bench child process
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        print(json.dumps(run_stage_process(args.stage, Path(args.work))))
        return
    if args.memory:
        memory_bench(args)
        return

    if "local" not in args.runners:
        parser.error("--runners: local is the baseline the others are compared with; name it too")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = DataConfig(dataset=str(subset(resolve_dataset(args.dataset), args.documents, tmp / "data")))
        checkpoint = tmp / "checkpoint"
        init_model(ModelConfig(name=args.model, passage_max_length=args.max_length), checkpoint)
        encode = EncodeConfig(shard_size=-(-args.documents // args.shards), batch_size=args.batch_size)
        encode_flow(str(checkpoint), data, encode, str(tmp / "warm-up"), ExecutionConfig())  # Prefect's server
        rows, files = [], {}
        for name, execution in [(name, execution) for name, execution in RUNS if name in args.runners]:
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
