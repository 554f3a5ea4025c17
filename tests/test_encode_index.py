import numpy as np
import pandas as pd
import pytest

from ance_core.config import EncodeConfig, IndexConfig, ModelConfig
from ance_core.encode import encode_corpus, encode_texts, iter_shards, read_docids
from ance_core.index import SearchIndex, build_index
from ance_core.model import init_model, load_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=32), out)
    return out


def _corpus(n=23):
    rng = np.random.default_rng(0)
    words = "cell protein gene cancer patients study risk effect mice treatment".split()
    return pd.DataFrame({"doc_id": [f"d{i}" for i in range(n)], "title": ["" if i % 3 else "T" for i in range(n)],
                         "text": [" ".join(rng.choice(words, size=rng.integers(2, 40))) for _ in range(n)]})


def test_corpus_shards_keep_order_and_match_single_encoding(checkpoint, tmp_path):
    corpus = _corpus()
    summary = encode_corpus(checkpoint, corpus, EncodeConfig(batch_size=4, shard_size=7, precision="fp32"), tmp_path)
    shards = list(iter_shards(tmp_path))
    assert summary["shards"] == 4 and [len(s) for s in shards] == [7, 7, 7, 2]
    assert read_docids(tmp_path) == corpus["doc_id"].tolist()
    model, tok, meta = load_checkpoint(checkpoint)
    from ance_core.data import passage_texts

    texts = passage_texts(corpus)
    one = np.concatenate([encode_texts(model, tok, [t], meta.passage_max_length, 1, None) for t in texts])
    np.testing.assert_allclose(np.concatenate(shards), one, atol=1e-4)  # sorting and padding change nothing


def test_flat_index_is_exact_and_batched_search_agrees(checkpoint, tmp_path):
    emb_dir, idx_dir = tmp_path / "emb", tmp_path / "idx"
    emb_dir.mkdir(), idx_dir.mkdir()
    encode_corpus(checkpoint, _corpus(), EncodeConfig(shard_size=10, precision="fp32"), emb_dir)
    assert build_index(emb_dir, idx_dir)["vectors"] == 23
    docs = np.concatenate(list(iter_shards(emb_dir)))
    queries = np.random.default_rng(1).standard_normal((9, docs.shape[1])).astype(np.float32)
    scores, ids = SearchIndex(idx_dir, IndexConfig(device="cpu", search_batch_size=4)).search(queries, 5)
    brute = queries @ docs.T
    expected = np.argsort(-brute, axis=1)[:, :5]
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, 1), rtol=1e-4, atol=1e-5)
    row_of = {d: i for i, d in enumerate(read_docids(emb_dir))}
    returned = np.vectorize(row_of.get)(ids)  # tie-robust: the returned docs score what the index says
    np.testing.assert_allclose(np.take_along_axis(brute, returned, 1), scores, rtol=1e-4, atol=1e-5)
    all_at_once = SearchIndex(idx_dir, IndexConfig(device="cpu", search_batch_size=1000)).search(queries, 5)
    np.testing.assert_array_equal(all_at_once[1], ids)
