"""PCA streamed over chunks (the mean and the h x h scatter, then an eigendecomposition) against the SVD of the whole
centred matrix it replaces, and the memory it holds."""

import tracemalloc

import numpy as np
import pytest

from ance_core.compression.conae import Projector, fit_pca, mean_and_scatter, row_chunks
from ance_core.retrieval.encode import map_shards


def _svd_pca(docs: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The reference (the code before streaming): mean, components (h, L) and explained-variance shares from the
    SVD of the centred N x h float64 matrix."""
    x = docs.astype(np.float64)
    centred = x - x.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    return x.mean(axis=0), vt[:dim].T, (s**2 / (s**2).sum())[:dim]


def _docs(n: int = 400, h: int = 24, seed: int = 0) -> np.ndarray:
    """Rows with well-separated variances along a random rotation, off-centre (a mean much larger than the spread of
    the trailing directions), like embeddings."""
    rng = np.random.default_rng(seed)
    rotation = np.linalg.qr(rng.normal(size=(h, h)))[0]
    scales = np.geomspace(10, 0.05, h)
    return (rng.normal(size=(n, h)) * scales @ rotation + 20 * rng.normal(size=h)).astype(np.float32)


def _aligned(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """b's columns with the signs of a's (SVD signs are LAPACK's choice)."""
    return b * np.sign((a * b).sum(axis=0))


def test_the_streamed_pca_equals_the_svd_pca():
    docs = _docs()
    mean, components, explained = _svd_pca(docs, 8)
    fit = fit_pca(row_chunks([docs], 37), 8)
    assert np.allclose(fit.mean, mean, atol=1e-5)
    assert np.allclose(fit.components, _aligned(fit.components, components), atol=1e-5)
    assert np.allclose(fit.explained, explained, rtol=1e-6)
    assert np.allclose(fit.components.T @ fit.components, np.eye(8), atol=1e-6)
    # the map itself: the same projected vectors up to each component's sign
    old = (docs - mean) @ components
    assert np.allclose(Projector.from_pca(fit).docs(docs), _aligned(Projector.from_pca(fit).docs(docs), old), atol=1e-3)


def test_the_fit_does_not_depend_on_how_the_rows_are_chunked_and_signs_are_fixed():
    docs = _docs(n=300, h=12, seed=1)
    whole = fit_pca(docs, 5)
    shards = np.split(docs, [0, 10, 11, 150, 299])  # uneven shards, an empty one and a one-row one among them
    for chunks in ([docs], shards, list(row_chunks([docs], 1)), list(row_chunks(shards, 7)), row_chunks([docs], 64)):
        fit = fit_pca(chunks, 5)
        assert np.allclose(fit.mean, whole.mean, atol=1e-6)
        assert np.allclose(fit.components, whole.components, atol=1e-6)  # same signs, no alignment needed
        assert np.allclose(fit.explained, whole.explained, rtol=1e-9)
    lead = np.abs(whole.components).argmax(axis=0)
    assert (whole.components[lead, np.arange(5)] > 0).all()
    # scatter merged pairwise equals the direct one
    n, mean, scatter = mean_and_scatter(shards)
    centred = docs.astype(np.float64) - docs.astype(np.float64).mean(axis=0)
    assert n == 300 and np.allclose(scatter, centred.T @ centred, rtol=1e-10, atol=1e-8)


def test_more_dimensions_than_documents():
    rng = np.random.default_rng(2)
    docs = rng.normal(size=(5, 12)).astype(np.float32)  # h = 12 > N = 5: the centred rows span 4 directions
    mean, components, explained = _svd_pca(docs, 4)
    fit = fit_pca(docs, 8)  # more components than the data has (the SVD gives only N = 5)
    assert fit.components.shape == (12, 8)
    assert np.allclose(fit.components.T @ fit.components, np.eye(8), atol=1e-6)
    assert np.allclose(fit.components[:, :4], _aligned(fit.components[:, :4], components), atol=1e-5)
    assert np.allclose(fit.explained[:4], explained, rtol=1e-5) and np.allclose(fit.explained[4:], 0, atol=1e-7)
    # the 4-dim span is kept whole: distances between documents survive the projection
    projected = Projector.from_pca(fit).docs(docs)
    assert np.allclose(np.linalg.norm(projected[:, None] - projected[None], axis=-1),
                       np.linalg.norm(docs[:, None] - docs[None], axis=-1), atol=1e-4)
    one = fit_pca(docs[:1], 3)  # a single document: no variance at all, still a valid map
    assert np.allclose(one.explained, 0) and np.allclose(Projector.from_pca(one).docs(docs[:1]), 0, atol=1e-5)


def test_the_fit_reads_an_iterator_of_chunks_once_and_never_holds_the_whole_matrix():
    n, h, rows = 100_000, 16, 1_000
    consumed = []

    def chunks():
        rng = np.random.default_rng(3)
        for start in range(0, n, rows):
            consumed.append(start)
            yield (rng.normal(size=(rows, h)) * np.arange(1, h + 1)).astype(np.float32)

    tracemalloc.start()  # numpy reports its array buffers to tracemalloc
    try:
        fit = fit_pca(chunks(), 4)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(consumed) == n // rows
    assert peak < n * h * 4 / 4, peak  # a quarter of the float32 N x h (the float64 one is twice that)
    assert np.allclose(np.abs(fit.components), np.eye(h)[:, ::-1][:, :4], atol=0.05)  # the largest-scale axes first


def test_shards_on_disk_stream_through_memory_maps_in_their_own_dtype(tmp_path):
    docs = _docs(n=250, h=16, seed=4)
    np.save(tmp_path / "emb_00000.npy", docs[:100])
    np.save(tmp_path / "emb_00001.npy", docs[100:].astype(np.float16))  # a float16 shard beside a float32 one
    shards = list(map_shards(tmp_path))
    assert [type(s) for s in shards] == [np.memmap, np.memmap] and [s.dtype for s in shards] == [np.float32,
                                                                                                  np.float16]
    fit = fit_pca(row_chunks(map_shards(tmp_path), 30), 6)
    expected = fit_pca(np.concatenate([docs[:100], docs[100:].astype(np.float16).astype(np.float32)]), 6)
    assert np.allclose(fit.components, expected.components, atol=1e-6)
    assert np.allclose(fit.mean, expected.mean, atol=1e-6)


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="no rows"):
        fit_pca(iter([]), 2)
    with pytest.raises(ValueError, match="between 1 and the embeddings' 4"):
        fit_pca(np.ones((10, 4), np.float32), 5)
    with pytest.raises(ValueError, match="shape \\(3, 5\\) after 3 rows of 4 dims"):
        fit_pca([np.ones((3, 4)), np.ones((3, 5))], 2)
    with pytest.raises(ValueError, match="NaN"):
        fit_pca(np.array([[0.0, 1.0], [np.nan, 2.0]]), 1)


def test_a_lossless_pca_keeps_the_teachers_ranking():
    """Queries are not centred: with the documents' mean taken from the queries too, a score gained -mean.d, a term of
    its own per document, and even a PCA that keeps every dimension reordered the teacher's ranking."""
    docs, queries = _docs(300, 16), _docs(20, 16, seed=1)
    teacher = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    projector = Projector.pca(docs, 16)
    compressed = np.argsort(-(projector.queries(queries) @ projector.docs(docs).T), axis=1)[:, :10]
    assert (compressed == teacher).all()
