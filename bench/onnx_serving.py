"""Serving the query encoder on CPU: PyTorch fp32 against its ONNX export (`ance export --format onnx`) on onnxruntime,
fp32 and int8 (dynamic quantisation), on one trained checkpoint and a collection's test queries.

- quality: nDCG@10 (and R@100) of each query encoder against the same corpus embeddings (the checkpoint's encode
  folder, --embeddings, or encoded here with PyTorch), exact dot-product search;
- speed: queries/s and per-call latency p50 / p99 for calls of 1 and of 32 queries (--calls calls each, the test
  queries in turn, after --warmup calls), on the threads each runtime takes by default (this machine's cores).

    python bench/onnx_serving.py --checkpoint work/train/<key> [--embeddings work/encode/<key>]
                                 [--dataset scifact | --data work/data/<key>] [--split test] [--calls 300]
                                 [--int8-variants] [--json FILE]

`--data`: a run's data stage folder instead of a raw collection, so that its carved dev split can be read (the split
then defaults to dev: how the export's int8 recipe is chosen, never on test). `--int8-variants`: also the four
dynamic quantisations the export chose among (per tensor / per channel, every operator / the matrix products only).
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ance_core.data.dataset import load_dataset, passage_texts, read_tables
from ance_core.data.sources import resolve_dataset
from ance_core.export.encoder import Encoder
from ance_core.export.onnx import FP32, INT8, ONNX_DIR, OnnxEncoder, export_onnx
from ance_core.retrieval.encode import iter_shards, read_docids
from ance_core.retrieval.evaluate import evaluate_run

# (name, per_channel, operators quantised): the dynamic int8 quantisations the export's `--int8` was chosen among
INT8_VARIANTS = [("per tensor, every operator", False, None), ("per tensor, matrix products", False, ["MatMul"]),
                 ("per channel, every operator", True, None), ("per channel, matrix products", True, ["MatMul"])]


def split_queries(dataset: str | None, split: str, data_stage: Path | None = None):
    """The collection (a raw one by name or path, or a data stage's tables), a split's qrels and its judged queries
    (indexed by query id, sorted)."""
    data = read_tables(data_stage) if data_stage else load_dataset(resolve_dataset(dataset, download=False))
    qrels = data.split_qrels(split)
    return data, qrels, data.queries.set_index("query_id").loc[sorted(qrels["query_id"].unique())]


def search(queries: np.ndarray, docs: np.ndarray, ids: list[str], query_ids: list[str], k: int = 100) -> pd.DataFrame:
    scores = queries @ docs.T
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    rows = []
    for qid, cand, row in zip(query_ids, top, scores, strict=True):
        for d in cand:
            rows.append((qid, ids[d], float(row[d])))
    return pd.DataFrame(rows, columns=["query_id", "doc_id", "score"])


def latency(encode, texts: list[str], batch: int, calls: int, warmup: int) -> dict:
    times, encoded = [], 0
    for c in range(warmup + calls):
        start = (c * batch) % max(1, len(texts) - batch)
        part = texts[start:start + batch]  # (fewer than `batch` where the split has fewer queries)
        started = time.perf_counter()
        encode(part)
        if c >= warmup:
            times.append(time.perf_counter() - started)
            encoded += len(part)
    times = np.asarray(times)
    return {"batch": batch, "calls": calls, "queries_per_s": round(encoded / times.sum(), 1),
            "p50_ms": round(float(np.percentile(times, 50)) * 1e3, 2),
            "p99_ms": round(float(np.percentile(times, 99)) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--embeddings", type=Path, help="the checkpoint's encode folder (default: encode here)")
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--data", type=Path, help="a run's data stage folder (work/data/<key>) instead of --dataset")
    parser.add_argument("--split", help="default: dev with --data, test with --dataset")
    parser.add_argument("--int8-variants", action="store_true", help="also the four dynamic int8 quantisations")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    split = args.split or ("dev" if args.data else "test")
    data, qrels, queries = split_queries(args.dataset, split, args.data)
    texts, query_ids = queries["text"].tolist(), queries.index.tolist()
    torch_encoder = Encoder(args.checkpoint, backend="torch")
    if args.embeddings:
        docs, ids = np.concatenate(list(iter_shards(args.embeddings))).astype(np.float32), read_docids(args.embeddings)
    else:
        docs, ids = torch_encoder.encode(passage_texts(data.corpus)), data.corpus["doc_id"].tolist()
    report: dict = {"checkpoint": str(args.checkpoint), "dataset": str(args.data or args.dataset), "split": split,
                    "queries": len(texts), "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory(prefix="bench-onnx-") as tmp:
        exported = export_onnx(args.checkpoint, Path(tmp) / "onnx", int8=True)
        report["export_max_relative_difference"] = exported["max_relative_difference"]
        meta = torch_encoder.meta
        length = meta.query_max_length
        encoders = {"pytorch fp32": lambda t: torch_encoder.encode(t, "query")}
        for name, file in (("onnx fp32", FP32), ("onnx int8", INT8)):
            onnx = OnnxEncoder(Path(tmp) / "onnx", file=Path(tmp) / "onnx" / ONNX_DIR / file)
            encoders[name] = lambda t, onnx=onnx: onnx.encode_texts(meta.queries(t), length)
            report[f"{name} file_mb"] = round((Path(tmp) / "onnx" / ONNX_DIR / file).stat().st_size / 2**20, 1)
        for name, per_channel, operators in INT8_VARIANTS if args.int8_variants else []:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            file = Path(tmp) / f"variant-{len(encoders)}.onnx"
            quantize_dynamic(str(Path(tmp) / "onnx" / ONNX_DIR / FP32), str(file), weight_type=QuantType.QInt8,
                             per_channel=per_channel, op_types_to_quantize=operators)
            onnx = OnnxEncoder(Path(tmp) / "onnx", file=file)
            encoders[f"int8 {name}"] = lambda t, onnx=onnx: onnx.encode_texts(meta.queries(t), length)
            report[f"int8 {name} file_mb"] = round(file.stat().st_size / 2**20, 1)
        reference = encoders["pytorch fp32"](texts)
        for name, encode in encoders.items():
            emb = encode(texts)
            metrics, _ = evaluate_run(search(emb, docs, ids, query_ids), qrels)
            row = {"ndcg_at_10": round(metrics["ndcg_at_10"], 4), "recall_at_100": round(metrics["recall_at_100"], 4),
                   "max_abs_difference": float(np.abs(emb - reference).max()),
                   "latency": [latency(encode, texts, b, args.calls, args.warmup) for b in (1, 32)]}
            report[name] = row
            print(name, json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
