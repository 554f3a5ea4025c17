"""The torch flat index (issue 42: exact search on a GPU without faiss-gpu), on the CPU against faiss's IndexFlatIP:
the same rankings, whether its vectors are resident or searched a block at a time, and through SearchIndex."""

import faiss
import numpy as np
import pytest
import torch

from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.index import SearchIndex, build_index, torch_backend
from ance_core.retrieval.torch_index import TorchFlatIndex
from tests.core.retrieval.test_encode_index import _random_encoding


def _faiss(vectors: np.ndarray, queries: np.ndarray, k: int):
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    return index.search(queries, k)


@pytest.mark.parametrize("resident, block_rows", [(True, 65_536), (True, 97), (False, 97)])
def test_the_same_rankings_as_faiss_resident_or_block_by_block(resident, block_rows):
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((1000, 24)).astype(np.float32)
    queries = rng.standard_normal((37, 24)).astype(np.float32)
    shards = [vectors[:300], vectors[300:301], vectors[301:]]  # uneven shards, one of one row
    index = TorchFlatIndex(shards, "cpu", resident_bytes=None if resident else 1000, block_rows=block_rows)
    assert index.resident == resident and (index.ntotal, index.d) == (1000, 24)
    for k in (1, 10, 250, 1000, 5000):
        scores, rows = index.search(queries, k)
        expected_scores, expected_rows = _faiss(vectors, queries, min(k, 1000))
        assert scores.shape == rows.shape == (37, min(k, 1000)) and rows.dtype == np.int64
        np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
        _same_ranking(rows, expected_rows, vectors, queries)
        assert (np.diff(scores, axis=1) <= 0).all()  # best first


def _same_ranking(rows, expected, vectors, queries):
    """The same rows in the same order, but where two documents' float64 scores are within 1e-5 (a tie to float32
    products summed in another order)."""
    exact = queries.astype(np.float64) @ vectors.astype(np.float64).T
    differ = rows != expected
    assert differ.mean() < 0.001, differ.mean()
    q = np.nonzero(differ)[0]
    np.testing.assert_allclose(exact[q, rows[differ]], exact[q, expected[differ]], atol=1e-5)


def test_search_index_uses_it_where_asked_and_answers_as_faiss(tmp_path):
    """`index.backend: torch` (on the CPU here; on a CUDA GPU without faiss-gpu by default): the flat index folder's
    search, reconstruction and depth the same as faiss's."""
    _random_encoding(tmp_path / "emb")
    (tmp_path / "flat").mkdir()
    build_index(tmp_path / "emb", tmp_path / "flat", IndexConfig(device="cpu"))
    queries = np.random.default_rng(4).standard_normal((20, 16)).astype(np.float32)
    by_faiss = SearchIndex(tmp_path / "flat", IndexConfig(device="cpu"))
    by_torch = SearchIndex(tmp_path / "flat", IndexConfig(device="cpu", backend="torch"))
    assert (by_faiss.backend, by_torch.backend) == ("faiss", "torch-cpu")
    for k in (10, 600):
        (s1, i1), (s2, i2) = by_faiss.search(queries, k), by_torch.search(queries, k)
        assert (i1 == i2).mean() > 0.999  # (ties aside)
        np.testing.assert_allclose(s1, s2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(by_torch.vectors(["d3", "d599"]), by_faiss.vectors(["d3", "d599"]))
    np.testing.assert_array_equal(by_torch.all_vectors(), by_faiss.all_vectors())  # (the score profile reads them)
    assert by_torch.all_vectors().shape == (600, 16)


def test_auto_picks_torch_only_on_a_cuda_gpu_that_faiss_cannot_use(monkeypatch):
    import ance_core.retrieval.index as index

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not torch_backend(IndexConfig())  # no CUDA: faiss
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(index, "gpu_available", lambda: False)
    assert torch_backend(IndexConfig()) and not torch_backend(IndexConfig(device="cpu"))
    assert not torch_backend(IndexConfig(backend="faiss"))
    monkeypatch.setattr(index, "gpu_available", lambda: True)  # faiss-gpu installed (the GPU image): faiss
    assert not torch_backend(IndexConfig()) and torch_backend(IndexConfig(backend="torch"))


def test_the_backend_is_in_no_stage_key():
    from ance_core.artifacts import digest_of
    from ance_core.stage_config import KEY_DUMP

    assert digest_of(IndexConfig()) == digest_of(IndexConfig(backend="torch"))
    assert "backend" not in IndexConfig().model_dump(mode="json", context=KEY_DUMP)
    assert "backend" not in repr(IndexConfig())
    assert "backend" not in IndexConfig(backend="torch").model_dump(mode="json", context=KEY_DUMP)
