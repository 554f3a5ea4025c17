"""faiss IndexFlatIP over encoded shards (the paper's index); moved to the GPU when faiss-gpu and CUDA exist.

An index folder holds `index` (faiss) and `docid` (one id per line, index row order), as in pyserini.
"""

import functools
import shutil
from pathlib import Path

import faiss
import numpy as np
import torch

from ance_core.config import IndexConfig
from ance_core.encode import iter_shards


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
    faiss.write_index(index, str(out / "index"))
    shutil.copy2(Path(embeddings_dir) / "docids.txt", out / "docid")
    return {"vectors": index.ntotal, "dim": index.d, "type": "IndexFlatIP"}


class FlatIndex:
    """A loaded index: `search` returns (scores, doc ids) for a matrix of query vectors."""

    def __init__(self, folder: str | Path, cfg: IndexConfig = IndexConfig()):
        folder = Path(folder)
        index = faiss.read_index(str(folder / "index"))
        self.on_gpu = cfg.device != "cpu" and gpu_available()
        if cfg.device == "gpu" and not self.on_gpu:
            raise RuntimeError("index.device is 'gpu' but faiss has no GPU support or no GPU is visible")
        if self.on_gpu:
            self._resources = faiss.StandardGpuResources()
            # the calling thread's current CUDA device (the async inferencer uses its own GPU)
            device = torch.cuda.current_device() if torch.cuda.is_available() else 0
            index = faiss.index_cpu_to_gpu(self._resources, device, index)
        self.index = index
        self.docids = np.array((folder / "docid").read_text(encoding="utf-8").splitlines(), dtype=object)
        self.batch_size = cfg.search_batch_size

    def __len__(self) -> int:
        return self.index.ntotal

    @functools.cached_property
    def _row(self) -> dict[str, int]:
        return {d: i for i, d in enumerate(self.docids)}

    def vectors(self, doc_ids: list[str]) -> np.ndarray:
        """The indexed vectors of some documents (flat index: exact), (n, h) float32."""
        missing = [d for d in doc_ids if d not in self._row]
        if missing:
            raise KeyError(f"documents not in the index: {missing[:5]}")
        if not doc_ids:
            return np.zeros((0, self.index.d), dtype=np.float32)
        return np.stack([self.index.reconstruct(self._row[d]) for d in doc_ids]).astype(np.float32)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """queries (n, h) -> scores (n, k) float32 and doc ids (n, k), best first. Searched in BLAS-sized batches."""
        k = min(k, len(self))
        scores = np.empty((len(queries), k), dtype=np.float32)
        rows = np.empty((len(queries), k), dtype=np.int64)
        for start in range(0, len(queries), self.batch_size):
            batch = np.ascontiguousarray(queries[start : start + self.batch_size], dtype=np.float32)
            scores[start : start + len(batch)], rows[start : start + len(batch)] = self.index.search(batch, k)
        return scores, self.docids[rows]
