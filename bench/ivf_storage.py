"""IVF lists stored as float32, fp16 or 8-bit scalar quantisation (`index.ivf_storage`), against the exact flat
index, on one checkpoint's corpus encoding and a collection's queries: the index's bytes, how much of the exact
top-100 each finds (at the pipeline's nprobe), nDCG@10, and queries/s of the search (this machine's cores).

    python bench/ivf_storage.py --checkpoint work/train/<key> --embeddings work/encode/<key> [--dataset scifact]
                                [--split test] [--nprobe 32] [--json FILE]
"""

import argparse
import json
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--embeddings", type=Path, required=True)
    parser.add_argument("--dataset", default="scifact")
    parser.add_argument("--split", default="test")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    _, qrels, queries = split_queries(args.dataset, args.split)
    emb = Encoder(args.checkpoint, backend="torch").encode(queries["text"].tolist(), "query")
    report, exact = [], None
    with tempfile.TemporaryDirectory(prefix="bench-ivf-") as tmp:
        for kind, storage in (("flat", "flat"), ("ivf", "flat"), ("ivf", "fp16"), ("ivf", "sq8")):
            cfg = IndexConfig(type=kind, ivf_storage=storage, nprobe=args.nprobe, device="cpu")
            out = Path(tmp) / f"{kind}-{storage}"
            out.mkdir()
            summary = build_index(args.embeddings, out, cfg)
            index = SearchIndex(out, cfg)
            started = time.perf_counter()
            scores, ids = index.search(emb, 100)
            seconds = time.perf_counter() - started
            if exact is None:
                exact = ids
            run = pd.DataFrame([(q, d, float(s)) for q, row, srow in zip(queries.index, ids, scores, strict=True)
                                for d, s in zip(row, srow, strict=True) if d],
                               columns=["query_id", "doc_id", "score"])
            metrics, _ = evaluate_run(run, qrels)
            found = np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, exact, strict=True)])
            row = {"index": summary["type"], "storage": storage if kind == "ivf" else "shards (float16 on disk)",
                   "nlist": summary.get("nlist"), "nprobe": args.nprobe if kind == "ivf" else None,
                   "bytes": index_bytes(out), "exact_top100_found": round(float(found), 4),
                   "ndcg_at_10": round(metrics["ndcg_at_10"], 4), "queries_per_s": round(len(emb) / seconds, 1)}
            report.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
