"""faiss on the GPU: `SearchIndex` moves the flat index to the current CUDA device (index.device auto or gpu) and
returns the CPU index's top-k: the same ids (a swap is allowed only between scores within 1e-4 of each other, a
near-tie) and the same scores within rtol 1e-5 / atol 1e-4 (float32 inner products of 64 dims, scores of about 10)."""

import numpy as np
import pytest
import torch

from ance_core.artifacts import DOCIDS
from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.index import GPU_MAX_K, SearchIndex, build_index

N, DIM, TIE = 3000, 64, 1e-4


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    """A flat index over 3,000 random vectors in two shards (more rows than faiss-gpu's k limit, GPU_MAX_K)."""
    emb, out = tmp_path_factory.mktemp("emb"), tmp_path_factory.mktemp("index")
    vectors = np.random.default_rng(0).standard_normal((N, DIM)).astype(np.float32)
    np.save(emb / "emb_00000.npy", vectors[:2000])
    np.save(emb / "emb_00001.npy", vectors[2000:])
    (emb / DOCIDS).write_text("".join(f"d{i}\n" for i in range(N)))
    build_index(emb, out)
    return out


def _assert_same_top_k(cpu: tuple[np.ndarray, np.ndarray], gpu: tuple[np.ndarray, np.ndarray]) -> None:
    (cpu_scores, cpu_ids), (gpu_scores, gpu_ids) = cpu, gpu
    np.testing.assert_allclose(gpu_scores, cpu_scores, rtol=1e-5, atol=TIE)
    tied = np.zeros(cpu_ids.shape, dtype=bool)
    close = np.abs(np.diff(cpu_scores, axis=1)) <= TIE
    tied[:, :-1] |= close
    tied[:, 1:] |= close
    assert not ((gpu_ids != cpu_ids) & ~tied).any(), "the GPU index ranks differently"


def test_gpu_flat_index_returns_the_cpu_top_k(index_dir, faiss_gpu):
    import faiss

    cpu = SearchIndex(index_dir, IndexConfig(device="cpu"))
    gpu = SearchIndex(index_dir, IndexConfig(device="gpu", search_batch_size=16))
    auto = SearchIndex(index_dir, IndexConfig(device="auto"))
    assert not cpu.on_gpu and gpu.on_gpu and auto.on_gpu
    on = gpu.index if hasattr(gpu.index, "getDevice") else faiss.downcast_index(gpu.index)
    assert on.getDevice() == faiss_gpu  # the current CUDA device
    queries = np.random.default_rng(1).standard_normal((40, DIM)).astype(np.float32)
    for k in (1, 10, 100):
        _assert_same_top_k(cpu.search(queries, k), gpu.search(queries, k))
    # deeper than faiss-gpu can search: the copy of the index kept on the CPU answers
    deep = GPU_MAX_K + 52
    cpu_deep, gpu_deep = cpu.search(queries[:4], deep), gpu.search(queries[:4], deep)
    np.testing.assert_array_equal(gpu_deep[1], cpu_deep[1])
    np.testing.assert_array_equal(gpu_deep[0], cpu_deep[0])


def test_a_float16_gpu_copy_ranks_like_the_cpu_index_within_float16_rounding(index_dir, faiss_gpu):
    """index.gpu_float16: the GPU keeps the vectors in float16 (half the memory); scores differ from float32 by
    float16's rounding of 64 products of unit-variance values (well under 0.05 here), the top-10 sets barely."""
    cpu = SearchIndex(index_dir, IndexConfig(device="cpu"))
    half = SearchIndex(index_dir, IndexConfig(device="gpu", gpu_float16=True))
    assert half.on_gpu and half._cpu_parts is None  # a flat index on the GPU keeps no host copy
    queries = np.random.default_rng(2).standard_normal((40, DIM)).astype(np.float32)
    (cpu_scores, cpu_ids), (gpu_scores, gpu_ids) = cpu.search(queries, 10), half.search(queries, 10)
    np.testing.assert_allclose(gpu_scores, cpu_scores, atol=0.05)
    overlap = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(cpu_ids, gpu_ids, strict=True)])
    assert overlap >= 0.9
    np.testing.assert_allclose(half.vectors(["d5"]), np.load(index_dir / "emb_00000.npy")[[5]], atol=0)


@pytest.mark.parametrize("resident", [True, False])
def test_the_torch_backend_on_the_gpu_returns_the_cpu_top_k(index_dir, device, resident):
    """index.backend torch (auto's choice where faiss has no GPU support): float16 vectors on the GPU, float32
    products; the CPU faiss index over the same float16-rounded vectors ranks the same (ties aside), resident or a
    block at a time, k beyond faiss-gpu's limit included."""
    import faiss

    from ance_core.retrieval.torch_index import TorchFlatIndex

    # float16 shards, as the encoding writes them by default (encode.dtype): kept float16 on a GPU, float32 on the
    # CPU, the same values either way as the faiss index's float32 copy
    vectors = np.concatenate([np.load(index_dir / "emb_00000.npy"), np.load(index_dir / "emb_00001.npy")])
    shards = vectors.astype(np.float16)
    cpu = faiss.IndexFlatIP(DIM)
    cpu.add(shards.astype(np.float32))
    queries = np.random.default_rng(1).standard_normal((50, DIM)).astype(np.float32)
    index = TorchFlatIndex([shards[:2000], shards[2000:]], device, resident_bytes=None if resident else 1,
                           block_rows=700)
    assert index.blocks[0].dtype == (torch.float16 if device.type == "cuda" else torch.float32)
    assert index.resident == resident
    for k in (10, GPU_MAX_K + 1):
        scores, rows = index.search(queries, k)
        expected_scores, expected_rows = cpu.search(queries, k)
        _assert_same_top_k((expected_scores, expected_rows), (scores, rows))
    if device.type == "cuda":
        assert SearchIndex(index_dir, IndexConfig(backend="torch")).backend == "torch-cuda"
