"""The compress stage's baselines on a small encode folder: PCA and truncation stream the teacher's shards (no
concatenated corpus) and write one compressed shard per teacher shard."""

from pathlib import Path

import numpy as np
import pytest

from ance_core.artifacts import DOCIDS, ArtifactRef, read_manifest
from ance_core.compression.conae import Projector, fit_pca
from ance_core.compression.config import CompressConfig
from tasks import compress as stage


@pytest.fixture
def encoded(tmp_path) -> tuple[ArtifactRef, ArtifactRef, np.ndarray]:
    """A fake checkpoint (the stage only links its files) and an encode folder of three shards, one float16."""
    rng = np.random.default_rng(0)
    docs = (rng.normal(size=(90, 12)) * np.geomspace(5, 0.1, 12)).astype(np.float32)
    folder = tmp_path / "encode"
    folder.mkdir()
    np.save(folder / "emb_00000.npy", docs[:40])
    np.save(folder / "emb_00001.npy", docs[40:41])
    np.save(folder / "emb_00002.npy", docs[41:].astype(np.float16))
    (folder / DOCIDS).write_text("\n".join(f"d{i}" for i in range(90)) + "\n")
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    docs[41:] = docs[41:].astype(np.float16)  # what the shards hold
    return ArtifactRef(str(checkpoint), "ckpt"), ArtifactRef(str(folder), "enc"), docs


@pytest.mark.parametrize("method", ["pca", "truncate"])
def test_baselines_stream_the_shards_and_write_one_per_shard(encoded, tmp_path, monkeypatch, method):
    checkpoint, embeddings, docs = encoded

    def refuse(folder):
        raise AssertionError("the corpus was loaded whole")

    monkeypatch.setattr(stage, "iter_shards", refuse)  # only ConAE may read the shards whole
    ref = stage.compress.fn(checkpoint, embeddings, None, None, "train", method, 4, CompressConfig(),
                            str(tmp_path / "work"))
    out = Path(ref.path)
    shards = [np.load(out / f"emb_{k:05d}.npy") for k in range(3)]
    assert [s.shape for s in shards] == [(40, 4), (1, 4), (49, 4)] and not (out / "emb_00003.npy").exists()
    assert all(s.dtype == np.float32 for s in shards)
    projector = Projector.load(out / "model")
    expected = Projector.pca(docs, 4) if method == "pca" else Projector.truncation(12, 4)
    assert projector.method == method
    assert np.allclose(np.concatenate(shards), expected.docs(docs), atol=1e-4)
    if method == "pca":  # the share of the variance the L components keep, in the manifest
        explained = read_manifest(out)["summary"]["explained_variance"]
        assert explained == pytest.approx(fit_pca(docs, 4).explained.sum(), abs=1e-6) and 0.9 < explained < 1
    assert (out / "model" / "config.json").is_file() and (out / DOCIDS).read_text() == Path(
        embeddings.path, DOCIDS).read_text()


def test_a_dimension_not_below_h_and_an_empty_folder_are_refused(encoded, tmp_path):
    checkpoint, embeddings, _ = encoded
    with pytest.raises(ValueError, match="dimension 12 is not below the model's 12"):
        stage.compress.fn(checkpoint, embeddings, None, None, "train", "pca", 12, CompressConfig(), str(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / DOCIDS).write_text("")
    with pytest.raises(ValueError, match="no embedding shards"):
        stage.compress.fn(checkpoint, ArtifactRef(str(empty), "e"), None, None, "train", "pca", 4, CompressConfig(),
                          str(tmp_path))
