"""Exact inner-product search with torch: the flat index on a GPU without faiss-gpu (issue 42).

faiss-gpu is a 135 MB wheel and a CUDA stack of its own; a GPU worker that has torch already can search a flat index
by blocked matrix products and top-k. `TorchFlatIndex` answers as faiss's IndexFlatIP does (`search(queries, k)` ->
scores, row numbers, best first, min(k, ntotal) of them; `ntotal`, `d`), with the same rankings up to ties: the
vectors are kept as the encoding's shards hold them (float16 by default: `encode.dtype`) on a GPU, float32 on the
CPU, and each block of them is multiplied in float32 (TF32 off), so a score is the float32 inner product of the
shards' vectors, as faiss computes it from the same shards.

Memory: the vectors stay on the device when they fit in `resident_bytes` (by default half the device's free memory);
a larger corpus stays in host memory (pinned on CUDA) and is copied to the device a block at a time for each batch
of queries, so any corpus is searched, at the cost of a copy per batch. The k best of each block are merged into a
running k best, so device memory holds one block's scores (queries x block rows) at a time.
"""

import threading
from collections.abc import Iterable

import numpy as np
import torch

_PRECISION = threading.Lock()
BLOCK_ROWS = 65_536  # vectors multiplied at once: with 4,096 queries, a block's scores are 1 GiB in float32


class TorchFlatIndex:
    """An exact inner-product index over `shards` (row blocks of one (n, d) matrix, in order) on `device`."""

    def __init__(self, shards: Iterable[np.ndarray], device: str | torch.device = "cuda",
                 resident_bytes: int | None = None, block_rows: int = BLOCK_ROWS):
        self.device = torch.device(device)
        self.block_rows = block_rows
        # a shard at a time (a copy of it: shards may be read-only memory maps), cut into blocks; float16 shards stay
        # float16 on a GPU (half its memory; the same values as float32)
        blocks = [block for s in shards if len(s) for block in torch.from_numpy(
            np.array(s, dtype=np.float16 if self.device.type == "cuda" and s.dtype == np.float16 else np.float32)
        ).split(block_rows)]
        if not blocks:
            raise ValueError("an index of no vectors")
        self.d, self.ntotal = blocks[0].shape[1], sum(len(b) for b in blocks)
        budget = resident_bytes if resident_bytes is not None else self._default_budget()
        self.resident = self.ntotal * self.d * blocks[0].element_size() <= budget
        if self.resident:
            blocks = [b.to(self.device) for b in blocks]
        elif self.device.type == "cuda":
            blocks = [b.pin_memory() for b in blocks]  # copied to the device a block at a time, asynchronously
        self.blocks = blocks

    def _default_budget(self) -> int:
        if self.device.type != "cuda":
            return 1 << 62  # on the CPU the vectors are in memory either way
        free, _ = torch.cuda.mem_get_info(self.device)
        return free // 2

    @torch.no_grad()
    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """queries (n, d) -> scores (n, k) float32 and row numbers (n, k) int64, best first (faiss's layout)."""
        k = min(k, self.ntotal)
        q = torch.from_numpy(np.ascontiguousarray(queries, dtype=np.float32)).to(self.device)
        with _PRECISION:  # (a process-wide switch: searches in other threads wait)
            return self._search(q, k)

    def _search(self, q: torch.Tensor, k: int) -> tuple[np.ndarray, np.ndarray]:
        best_scores = torch.full((len(q), 0), -torch.inf, device=self.device)
        best_rows = torch.zeros((len(q), 0), dtype=torch.int64, device=self.device)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 products, as faiss's
        try:
            start = 0
            for block in self.blocks:
                on_device = block.to(self.device, non_blocking=True).float()
                scores = q @ on_device.T  # (n, block rows)
                top = scores.topk(min(k, scores.shape[1]), dim=1)
                best_scores = torch.cat([best_scores, top.values], dim=1)
                best_rows = torch.cat([best_rows, top.indices + start], dim=1)
                if best_scores.shape[1] > k:  # the running k best
                    keep = best_scores.topk(k, dim=1)
                    best_scores, best_rows = keep.values, best_rows.gather(1, keep.indices)
                start += len(block)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
        order = best_scores.argsort(dim=1, descending=True, stable=True)  # best first (topk of merged parts: sorted)
        best_scores, best_rows = best_scores.gather(1, order), best_rows.gather(1, order)
        return best_scores.cpu().numpy(), best_rows.cpu().numpy()
