"""IVF lists stored as float32, fp16 or 8-bit scalar quantisation (`index.ivf_storage`), against the exact flat
index, on one checkpoint's corpus encoding and a collection's queries: the index's bytes, how much of the exact
top-100 each finds (at the pipeline's nprobe), nDCG@10, and queries/s of the search (this machine's cores).

    python bench/ivf_storage.py --checkpoint work/train/<key> --embeddings work/encode/<key> [--dataset scifact]
                                [--split test] [--nprobe 32] [--json FILE]
    python bench/ivf_storage.py --synthetic 1000000x384 [--queries 1000] [--nprobe 32] [--json FILE]

--synthetic: no model or qrels; unit vectors in clusters (a Gaussian mixture of n/100 centres, each vector's cosine
to its centre about 0.7, as a dense model's neighbourhoods are), written as an encoding's float16 shards, and queries
drawn around the same centres, a little farther (none a near-copy of a corpus vector): how much of the exact top-10
and top-100 each storage finds at this size.
"""

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from onnx_serving import split_queries  # bench/onnx_serving.py (this script runs as bench/ivf_storage.py)

from ance_core.export.encoder import Encoder
from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.evaluate import evaluate_run
from ance_core.retrieval.index import SearchIndex, build_index, index_bytes


def synthetic_encoding(folder: Path, n: int, d: int, queries: int, seed: int = 0,
                       shard: int = 100_000) -> np.ndarray:
    """An encoding folder of n clustered unit vectors (float16 shards, doc ids d0...), and `queries` query vectors."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((max(1, n // 100), d), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def vectors(rows: int, spread: float) -> np.ndarray:
        v = centres[rng.integers(0, len(centres), rows)] + spread * rng.standard_normal((rows, d), dtype=np.float32) \
            / np.sqrt(d)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    folder.mkdir(parents=True, exist_ok=True)
    for i, start in enumerate(range(0, n, shard)):
        np.save(folder / f"emb_{i:05d}.npy", vectors(min(shard, n - start), 1.0).astype(np.float16))
    (folder / "docids.txt").write_text("".join(f"d{i}\n" for i in range(n)))
    return vectors(queries, 1.2).astype(np.float32)


STORAGES = (("flat", "flat"), ("ivf", "flat"), ("ivf", "fp16"), ("ivf", "sq8"))  # the exact index first


def searched(embeddings: Path, emb: np.ndarray, nprobe: int, tmp: Path):
    """Per index of STORAGES over the encoding: (kind, storage, build summary, bytes, scores, ids of the top 100,
    build seconds, search seconds); each IVF index removed once searched."""
    for kind, storage in STORAGES:
        cfg = IndexConfig(type=kind, ivf_storage=storage, nprobe=nprobe, device="cpu")
        out = tmp / f"{kind}-{storage}"
        out.mkdir()
        started = time.perf_counter()
        summary = build_index(embeddings, out, cfg)
        built = time.perf_counter() - started
        index = SearchIndex(out, cfg)
        started = time.perf_counter()
        scores, ids = index.search(emb, 100)
        seconds = time.perf_counter() - started
        size = index_bytes(out)
        del index
        if kind == "ivf":
            shutil.rmtree(out)
        yield kind, storage, summary, size, scores, ids, built, seconds


def found(ids: np.ndarray, exact: np.ndarray, k: int) -> float:
    """The share of the exact top-k each query's top-k holds, averaged."""
    return round(float(np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(ids, exact, strict=True)])), 4)


def synthetic(args) -> list[dict]:
    n, d = map(int, args.synthetic.split("x"))
    report, exact = [], None
    with tempfile.TemporaryDirectory(prefix="bench-ivf-") as tmp:
        emb = synthetic_encoding(Path(tmp) / "encode", n, d, args.queries)
        for kind, storage, summary, size, _, ids, built, seconds in searched(Path(tmp) / "encode", emb, args.nprobe,
                                                                            Path(tmp)):
            exact = ids if exact is None else exact
            row = {"vectors": n, "dim": d, "index": summary["type"], "storage": storage if kind == "ivf" else "exact",
                   "nlist": summary.get("nlist"), "nprobe": args.nprobe if kind == "ivf" else None, "bytes": size,
                   "exact_top10_found": found(ids, exact, 10), "exact_top100_found": found(ids, exact, 100),
                   "build_s": round(built, 1), "queries_per_s": round(len(emb) / seconds, 1)}
            report.append(row)
            print(json.dumps(row), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--synthetic", help="NxD: clustered synthetic vectors instead of a checkpoint's encoding")
    parser.add_argument("--queries", type=int, default=1000, help="--synthetic: query vectors")
    parser.add_argument("--checkpoint", type=Path)
    parser.add_argument("--embeddings", type=Path)
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.synthetic:
        report = synthetic(args)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
        return
    if args.checkpoint is None or args.embeddings is None:
        parser.error("--checkpoint and --embeddings (or --synthetic NxD)")
    _, qrels, queries = split_queries(args.dataset, args.split)
    emb = Encoder(args.checkpoint, backend="torch").encode(queries["text"].tolist(), "query")
    report, exact = [], None
    with tempfile.TemporaryDirectory(prefix="bench-ivf-") as tmp:
        for kind, storage, summary, size, scores, ids, _, seconds in searched(args.embeddings, emb, args.nprobe,
                                                                             Path(tmp)):
            exact = ids if exact is None else exact
            run = pd.DataFrame([(q, d, float(s)) for q, row, srow in zip(queries.index, ids, scores, strict=True)
                                for d, s in zip(row, srow, strict=True) if d],
                               columns=["query_id", "doc_id", "score"])
            metrics, _ = evaluate_run(run, qrels)
            row = {"index": summary["type"], "storage": storage if kind == "ivf" else "shards (float16 on disk)",
                   "nlist": summary.get("nlist"), "nprobe": args.nprobe if kind == "ivf" else None, "bytes": size,
                   "exact_top100_found": found(ids, exact, 100), "ndcg_at_10": round(metrics["ndcg_at_10"], 4),
                   "queries_per_s": round(len(emb) / seconds, 1)}
            report.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
