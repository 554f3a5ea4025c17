"""The approximate indexes the compression table compares with the flat one (HNSW, IVF-PQ over encoded or compressed
shards), and the search latency it reports. `SearchIndex` (retrieval/index.py) loads and searches them."""

import json
import math
import time
from pathlib import Path

import faiss
import numpy as np

from ance_core.artifacts import INDEX
from ance_core.compression.config import CompressConfig, IndexType
from ance_core.errors import AnceError
from ance_core.retrieval.encode import iter_shards
from ance_core.retrieval.index import SEARCH_PARAMS, SearchIndex, _copy_row_ids


def check_ann_options(cfg: CompressConfig, dims: list[int], vectors: int) -> None:
    """The approximate indexes' options against the vectors they will index (`dims`: the teacher's and each compressed
    one), before any compression trains: an IVF-PQ that cannot be built is one line now, not a failure after every
    ConAE fit."""
    if "ivfpq" in cfg.index_types:
        check_ivfpq(cfg, dims, vectors)


def check_ivfpq(cfg: CompressConfig, dims: list[int], vectors: int) -> None:
    """An IVF-PQ of `vectors` vectors of each of `dims` dimensions can be built (`check_ann_options`)."""
    if odd := [d for d in dims if d % cfg.pq_dims_per_code]:
        raise AnceError(f"compression.pq_dims_per_code {cfg.pq_dims_per_code} does not divide the dimension "
                        f"{odd[0]} of the vectors IVF-PQ would index (dims {dims}); give a divisor of each, or leave "
                        "ivfpq out of compression.index_types")
    if vectors < 2:
        raise AnceError(f"IVF-PQ needs at least 2 vectors to train its codes, the corpus has {vectors}; leave ivfpq "
                        "out of compression.index_types")
    if cfg.ivf_nlist is not None and cfg.ivf_nlist > vectors:
        raise AnceError(f"compression.ivf_nlist {cfg.ivf_nlist} is more inverted lists than the corpus has vectors "
                        f"({vectors}); give at most {vectors}, or leave it unset (4 sqrt(n), at most n/39)")


def build_ann_index(embeddings_dir: str | Path, out: Path, kind: IndexType, cfg: CompressConfig) -> dict:
    """An approximate index ('hnsw' or 'ivfpq'; 'flat' is `build_index`) over the shards. IVF-PQ codes
    `cfg.pq_dims_per_code` dimensions per byte (8-bit codes; fewer on collections too small to train 256 centroids
    per sub-quantizer)."""
    vectors = np.ascontiguousarray(np.concatenate(list(iter_shards(embeddings_dir))), dtype=np.float32)
    n, d = vectors.shape
    search: dict[str, int] = {}
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = max(40, 2 * cfg.hnsw_m)
        search = {"efSearch": cfg.hnsw_ef_search}
        summary = {"type": "IndexHNSWFlat", "M": cfg.hnsw_m}
    elif kind == "ivfpq":
        check_ivfpq(cfg, [d], n)  # (n < 2: 2^0 codes, an index faiss writes and cannot read back)
        m, bits = d // cfg.pq_dims_per_code, min(8, int(math.log2(n)))
        nlist = cfg.ivf_nlist or max(1, min(int(4 * math.sqrt(n)), n // 39))
        index = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, nlist, m, bits, faiss.METRIC_INNER_PRODUCT)
        # faiss warns once per sub-quantizer when it has fewer than 39 points per centroid; say it once instead
        index.cp.min_points_per_centroid = index.pq.cp.min_points_per_centroid = 1
        index.train(vectors)
        search = {"nprobe": min(cfg.ivf_nprobe, nlist)}
        summary = {"type": "IndexIVFPQ", "nlist": nlist, "pq_m": m, "pq_bits": bits}
        if n < 39 * 2 ** bits:
            print(f"IVF-PQ: {n} vectors train its 2^{bits} codes per sub-quantizer (faiss suggests at least "
                  f"{39 * 2 ** bits}); on a corpus this small its codes are coarse")
    else:
        raise ValueError(f"build_ann_index: unknown index type '{kind}' (flat indexes come from build_index)")
    index.add(vectors)
    faiss.write_index(index, str(out / INDEX))
    (out / SEARCH_PARAMS).write_text(json.dumps(search))
    _copy_row_ids(embeddings_dir, out)
    return summary | {"vectors": index.ntotal, "dim": d, "bytes": (out / INDEX).stat().st_size} | search


def search_latency(indexes: list[tuple[SearchIndex, np.ndarray]], k: int, batch: int, repeats: int = 5) -> list[dict]:
    """Median search time per query in milliseconds of each (index, queries) pair: `latency_batched_ms` over calls of
    `batch` queries (call time / batch size), `latency_single_ms` over one-query calls. The pairs are measured in
    turn, `repeats` times over (after one untimed call each), so a slow spell of the machine touches all of them."""
    queries = [np.ascontiguousarray(q, dtype=np.float32) for _, q in indexes]
    times: list[dict[str, list[float]]] = [{"batched": [], "single": []} for _ in indexes]
    for (index, _), q in zip(indexes, queries, strict=True):
        index.index.search(q[:batch], min(k, len(index)))
    for _ in range(repeats):
        for (index, _), q, out in zip(indexes, queries, times, strict=True):
            depth = min(k, len(index))
            for size, key in ((min(batch, len(q)), "batched"), (1, "single")):
                for start in range(0, len(q) - size + 1, size):
                    began = time.perf_counter()
                    index.index.search(q[start:start + size], depth)
                    out[key].append((time.perf_counter() - began) / size)
    return [{f"latency_{key}_ms": 1000 * float(np.median(values)) for key, values in t.items()} for t in times]
