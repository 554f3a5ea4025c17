"""Exact inner-product search: faiss-cpu's IndexFlatIP against the torch backend (index.backend: torch, issue 42),
on the same machine, on random unit vectors stored as the encoding stores them (float16).

For each --shape N x D: queries/s of faiss-cpu (all the machine's cores, --faiss-queries queries) and of
`TorchFlatIndex` on the device torch picks (--torch-queries queries, in batches of --batch; after one warm-up
search), the ratio of the two, and how far the torch backend's top-k agrees with faiss's (share of faiss's ids found,
over the queries both searched: ties and the last float bits aside, 1.0).

    python bench/search.py [--shape 5183x384 --shape 1000000x768] [--k 100] [--json FILE]
"""

import argparse
import json
import time

import numpy as np
import torch

from ance_core.retrieval.torch_index import TorchFlatIndex


def unit_rows(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, d), dtype=np.float16)
    for start in range(0, n, 100_000):  # a block at a time: float32 only for one block
        block = rng.standard_normal((min(100_000, n - start), d), dtype=np.float32)
        out[start:start + len(block)] = block / np.linalg.norm(block, axis=1, keepdims=True)
    return out


def bench_shape(n: int, d: int, args) -> dict:
    import faiss

    vectors = unit_rows(n, d, 0)
    queries = unit_rows(max(args.faiss_queries, args.torch_queries), d, 1).astype(np.float32)
    started = time.perf_counter()
    flat = faiss.IndexFlatIP(d)
    flat.add(vectors.astype(np.float32))
    faiss_build = time.perf_counter() - started
    flat.search(queries[:1], args.k)  # warm-up, as torch's below: the first call starts faiss's OpenMP threads
    started = time.perf_counter()
    _, faiss_ids = flat.search(queries[: args.faiss_queries], args.k)
    faiss_seconds = time.perf_counter() - started
    del flat
    device = "cuda" if torch.cuda.is_available() else "cpu"
    started = time.perf_counter()
    index = TorchFlatIndex([vectors], device)
    torch_build = time.perf_counter() - started
    index.search(queries[: args.batch], args.k)  # warm-up: kernels, allocator
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    started = time.perf_counter()
    torch_ids = [index.search(queries[s: s + args.batch], args.k)[1] for s in range(0, args.torch_queries, args.batch)]
    sync()
    torch_seconds = time.perf_counter() - started
    torch_ids = np.concatenate(torch_ids)
    both = min(args.faiss_queries, args.torch_queries)
    agree = np.mean([len(set(a) & set(b)) / len(a) for a, b in zip(faiss_ids[:both], torch_ids[:both], strict=True)])
    faiss_qps, torch_qps = args.faiss_queries / faiss_seconds, args.torch_queries / torch_seconds
    return {"vectors": n, "dim": d, "k": args.k, "faiss_threads": faiss.omp_get_max_threads(),
            "faiss_build_s": round(faiss_build, 2), "faiss_queries": args.faiss_queries,
            "faiss_qps": round(faiss_qps, 1), "torch_device": torch.cuda.get_device_name() if device == "cuda" else
            "cpu", "torch_resident": index.resident, "torch_build_s": round(torch_build, 2),
            "torch_queries": args.torch_queries, "torch_qps": round(torch_qps, 1),
            "torch_over_faiss": round(torch_qps / faiss_qps, 2), "topk_agreement": round(float(agree), 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", action="append", help="N x D, e.g. 1000000x768 (repeatable)")
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--faiss-queries", type=int, default=1000)
    parser.add_argument("--torch-queries", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--json")
    args = parser.parse_args()
    report = []
    for shape in args.shape or ["5183x384", "1000000x768"]:
        n, d = (int(x) for x in shape.lower().split("x"))
        report.append(bench_shape(n, d, args))
        print(json.dumps(report[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
