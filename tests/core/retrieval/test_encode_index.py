import numpy as np
import pandas as pd
import pytest
import torch

from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model, load_checkpoint
from ance_core.retrieval.config import EncodeConfig, IndexConfig
from ance_core.retrieval.encode import encode_corpus, encode_texts, iter_shards, read_docids
from ance_core.retrieval.index import SearchIndex, build_index, index_bytes, is_index_folder
from ance_core.stage_config import KEY_DUMP


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
    cfg = EncodeConfig(batch_size=4, shard_size=7, precision="fp32", dtype="float32")
    summary = encode_corpus(checkpoint, corpus, cfg, tmp_path)
    shards = list(iter_shards(tmp_path))
    assert summary["shards"] == 4 and [len(s) for s in shards] == [7, 7, 7, 2]
    assert read_docids(tmp_path) == corpus["doc_id"].tolist()
    model, tok, meta = load_checkpoint(checkpoint)
    from ance_core.data.dataset import passage_texts

    texts = passage_texts(corpus)
    one = np.concatenate([encode_texts(model, tok, [t], meta.passage_max_length, 1, None) for t in texts])
    np.testing.assert_allclose(np.concatenate(shards), one, atol=1e-4)  # sorting and padding change nothing


def test_out_of_gpu_memory_while_encoding_names_the_batch(checkpoint, monkeypatch):
    import torch

    from ance_core.errors import OutOfMemory

    model, tok, meta = load_checkpoint(checkpoint)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.50 GiB")

    monkeypatch.setattr(model, "forward", oom)
    with pytest.raises(OutOfMemory, match=r"encoding batches of 8 texts of up to 32 tokens: lower encode.batch_size"):
        encode_texts(model, tok, ["a text"] * 3, 32, 8, None)


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


def _random_encoding(folder, n=600, d=16, shard=128, seed=3):
    """n random unit vectors in shards of `shard` rows, with doc ids (an encode folder's layout)."""
    from ance_core.artifacts import DOCIDS, EMBEDDINGS

    folder.mkdir()
    vectors = np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    for k, start in enumerate(range(0, n, shard)):
        np.save(folder / EMBEDDINGS.format(k), vectors[start:start + shard])
    (folder / DOCIDS).write_text("".join(f"d{i}\n" for i in range(n)))
    return vectors


@pytest.mark.parametrize("shards", [1, 3])
def test_index_types_and_parts_search_as_one_index(tmp_path, shards):
    """index.type flat / ivf / hnsw in 1 or 3 parts (faiss IndexShards): flat in parts is exact; ivf with every list
    probed and hnsw with a broad search find the exact top-10 here; reconstruct reads each part's own rows."""
    vectors = _random_encoding(tmp_path / "emb")
    queries = np.random.default_rng(4).standard_normal((20, 16)).astype(np.float32)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    for kind, extra in (("flat", {}), ("ivf", {"nlist": 8, "nprobe": 8}), ("hnsw", {"ef_search": 300})):
        cfg = IndexConfig(type=kind, shards=shards, device="cpu", **extra)
        out = tmp_path / f"{kind}-{shards}"
        out.mkdir()
        summary = build_index(tmp_path / "emb", out, cfg)
        assert summary["vectors"] == 600 and summary.get("shards", 1) == shards
        files = sorted(p.name for p in out.iterdir() if p.name.startswith(("index", "emb_", "flat")))
        if kind == "flat":  # its vectors are the encoding's shards, hard links: no second copy on disk
            assert files == ["emb_00000.npy", "emb_00001.npy", "emb_00002.npy", "emb_00003.npy", "emb_00004.npy",
                             "flat.json"]
            assert (out / "emb_00002.npy").stat().st_ino == (tmp_path / "emb" / "emb_00002.npy").stat().st_ino
        else:
            assert files == (["index"] if shards == 1 else [f"index-part-{k:04d}" for k in range(shards)])
        assert is_index_folder(out)
        index = SearchIndex(out, cfg)
        scores, ids = index.search(queries, 10)
        found = np.vectorize(lambda d: int(d[1:]))(ids)
        recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)])
        assert recall == 1.0, (kind, recall)
        np.testing.assert_allclose(index.vectors(["d0", "d299", "d599"]), vectors[[0, 299, 599]], atol=1e-6)
    # an IVF index probing few of its lists misses some: the type is really approximate
    cfg = IndexConfig(type="ivf", nlist=16, nprobe=1, shards=shards, device="cpu")
    (tmp_path / "ivf1").mkdir()
    build_index(tmp_path / "emb", tmp_path / "ivf1", cfg)
    found = np.vectorize(lambda d: int(d[1:]))(SearchIndex(tmp_path / "ivf1", cfg).search(queries, 10)[1])
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)]) < 0.9


def test_an_ivf_index_that_finds_fewer_than_asked_leaves_places_empty(tmp_path):
    """IVF probing 1 of 16 lists (~37 vectors) for the top-100: faiss pads with id -1. The places stay empty (None,
    -inf) and the run table leaves them out; before, id -1 read as the corpus's last document, many times over."""
    from ance_core.retrieval.search import run_frame

    _random_encoding(tmp_path / "emb")
    queries = np.random.default_rng(4).standard_normal((5, 16)).astype(np.float32)
    cfg = IndexConfig(type="ivf", nlist=16, nprobe=1, device="cpu")
    (tmp_path / "ivf").mkdir()
    build_index(tmp_path / "emb", tmp_path / "ivf", cfg)
    scores, ids, windows = SearchIndex(tmp_path / "ivf", cfg).search_windows(queries, 100)
    empty = np.equal(ids, None)
    assert empty.any() and np.isneginf(scores[empty]).all() and not np.isneginf(scores[~empty]).any()
    run = run_frame([f"q{i}" for i in range(5)], ids, scores, windows)
    assert len(run) == (~empty).sum() and not run.duplicated(["query_id", "doc_id"]).any()
    assert (run.groupby("query_id")["rank"].max() == run.groupby("query_id").size()).all()


def test_query_time_parameters_apply_when_searched_not_when_built(tmp_path):
    """nprobe and ef_search are not in the index's key: the same built index searched with another config uses the
    config's values (before, the values it was built with were frozen into search.json). The dense run's key holds
    them for an approximate index, and nothing for a flat one (its key unchanged)."""
    from tasks.retrieve import search_key

    vectors = _random_encoding(tmp_path / "emb")
    queries = np.random.default_rng(4).standard_normal((20, 16)).astype(np.float32)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]

    def recall(index):
        found = np.vectorize(lambda d: int(d[1:]))(index.search(queries, 10)[1])
        return np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)])

    for kind, narrow, broad in (("ivf", {"nlist": 16, "nprobe": 1}, {"nlist": 16, "nprobe": 16}),
                                ("hnsw", {"hnsw_m": 4, "ef_search": 1}, {"hnsw_m": 4, "ef_search": 600})):
        out = tmp_path / kind
        out.mkdir()
        build_index(tmp_path / "emb", out, IndexConfig(type=kind, device="cpu", **narrow))
        assert not (out / "search.json").exists()
        assert recall(SearchIndex(out, IndexConfig(type=kind, device="cpu", **broad))) == 1.0
        assert recall(SearchIndex(out, IndexConfig(type=kind, device="cpu", **narrow))) < 1.0
        assert search_key(IndexConfig(type=kind, **narrow)) != search_key(IndexConfig(type=kind, **broad))
    assert search_key(IndexConfig(nprobe=1, ef_search=1)) == search_key(IndexConfig()) == {}


def test_index_folders_are_recognised_whatever_their_layout(tmp_path):
    _random_encoding(tmp_path / "emb")
    assert not is_index_folder(tmp_path / "emb")  # shards without flat.json: an encoding, not an index
    for kind, shards in (("flat", 1), ("flat", 2), ("ivf", 1), ("ivf", 2)):
        out = tmp_path / f"{kind}{shards}"
        out.mkdir()
        build_index(tmp_path / "emb", out, IndexConfig(type=kind, shards=shards, nlist=4))
        assert is_index_folder(out)
    assert index_bytes(tmp_path / "flat1") == 600 * 16 * 4  # the float32 IndexFlatIP it loads into


def test_shards_store_float16_by_default_and_read_back_as_float32(checkpoint, tmp_path):
    """encode.dtype: float16 halves the shards; readers get float32 (the rounding of float16: ~1e-3 relative); the
    index built from them scores in float32 from the float16 values."""
    corpus = _corpus()
    for dtype in ("float16", "float32"):
        (tmp_path / dtype).mkdir()
        encode_corpus(checkpoint, corpus, EncodeConfig(shard_size=10, precision="fp32", dtype=dtype), tmp_path / dtype)
        assert np.load(tmp_path / dtype / "emb_00000.npy").dtype == np.dtype(dtype)
    half, full = (np.concatenate(list(iter_shards(tmp_path / d))) for d in ("float16", "float32"))
    assert half.dtype == np.float32
    np.testing.assert_allclose(half, full, rtol=2e-3, atol=1e-3)
    assert (tmp_path / "float16" / "emb_00000.npy").stat().st_size < 0.6 * (
        tmp_path / "float32" / "emb_00000.npy").stat().st_size


def test_an_embedding_beyond_float16s_range_is_refused_with_its_document():
    from ance_core.errors import AnceError
    from ance_core.retrieval.encode import stored

    emb = np.ones((3, 4), dtype=np.float32)
    emb[1, 2] = 1e6
    with pytest.raises(AnceError, match="document 'b'.*encode.dtype: float32"):
        stored(emb, EncodeConfig(), ["a", "b", "c"])
    assert stored(emb, EncodeConfig(dtype="float32"), ["a", "b", "c"]).dtype == np.float32


def test_index_key_keeps_the_flat_key_and_separates_the_rest():
    from tasks.index import index_key

    assert index_key(IndexConfig()) == index_key(IndexConfig(device="cpu", nprobe=5)) == {"type": "flat_ip"}
    keys = [index_key(IndexConfig(type=t, shards=s)) for t in ("flat", "ivf", "hnsw") for s in (1, 2)]
    assert len({str(k) for k in keys}) == 6
    # IVF lists of float32 keep the key IVF indexes always had; quantised lists are other indexes
    assert index_key(IndexConfig(type="ivf", ivf_storage="flat")) == {"type": "ivf", "shards": 1, "nlist": None}
    assert len({str(index_key(IndexConfig(type="ivf", ivf_storage=s))) for s in ("auto", "flat", "sq8", "fp16")}) == 4


def test_auto_ivf_storage_is_fp16_from_a_gib_of_float32_lists_and_leaves_other_keys_alone(tmp_path):
    """ivf_storage auto (the default): float32 lists below 1 GiB, float16 from it. An index without lists (flat, hnsw)
    neither dumps nor shows the field, so every key that holds such a config is the one it had before auto."""
    from ance_core.retrieval.approximate import ivf_storage

    cfg = IndexConfig(type="ivf")
    assert ivf_storage(cfg, 699_000, 384) == "flat" and ivf_storage(cfg, 700_000, 384) == "fp16"
    assert ivf_storage(cfg, 349_525, 768) == "flat" and ivf_storage(cfg, 349_526, 768) == "fp16"
    assert ivf_storage(IndexConfig(type="ivf", ivf_storage="flat"), 10**7, 768) == "flat"
    for kind in ("flat", "hnsw"):
        assert "ivf_storage" not in IndexConfig(type=kind).model_dump(context=KEY_DUMP) and "ivf_storage" not in repr(
            IndexConfig(type=kind))
    assert IndexConfig(type="ivf").model_dump()["ivf_storage"] == "auto"
    chosen = IndexConfig(type="ivf", ivf_storage="flat")  # out of the key (the key it always had), kept otherwise
    assert "ivf_storage" not in chosen.model_dump(context=KEY_DUMP) and "ivf_storage" not in repr(chosen)
    assert IndexConfig.model_validate(chosen.model_dump(mode="json")).ivf_storage == "flat"  # saved and loaded
    vectors = _random_encoding(tmp_path / "emb")  # small: auto builds float32 lists, under the key of flat's
    out = tmp_path / "ivf"
    out.mkdir()
    summary = build_index(tmp_path / "emb", out, IndexConfig(type="ivf", nlist=8, device="cpu"))
    assert summary["type"] == "IndexIVFFlat" and summary["ivf_storage"] == "flat" and len(vectors) < 700_000
    from ance_core.artifacts import ArtifactRef
    from tasks.index import build_index as build_index_task

    refs = {storage: build_index_task.fn(ArtifactRef(str(tmp_path / "emb"), "e0"), str(tmp_path / "work"),
                                         IndexConfig(type="ivf", nlist=8, device="cpu", ivf_storage=storage))
            for storage in ("auto", "flat", "sq8")}
    assert refs["auto"].digest == refs["flat"].digest != refs["sq8"].digest and refs["flat"].cached


def test_ivf_lists_stored_quantised_search_close_to_exact_in_less_space(tmp_path):
    """index.ivf_storage sq8 / fp16: IndexIVFScalarQuantizer, every list probed: the top-10 of the exact search
    (fp16 all of it, sq8 nearly), in a quarter / half of IVF-Flat's list bytes; reconstructed vectors close."""
    from ance_core.retrieval.index import index_bytes

    vectors = _random_encoding(tmp_path / "emb")
    queries = np.random.default_rng(4).standard_normal((20, 16)).astype(np.float32)
    exact = np.argsort(-(queries @ vectors.T), axis=1)[:, :10]
    sizes, recalls = {}, {}
    for storage in ("flat", "sq8", "fp16"):
        cfg = IndexConfig(type="ivf", nlist=8, nprobe=8, ivf_storage=storage, device="cpu")
        out = tmp_path / storage
        out.mkdir()
        summary = build_index(tmp_path / "emb", out, cfg)
        assert summary["type"] == ("IndexIVFFlat" if storage == "flat" else "IndexIVFScalarQuantizer")
        index = SearchIndex(out, cfg)
        found = np.vectorize(lambda d: int(d[1:]))(index.search(queries, 10)[1])
        recalls[storage] = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact, strict=True)])
        sizes[storage] = index_bytes(out)
        np.testing.assert_allclose(index.vectors(["d0", "d599"]), vectors[[0, 599]],
                                   atol={"flat": 1e-6, "fp16": 1e-2, "sq8": 0.1}[storage])
    assert recalls["flat"] == recalls["fp16"] == 1.0 and recalls["sq8"] >= 0.9, recalls
    assert sizes["sq8"] < sizes["fp16"] < sizes["flat"], sizes


def test_streamed_dense_run_equals_the_run_of_all_queries_at_once(checkpoint, tmp_path):
    """write_dense_run in chunks of 3 queries (a parquet row group each) = dense_retrieve_with_positives at once; its
    progress is told the queries done after each chunk (the stage's progress artifact at scale)."""
    from ance_core.retrieval.search import dense_retrieve_with_positives, write_dense_run

    emb_dir, idx_dir = tmp_path / "emb", tmp_path / "idx"
    emb_dir.mkdir(), idx_dir.mkdir()
    cfg = EncodeConfig(shard_size=10, precision="fp32")
    encode_corpus(checkpoint, _corpus(), cfg, emb_dir)
    build_index(emb_dir, idx_dir)
    queries = pd.DataFrame({"query_id": [f"q{i}" for i in range(8)],
                            "text": ["cell gene", "cancer", "mice study risk", "protein", "effect", "patients",
                                     "treatment gene cell", "study"]})
    positives = {f"q{i}": {f"d{i}", f"d{i + 9}"} for i in range(0, 8, 2)}  # odd queries have none
    run, scored = dense_retrieve_with_positives(checkpoint, idx_dir, queries, 5, positives, cfg)
    done = []
    write_dense_run(checkpoint, idx_dir, queries, 5, positives, tmp_path / "run.parquet", tmp_path / "pos.parquet",
                    cfg, chunk=3, progress=done.append)
    import pyarrow.parquet as pq

    assert done == [3, 6, 8]

    assert pq.ParquetFile(tmp_path / "run.parquet").num_row_groups == 3
    streamed = pd.read_parquet(tmp_path / "run.parquet")
    pd.testing.assert_frame_equal(streamed[["query_id", "doc_id", "rank"]], run[["query_id", "doc_id", "rank"]])
    np.testing.assert_allclose(streamed["score"], run["score"], atol=1e-5)
    streamed_pos = pd.read_parquet(tmp_path / "pos.parquet")
    assert len(streamed_pos) == len(scored) == 8
    np.testing.assert_allclose(streamed_pos["score"], scored["score"], atol=1e-5)


def test_token_budgeted_batches_tokenized_ahead_encode_as_the_plain_path(checkpoint):
    """encode.batch_tokens: batches of at most that many padded tokens, tokenized by a producer thread a chunk at a
    time; the same embeddings as the plain path's (in input order), whatever the chunk and budget."""
    from ance_core.modeling import tokenizing
    from ance_core.retrieval.encode import token_batches

    model, tokenizer, _ = load_checkpoint(checkpoint)
    words = "cell protein gene binds mice cancer therapy virus".split()
    texts = [" ".join(words[(i + j) % 8] for j in range(1 + (i * 7) % 40)) for i in range(150)]  # 1 to 40 words
    plain = encode_texts(model, tokenizer, texts, 32, 16, None)
    lengths = [len(x) for x in tokenizer(texts, truncation=True, max_length=32)["input_ids"]]
    for budget in (32, 100, 10_000):
        batches = token_batches(lengths, budget)
        assert sorted(np.concatenate(batches).tolist()) == list(range(150))
        assert all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= budget for b in batches)
        for chunk in (7, 8192):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(tokenizing, "CHUNK", chunk)
                patch.setattr(tokenizing.token_id_chunks, "__defaults__", (chunk,))
                ahead = encode_texts(model, tokenizer, texts, 32, 16, None, batch_tokens=budget)
            np.testing.assert_allclose(ahead, plain, rtol=1e-4, atol=1e-5)
    for multiple in (None, 8):
        assert all(len(b) == 1 or len(b) * -(-max(lengths[i] for i in b) // 8) * 8 <= 100
                   for b in token_batches(lengths, 100, 8))
        padded = encode_texts(model, tokenizer, texts, 32, 16, None, pad_multiple=multiple)  # the plain path padded
        np.testing.assert_allclose(padded, plain, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("batch_tokens", [None, 64])
def test_encoding_runs_attention_without_cudnn_and_restores_it(batch_tokens):
    """Both encoding paths run their forwards with SDPA's cuDNN backend off (a plan per new shape made GPU encoding
    3x slower) and leave the process's backends as they were."""
    torch.backends.cuda.enable_cudnn_sdp(True)
    seen = []

    class Model(torch.nn.Module):
        dim = 2

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids, attention_mask):
            seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()))
            return torch.zeros(len(input_ids), 2)

    class Tokenizer:
        is_fast, pad_token_id, padding_side = False, 0, "right"

        def __call__(self, texts, **_):
            return {"input_ids": [[1] * len(t) for t in texts]}

    out = encode_texts(Model(), Tokenizer(), ["a", "bb", "ccc"], 8, 2, None, batch_tokens=batch_tokens)
    assert out.shape == (3, 2) and seen and all(s == (False, True) for s in seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_overlapping_encodings_restore_the_backends_when_the_last_one_ends():
    """Two encodings in threads whose holds interleave (A enters, B enters, A leaves, B leaves): cuDNN stays off
    until the last leaves and is back on after, where torch's sdpa_kernel alone left it off for good."""
    from ance_core.retrieval.attention import attention_backends

    torch.backends.cuda.enable_cudnn_sdp(True)
    torch.backends.cuda.enable_math_sdp(False)  # a flag the encoding sets on (SDPA_BACKENDS holds math): restored off
    try:
        a, b = attention_backends(), attention_backends()
        a.__enter__()
        b.__enter__()
        a.__exit__(None, None, None)
        assert not torch.backends.cuda.cudnn_sdp_enabled() and torch.backends.cuda.math_sdp_enabled()
        b.__exit__(None, None, None)
        assert torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
        with pytest.raises(KeyError), attention_backends():  # an error inside still restores them
            raise KeyError("x")
        assert torch.backends.cuda.cudnn_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    finally:
        torch.backends.cuda.enable_math_sdp(True)


def test_a_tokenizer_error_in_the_producer_thread_is_raised_by_the_encoding():
    from ance_core.retrieval.encode import _encode_pipelined

    class Model(torch.nn.Module):
        dim = 4

    class Broken:
        is_fast = False

        def __call__(self, *args, **kwargs):
            raise RuntimeError("tokenizer broke")

    model = Model()
    model.register_parameter("w", torch.nn.Parameter(torch.zeros(1)))
    with pytest.raises(RuntimeError, match="tokenizer broke"):
        _encode_pipelined(model, Broken(), ["a", "b"], 8, 64, None, None)


def test_a_damaged_index_folder_is_one_line_not_a_traceback(tmp_path):
    """`ance search --index` of a folder whose docid file is missing, or whose vectors are not a float array: a
    FileNotFoundError's or numpy's traceback (found by a review)."""
    import shutil

    from ance_core.errors import AnceError

    _random_encoding(tmp_path / "emb")
    (good := tmp_path / "flat").mkdir()
    build_index(tmp_path / "emb", good, IndexConfig(type="flat", device="cpu"))
    no_ids, junk = shutil.copytree(good, tmp_path / "no-ids"), shutil.copytree(good, tmp_path / "junk")
    (no_ids / "docid").unlink()
    (junk / "emb_00000.npy").unlink()
    (junk / "emb_00000.npy").write_text("junk\n")
    for folder in (no_ids, junk):
        with pytest.raises(AnceError, match=f"{folder}: a damaged index .*build it again"):
            SearchIndex(folder, IndexConfig(device="cpu"))
    assert len(SearchIndex(good, IndexConfig(device="cpu"))) == 600
