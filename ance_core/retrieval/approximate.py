"""An approximate index before its vectors are added: IVF (its lists' storage, its quantizer trained on a sample
of the encoding) or HNSW."""

import math
from pathlib import Path

import faiss
import numpy as np

from ance_core.artifacts import shard_paths
from ance_core.retrieval.config import IndexConfig

SCALAR_QUANTIZERS = {"sq8": faiss.ScalarQuantizer.QT_8bit, "fp16": faiss.ScalarQuantizer.QT_fp16}


# ivf_storage auto: half-precision lists from this many bytes of float32 lists on. Measured (bench/ivf_storage.py,
# BENCHMARKS.md): fp16 found the exact top-10 and top-100 as float32 lists did (SciFact; 1M x 384 synthetic), in half
# the bytes and 1.7x the queries/s; sq8 (a quarter) lost 1.6 points of the top-10 at 1M: an option, not the default
FP16_FROM_BYTES = 1 << 30


def ivf_storage(cfg: IndexConfig, n: int, d: int) -> str:
    """How an IVF index of n d-dimensional vectors stores its lists (`ivf_storage`, auto resolved)."""
    if cfg.ivf_storage != "auto":
        return cfg.ivf_storage
    return "fp16" if n * d * 4 >= FP16_FROM_BYTES else "flat"


# the IVF quantizer's training sample, per list: k-means needs a few dozen points per centroid (faiss warns under 39)
# and costs time and memory in proportion (faiss caps it at 256 per list: ~9 GB of 768-d vectors at MS MARCO's 8.8M
# with its default 4·sqrt(n) lists; 64 per list: 2.3 GB)
IVF_TRAIN_PER_LIST = 64


def _training_sample(embeddings_dir: str | Path, n: int, size: int) -> np.ndarray:
    """`size` rows spread evenly over the encoding (an IVF quantizer's training set), read through memory maps."""
    wanted = np.unique(np.linspace(0, n - 1, min(size, n)).astype(np.int64))
    rows, start = [], 0
    for path in shard_paths(embeddings_dir):
        shard = np.load(path, mmap_mode="r")
        inside = wanted[(wanted >= start) & (wanted < start + len(shard))] - start
        rows.append(np.asarray(shard[inside], dtype=np.float32))
        start += len(shard)
    return np.ascontiguousarray(np.concatenate(rows))


def empty_index(cfg: IndexConfig, embeddings_dir: str | Path, n: int, d: int) -> tuple[faiss.Index, dict]:
    """A ready-to-fill IVF (trained on a sample) or HNSW index of `cfg.type`, and its build parameters."""
    if cfg.type == "hnsw":
        index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = max(40, 2 * cfg.hnsw_m)
        return index, {"M": cfg.hnsw_m}
    nlist = min(cfg.nlist or max(1, min(int(4 * math.sqrt(n)), n // 39)), n)
    storage = ivf_storage(cfg, n, d)
    if storage == "flat":
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(d), d, nlist, faiss.METRIC_INNER_PRODUCT)
    else:  # the lists hold each vector's residual to its centroid, quantised (trained on the same sample)
        index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatIP(d), d, nlist, SCALAR_QUANTIZERS[storage],
                                              faiss.METRIC_INNER_PRODUCT)
    index.cp.min_points_per_centroid = 1  # small collections: no warning per list
    index.train(_training_sample(embeddings_dir, n, IVF_TRAIN_PER_LIST * nlist))
    return index, {"nlist": nlist, "ivf_storage": storage}
