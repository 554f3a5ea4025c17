"""faiss indexes over encoded shards: IndexFlatIP (the paper's, exact; moved to the GPU when faiss-gpu and CUDA exist),
the approximate IVF-Flat and HNSW indexes the training rounds may mine from (`index.type`); `SearchIndex` also loads
the HNSW and IVF-PQ indexes the compression table compares against it (retrieval/ann.py).

An index folder holds `docid` (one id per line, index row order), as in pyserini, and the index: a flat one as the
encoding's `emb_*.npy` shards (hard links, no second copy on disk) with `flat.json`, from which `SearchIndex` builds
the IndexFlatIP when it loads; an IVF, HNSW or IVF-PQ one as the faiss file `index`. An index of `index.shards` K > 1
parts is searched as K contiguous slices of the rows together (faiss IndexShards; an IVF index's parts share one
trained quantizer, so they answer as one index would): a flat one is cut so when loaded, an IVF or HNSW one is
written as `index-part-0000` .. Query-time parameters (IVF nprobe, HNSW efSearch) are the IndexConfig's, applied when
the index is loaded, not frozen at build time. Building streams the encoded shards: memory holds the index and one
encoded shard. A MaxP index (a `maxp` checkpoint's windows) also holds `window` (the window number of each row): a
document has several rows, and a search returns documents, each scored by its best window (MaxP). `SearchIndex`
loads any of them.
"""

import functools
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import faiss
import numpy as np
import pandas as pd
import torch

from ance_core.artifacts import (
    DOCIDS,
    EMBEDDING_SHARDS,
    INDEX,
    INDEX_DOCIDS,
    INDEX_WINDOWS,
    WINDOWS,
    id_lines,
    link_or_copy,
    shard_paths,
)
from ance_core.errors import AnceError, damaged_stage
from ance_core.faults import fault_point
from ance_core.retrieval.approximate import empty_index, ivf_storage
from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.encode import iter_shards

SEARCH_PARAMS = "search.json"  # build_ann_index: the search parameters the compression table used (a record)
FLAT = "flat.json"  # build_index, type flat: {"parts": K}; the vectors are the folder's emb_*.npy shards
GPU_MAX_K = 2048  # faiss-gpu's limit on k for a flat search


def _copy_row_ids(embeddings_dir: str | Path, out: Path) -> None:
    """docid (and window, for MaxP) of the index rows, from the encoding's docids.txt (and windows.txt)."""
    shutil.copy2(Path(embeddings_dir) / DOCIDS, out / INDEX_DOCIDS)
    if (Path(embeddings_dir) / WINDOWS).is_file():
        shutil.copy2(Path(embeddings_dir) / WINDOWS, out / INDEX_WINDOWS)


def gpu_available() -> bool:
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def check_index_device(cfg: IndexConfig, where: str = "index") -> None:
    """`device: gpu` where no index of this kind can be on a GPU here, refused before any work (the index stage would
    build it, and the first search fail, after the corpus is encoded)."""
    if cfg.device != "gpu":
        return
    if cfg.type == "hnsw":
        raise AnceError(f"{where}.device gpu: an hnsw index has no GPU implementation; use auto or cpu, or type flat")
    searcher_on_gpu = torch.cuda.is_available() if cfg.type == "flat" and torch_backend(cfg) else gpu_available()
    if not searcher_on_gpu:  # (what SearchIndex would load: torch's flat search, or faiss's)
        raise AnceError(f"{where}.device gpu: no GPU here for a {cfg.type} index (faiss "
                        + ("has no GPU support" if torch.cuda.is_available() else "and torch see no CUDA GPU")
                        + "); use auto (a GPU where there is one) or cpu")


def torch_backend(cfg: IndexConfig) -> bool:
    """Whether a flat index is searched by torch (`index.backend`; auto: on a CUDA GPU that faiss cannot use)."""
    if cfg.backend == "auto":
        return cfg.device != "cpu" and torch.cuda.is_available() and not gpu_available()
    return cfg.backend == "torch"


PART = "index-part-{:04d}"
FAISS_TYPES = {"flat": "IndexFlatIP", "ivf": "IndexIVFFlat", "hnsw": "IndexHNSWFlat"}
def faiss_type(cfg: IndexConfig, n: int, d: int) -> str:
    if cfg.type == "ivf" and ivf_storage(cfg, n, d) != "flat":
        return "IndexIVFScalarQuantizer"
    return FAISS_TYPES[cfg.type]


def encoding_shape(embeddings_dir: str | Path) -> tuple[int, int]:
    """(rows, dim) of an encoding, read from the shards' headers."""
    shapes = [np.load(path, mmap_mode="r").shape for path in shard_paths(embeddings_dir)]
    if not shapes:
        raise ValueError(f"{embeddings_dir}: no emb_*.npy shards")
    return sum(n for n, _ in shapes), shapes[0][1]


def _fill(empty: faiss.Index, parts: int, n: int, shards: Iterator[np.ndarray]) -> list[faiss.Index]:
    """`parts` copies of an empty index, part i filled with the i-th contiguous slice of the n rows, streamed shard
    by shard (memory: the index and one shard)."""
    bounds = [n * i // parts for i in range(parts + 1)]  # part i holds rows bounds[i] .. bounds[i+1]
    out = [empty] + [faiss.clone_index(empty) for _ in range(parts - 1)]
    start = 0
    for shard in shards:
        shard = np.ascontiguousarray(shard, dtype=np.float32)
        for i, part in enumerate(out):
            lo, hi = max(bounds[i], start), min(bounds[i + 1], start + len(shard))
            if lo < hi:
                part.add(shard[lo - start : hi - start])
        start += len(shard)
    return out


def build_index(embeddings_dir: str | Path, out: Path, cfg: IndexConfig = IndexConfig()) -> dict:
    """The index of `cfg` (default: one exact IndexFlatIP) over an encoding. A flat index is its vectors and nothing
    else: the folder keeps the encoding's shards (hard links: no second copy on disk) and `SearchIndex` builds the
    IndexFlatIP from them when it loads. IVF and HNSW indexes are built here, their parts filled shard by shard."""
    n, d = encoding_shape(embeddings_dir)
    k = min(cfg.shards, n)
    summary = {"vectors": n, "dim": d, "type": faiss_type(cfg, n, d)} | ({"shards": k} if k > 1 else {})
    if cfg.type == "flat":
        for path in shard_paths(embeddings_dir):
            link_or_copy(path, out / path.name)
        (out / FLAT).write_text(json.dumps({"parts": k}))
        fault_point("build-index", 1)  # the index written, its doc ids not yet
        _copy_row_ids(embeddings_dir, out)
        return summary | {"stored": "shards"}
    empty, params = empty_index(cfg, embeddings_dir, n, d)
    for i, part in enumerate(_fill(empty, k, n, iter_shards(embeddings_dir))):
        faiss.write_index(part, str(out / (INDEX if k == 1 else PART.format(i))))
    fault_point("build-index", 1)  # the index written, its doc ids not yet
    _copy_row_ids(embeddings_dir, out)
    return summary | params


def is_index_folder(folder: str | Path) -> bool:
    """Whether a folder holds an index `SearchIndex` loads: a faiss file, its parts, or a flat index's shards."""
    folder = Path(folder)
    return ((folder / INDEX).is_file() or any(folder.glob(PART.format(0)[:-4] + "*"))
            or ((folder / FLAT).is_file() and any(folder.glob(EMBEDDING_SHARDS))))


def index_bytes(folder: str | Path) -> int:
    """The size of an index: its faiss file(s), or for a flat one the float32 IndexFlatIP its shards load into."""
    folder = Path(folder)
    if (folder / FLAT).is_file():
        n, d = encoding_shape(folder)
        return 4 * n * d
    return sum(path.stat().st_size for path in [*folder.glob(INDEX), *folder.glob(PART.format(0)[:-4] + "*")])


def _set_search_params(index: faiss.Index, params: dict[str, int]) -> None:
    if "efSearch" in params and isinstance(hnsw := faiss.downcast_index(index), faiss.IndexHNSW):
        hnsw.hnsw.efSearch = params["efSearch"]
    if "nprobe" in params and (ivf := faiss.try_extract_index_ivf(index)) is not None:
        ivf.nprobe = min(params["nprobe"], ivf.nlist)


def _together(parts: list[faiss.Index]) -> faiss.Index:
    """One index, or its parts searched as one (faiss IndexShards: threads, the parts' row ids in sequence)."""
    if len(parts) == 1:
        return parts[0]
    shards = faiss.IndexShards(parts[0].d, True, True)
    for part in parts:
        shards.add_shard(part)  # faiss's wrapper keeps a reference to each part
    return shards


class ShardRows:
    """The rows of an encoding's .npy shards through memory maps: any rows as float32, without loading the rest (a
    flat index's exact vectors, from the files it was built from)."""

    def __init__(self, folder: Path):
        self.shards = [np.load(path, mmap_mode="r") for path in shard_paths(folder)]
        self.offsets = np.cumsum([0, *(len(shard) for shard in self.shards)])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __iter__(self) -> Iterator[np.ndarray]:
        return (np.asarray(shard, dtype=np.float32) for shard in self.shards)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.shards[0].shape[1]), dtype=np.float32)
        owner = np.searchsorted(self.offsets, rows, side="right") - 1
        for i in np.unique(owner):
            mine = owner == i
            out[mine] = self.shards[i][rows[mine] - self.offsets[i]]
        return out


def gpu_cloner_options(cfg: IndexConfig):
    """How faiss copies an index to a GPU: float16 storage when `index.gpu_float16` (half the GPU memory of a flat or
    IVF index; scores computed from float16 vectors, as the shards store them by default)."""
    options = faiss.GpuClonerOptions()
    options.useFloat16 = cfg.gpu_float16
    return options


class SearchIndex:
    """An index folder loaded for search, whatever its type (`build_index`'s flat, IVF or HNSW one, or
    `build_ann_index`'s HNSW or IVF-PQ one): `search` returns (scores, doc ids) for a matrix of query vectors.

    Query-time parameters are the config's, applied at load whatever the index was built with: `cfg.nprobe` for IVF
    indexes, `cfg.ef_search` for HNSW ones (a folder's `search.json`, written by `build_ann_index`, is only a record of
    what the compression table searched with). A flat index folder (`flat.json`) holds its vectors as the encoding's
    shards: the IndexFlatIP is built from them here, and exact vectors are read back from them (memory maps), so a GPU
    copy needs no second copy in host memory."""

    def __init__(self, folder: str | Path, cfg: IndexConfig = IndexConfig()):
        folder = Path(folder)
        with damaged_stage(folder, "index", "build it again (delete the folder)"):
            self._load(folder, cfg)

    def _load(self, folder: Path, cfg: IndexConfig) -> None:
        self._rows: ShardRows | None = None
        self.batch_size = cfg.search_batch_size
        if (folder / FLAT).is_file():
            self._rows = ShardRows(folder)
            if not len(self._rows):
                raise AnceError(f"{folder}: a flat index without its vectors (no {EMBEDDING_SHARDS} shards)")
        if self._rows is not None and torch_backend(cfg):  # exact search by torch: a GPU without faiss-gpu
            from ance_core.retrieval.torch_index import TorchFlatIndex

            device = "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu"
            if cfg.device == "gpu" and device != "cuda":
                raise AnceError("index.device is 'gpu' but no CUDA GPU is visible")
            # the shards as stored (float16 by default: half the GPU memory of float32, the same values)
            self.index, self.backend = TorchFlatIndex(iter(self._rows.shards), device), f"torch-{device}"
            self._is_hnsw, self.on_gpu, self._cpu_parts = False, False, None
            self._offsets = np.array([0, self.index.ntotal])
        else:
            self._load_faiss(folder, cfg)
        self.docids = np.array(id_lines(folder / INDEX_DOCIDS), dtype=object)
        if len(self.docids) != int(self._offsets[-1]):  # every hit would be named by another row's id
            raise AnceError(f"{folder}: {len(self.docids):,} ids in {INDEX_DOCIDS} for {int(self._offsets[-1]):,} "
                            "vectors: the index folder is damaged; build it again (delete the folder)")
        window_file = folder / INDEX_WINDOWS
        self.windows = (np.array(window_file.read_text().split(), dtype=np.int64) if window_file.is_file()
                        else np.zeros(len(self.docids), dtype=np.int64))
        self.documents = len(set(self.docids)) if window_file.is_file() else len(self.docids)
        self.max_windows = int(self.windows.max()) + 1 if len(self.windows) else 1
        self.batch_size = cfg.search_batch_size

    def _load_faiss(self, folder: Path, cfg: IndexConfig) -> None:
        if self._rows is not None:
            parts_wanted = json.loads((folder / FLAT).read_text())["parts"]
            d = self._rows.shards[0].shape[1]
            parts = _fill(faiss.IndexFlatIP(d), parts_wanted, len(self._rows), iter(self._rows))
        else:
            paths = [folder / INDEX] if (folder / INDEX).is_file() else sorted(folder.glob(PART.format(0)[:-4] + "*"))
            if not paths:
                raise AnceError(f"{folder}: no faiss index (neither '{INDEX}', '{PART.format(0)}' .. nor '{FLAT}' "
                                "with its shards)")
            parts = [faiss.read_index(str(path)) for path in paths]
        self._search_params = {"nprobe": cfg.nprobe, "efSearch": cfg.ef_search}
        for part in parts:
            _set_search_params(part, self._search_params)
        self._is_hnsw = isinstance(faiss.downcast_index(parts[0]), faiss.IndexHNSW)
        # HNSW has no GPU implementation: it stays on the CPU
        self.on_gpu = cfg.device != "cpu" and gpu_available() and not self._is_hnsw
        if cfg.device == "gpu" and not self.on_gpu:
            raise AnceError("index.device is 'gpu' but faiss has no GPU support or no GPU is visible")
        self.backend = "faiss-gpu" if self.on_gpu else "faiss"
        self._offsets = np.cumsum([0, *(part.ntotal for part in parts)])
        self._cpu_parts: list[faiss.Index] | None = parts  # faiss's GPU search returns at most GPU_MAX_K per query
        if self.on_gpu:
            self._resources = faiss.StandardGpuResources()
            # one part: the calling thread's current CUDA device (the async inferencer uses its own GPU); several: one
            # GPU each, in turn
            first = torch.cuda.current_device() if torch.cuda.is_available() else 0
            gpus, options = faiss.get_num_gpus(), gpu_cloner_options(cfg)
            parts = [faiss.index_cpu_to_gpu(self._resources, (first + i) % gpus, part, options)
                     for i, part in enumerate(parts)]
            if self._rows is not None:
                self._cpu_parts = None  # rebuilt from the shards only if a search goes deeper than the GPU's limit
        self._parts = parts
        self.index = _together(parts)

    @functools.cached_property
    def _cpu_index(self) -> faiss.Index:
        if self._cpu_parts is None:  # a flat index on the GPU: its CPU copy, built again from the shards
            self._cpu_parts = _fill(faiss.IndexFlatIP(self.index.d), len(self._parts), len(self._rows),
                                    iter(self._rows))
        return _together(self._cpu_parts)

    def __len__(self) -> int:
        """Documents in the index (not rows: a MaxP document has one row per window)."""
        return self.documents

    @functools.cached_property
    def _starts(self) -> tuple[pd.Index, np.ndarray]:
        """A hash index of the documents (compact at millions) and each one's rows: bounds[i] .. bounds[i+1] (a
        document's windows are consecutive rows, window 0 first)."""
        firsts = np.flatnonzero(self.windows == 0)
        return pd.Index(self.docids[firsts]), np.append(firsts, len(self.docids))

    def _doc_rows(self, doc_ids: list[str]) -> list[range]:
        """The index rows of each document (FirstP: one; MaxP: one per window)."""
        index, bounds = self._starts
        position = index.get_indexer(doc_ids)
        if (position < 0).any():
            missing = [d for d, p in zip(doc_ids, position, strict=True) if p < 0]
            raise KeyError(f"documents not in the index: {missing[:5]}")
        return [range(bounds[p], bounds[p + 1]) for p in position]

    def _reconstruct(self, rows: list[int]) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        if self._rows is not None:  # a flat index: its vectors are the shards'
            return self._rows.rows(rows)
        out = np.zeros((len(rows), self.index.d), dtype=np.float32)
        owner = np.searchsorted(self._offsets, rows, side="right") - 1  # the part holding each row
        for i, part in enumerate(self._cpu_parts):
            if not (mine := owner == i).any():
                continue
            if (ivf := faiss.try_extract_index_ivf(part)) is not None and ivf.direct_map.type == 0:
                ivf.make_direct_map()  # IVF: the stored (IVF-PQ: decoded, approximate) vectors
            out[mine] = part.reconstruct_batch(rows[mine] - self._offsets[i])
        return out

    def all_vectors(self) -> np.ndarray:
        """Every row's vector, in index order, (rows, h) float32 (a flat index: the shards', exact)."""
        if self._rows is not None:
            return self._rows.rows(np.arange(len(self._rows), dtype=np.int64))
        return self._reconstruct(list(range(int(self._offsets[-1]))))

    def vectors(self, doc_ids: list[str]) -> np.ndarray:
        """The indexed vector of each document (flat index: exact), (n, h) float32; a MaxP document's first window."""
        return self._reconstruct([rows[0] for rows in self._doc_rows(doc_ids)])

    def best_scores(self, queries: np.ndarray, doc_ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each (query vector, document) pair's exact score and the window that gives it: the best of the document's
        windows (MaxP; one window for FirstP). queries (n, h), doc_ids n -> scores (n,) float32, windows (n,) int."""
        doc_rows = self._doc_rows(list(doc_ids))
        scores, windows = np.zeros(len(doc_ids), dtype=np.float32), np.zeros(len(doc_ids), dtype=np.int64)
        queries = np.asarray(queries, np.float32)
        for start in range(0, len(doc_ids), self.batch_size):  # in chunks: bounded memory for any number of pairs
            rows = doc_rows[start:start + self.batch_size]
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
        first (best) row. Places an approximate index left empty (it found fewer) hold doc id None, score -inf; the
        run table (`search.run_frame`) drops them."""
        k = min(k, len(self))
        depth = min(k * self.max_windows, self.index.ntotal)
        index = self.index if not self.on_gpu or depth <= GPU_MAX_K else self._cpu_index
        if self._is_hnsw:  # HNSW searches at least as broadly as the results it returns
            for part in self._cpu_parts:
                faiss.downcast_index(part).hnsw.efSearch = max(self._search_params["efSearch"], depth)
        scores = np.empty((len(queries), depth), dtype=np.float32)
        rows = np.empty((len(queries), depth), dtype=np.int64)
        for start in range(0, len(queries), self.batch_size):
            batch = np.ascontiguousarray(queries[start : start + self.batch_size], dtype=np.float32)
            scores[start : start + len(batch)], rows[start : start + len(batch)] = index.search(batch, depth)
        missing = rows < 0  # an approximate index (IVF, HNSW) may find fewer than asked: faiss pads with -1
        if self.max_windows == 1:
            ids, windows = self.docids[rows], self.windows[rows]
            ids[missing], scores[missing], windows[missing] = None, -np.inf, 0
            return scores, ids, windows
        out_scores = np.full((len(queries), k), -np.inf, dtype=np.float32)
        out_ids = np.full((len(queries), k), None, dtype=object)
        out_windows = np.zeros((len(queries), k), dtype=np.int64)
        for i in range(len(queries)):
            found, found_scores = rows[i][~missing[i]], scores[i][~missing[i]]
            ids = self.docids[found]
            _, first = np.unique(ids, return_index=True)  # each document's best row (rows come best first)
            keep = np.sort(first)[:k]
            n = len(keep)
            out_scores[i, :n], out_ids[i, :n] = found_scores[keep], ids[keep]
            out_windows[i, :n] = self.windows[found[keep]]
        return out_scores, out_ids, out_windows
