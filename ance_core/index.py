"""faiss indexes over encoded shards: IndexFlatIP (the paper's, exact; moved to the GPU when faiss-gpu and CUDA exist),
and the approximate HNSW and IVF-PQ indexes the compression table compares against it.

An index folder holds `index` (faiss) and `docid` (one id per line, index row order), as in pyserini, and for the
approximate types `search.json`: the search-time parameters (HNSW efSearch, IVF nprobe) applied on loading. A MaxP
index (a `maxp` checkpoint's windows) also holds `window` (the window number of each row): a document has several
rows, and a search returns documents, each scored by its best window (MaxP). `SearchIndex` loads any of them.
"""

import functools
import json
import math
import shutil
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from ance_core.artifacts import DOCIDS, INDEX, INDEX_DOCIDS, INDEX_WINDOWS, WINDOWS
from ance_core.config import CompressConfig, IndexConfig, IndexType
from ance_core.encode import iter_shards
from ance_core.faults import fault_point

SEARCH_PARAMS = "search.json"
GPU_MAX_K = 2048  # faiss-gpu's limit on k for a flat search


def _copy_row_ids(embeddings_dir: str | Path, out: Path) -> None:
    """docid (and window, for MaxP) of the index rows, from the encoding's docids.txt (and windows.txt)."""
    shutil.copy2(Path(embeddings_dir) / DOCIDS, out / INDEX_DOCIDS)
    if (Path(embeddings_dir) / WINDOWS).is_file():
        shutil.copy2(Path(embeddings_dir) / WINDOWS, out / INDEX_WINDOWS)


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def build_index(embeddings_dir: str | Path, out: Path) -> dict:
    index: faiss.Index | None = None
    for shard in iter_shards(embeddings_dir):
        if index is None:
            index = faiss.IndexFlatIP(shard.shape[1])
        index.add(np.ascontiguousarray(shard, dtype=np.float32))
    if index is None:
        raise ValueError(f"{embeddings_dir}: no emb_*.npy shards")
    faiss.write_index(index, str(out / INDEX))
    fault_point("build-index", 1)  # the index written, its doc ids not yet
    _copy_row_ids(embeddings_dir, out)
    return {"vectors": index.ntotal, "dim": index.d, "type": "IndexFlatIP"}


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
        if d % cfg.pq_dims_per_code:
            raise ValueError(f"compression.pq_dims_per_code {cfg.pq_dims_per_code} does not divide the vector "
                             f"dimension {d} of {embeddings_dir}")
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


def _set_search_params(index: faiss.Index, params: dict[str, int]) -> None:
    if "efSearch" in params:
        faiss.downcast_index(index).hnsw.efSearch = params["efSearch"]
    if "nprobe" in params:
        faiss.extract_index_ivf(index).nprobe = params["nprobe"]


class SearchIndex:
    """An index folder loaded for search, whatever its type (`build_index`'s flat one, or `build_ann_index`'s HNSW or
    IVF-PQ one with its search parameters): `search` returns (scores, doc ids) for a matrix of query vectors."""

    def __init__(self, folder: str | Path, cfg: IndexConfig = IndexConfig()):
        folder = Path(folder)
        index = faiss.read_index(str(folder / INDEX))
        if (folder / SEARCH_PARAMS).is_file():
            _set_search_params(index, json.loads((folder / SEARCH_PARAMS).read_text()))
        # HNSW has no GPU implementation: it stays on the CPU
        self.on_gpu = cfg.device != "cpu" and gpu_available() and not isinstance(faiss.downcast_index(index),
                                                                                  faiss.IndexHNSW)
        if cfg.device == "gpu" and not self.on_gpu:
            raise RuntimeError("index.device is 'gpu' but faiss has no GPU support or no GPU is visible")
        self._cpu_index = index  # faiss's GPU search returns at most GPU_MAX_K results per query
        if self.on_gpu:
            self._resources = faiss.StandardGpuResources()
            # the calling thread's current CUDA device (the async inferencer uses its own GPU)
            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
            index = faiss.index_cpu_to_gpu(self._resources, device, index)
        self.index = index
        self.docids = np.array((folder / INDEX_DOCIDS).read_text(encoding="utf-8").splitlines(), dtype=object)
        window_file = folder / INDEX_WINDOWS
        self.windows = (np.array(window_file.read_text().split(), dtype=np.int64) if window_file.is_file()
                        else np.zeros(len(self.docids), dtype=np.int64))
        self.documents = len(set(self.docids)) if window_file.is_file() else len(self.docids)
        self.max_windows = int(self.windows.max()) + 1 if len(self.windows) else 1
        self.batch_size = cfg.search_batch_size

    def __len__(self) -> int:
        """Documents in the index (not rows: a MaxP document has one row per window)."""
        return self.documents

    @functools.cached_property
    def _rows(self) -> dict[str, list[int]]:
        rows: dict[str, list[int]] = {}
        for i, d in enumerate(self.docids):
            rows.setdefault(d, []).append(i)
        return rows

    def _reconstruct(self, rows: list[int]) -> np.ndarray:
        if not rows:
            return np.zeros((0, self.index.d), dtype=np.float32)
        if (ivf := faiss.try_extract_index_ivf(self.index)) is not None:
            ivf.make_direct_map()  # IVF-PQ: the decoded (approximate) vectors
        return self.index.reconstruct_batch(np.asarray(rows, dtype=np.int64)).astype(np.float32)

    def vectors(self, doc_ids: list[str]) -> np.ndarray:
        """The indexed vector of each document (flat index: exact), (n, h) float32; a MaxP document's first window."""
        missing = [d for d in doc_ids if d not in self._rows]
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        return self._reconstruct([self._rows[d][0] for d in doc_ids])

    def best_scores(self, queries: np.ndarray, doc_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each (query vector, document) pair's exact score and the window that gives it: the best of the document's
        windows (MaxP; one window for FirstP). queries (n, h), doc_ids n -> scores (n,) float32, windows (n,) int."""
        missing = [d for d in doc_ids if d not in self._rows]
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        scores, windows = np.zeros(len(doc_ids), dtype=np.float32), np.zeros(len(doc_ids), dtype=np.int64)
        queries = np.asarray(queries, np.float32)
        for start in range(0, len(doc_ids), self.batch_size):  # in chunks: bounded memory for any number of pairs
            rows = [self._rows[d] for d in doc_ids[start:start + self.batch_size]]
            flat = np.concatenate(rows)  # every window row of every pair, pair by pair
            pair = np.repeat(np.arange(len(rows)), [len(r) for r in rows]) + start
            row_scores = np.einsum("ij,ij->i", self._reconstruct(flat.tolist()), queries[pair])
            starts = np.cumsum([0, *[len(r) for r in rows[:-1]]])
            scores[start:start + len(rows)] = np.maximum.reduceat(row_scores, starts)
            best = [flat[s + int(np.argmax(row_scores[s:s + len(r)]))] for s, r in zip(starts, rows, strict=True)]
            windows[start:start + len(rows)] = self.windows[best]
        return scores, windows

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """queries (n, h) -> scores (n, k) float32 and doc ids (n, k), best first. Searched in BLAS-sized batches."""
        scores, ids, _ = self.search_windows(queries, k)
        return scores, ids

    def search_windows(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`search`, plus the window each document scored with (0 for FirstP). A MaxP search fetches the top
        k * max_windows rows, which always hold each of the top-k documents' best window, and keeps each document's
        first (best) row."""
        k = min(k, len(self))
        depth = min(k * self.max_windows, self.index.ntotal)
        index = self.index if not self.on_gpu or depth <= GPU_MAX_K else self._cpu_index
        scores = np.empty((len(queries), depth), dtype=np.float32)
        rows = np.empty((len(queries), depth), dtype=np.int64)
        for start in range(0, len(queries), self.batch_size):
            batch = np.ascontiguousarray(queries[start : start + self.batch_size], dtype=np.float32)
            scores[start : start + len(batch)], rows[start : start + len(batch)] = index.search(batch, depth)
        if self.max_windows == 1:
            return scores, self.docids[rows], self.windows[rows]
        out_scores = np.empty((len(queries), k), dtype=np.float32)
        out_ids = np.empty((len(queries), k), dtype=object)
        out_windows = np.empty((len(queries), k), dtype=np.int64)
        for i in range(len(queries)):
            ids = self.docids[rows[i]]
            _, first = np.unique(ids, return_index=True)  # each document's best row (rows come best first)
            keep = np.sort(first)[:k]
            out_scores[i], out_ids[i], out_windows[i] = scores[i, keep], ids[keep], self.windows[rows[i, keep]]
        return out_scores, out_ids, out_windows


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
