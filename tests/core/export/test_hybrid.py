"""A checkpoint's retrieval package (ance_core/export/hybrid.py): its searches are the pipeline's own rankings —
dense by exact inner product over the stored encoding, BM25 from the stored index, hybrid by the recorded fusion."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from ance_core.errors import AnceError
from ance_core.export.hybrid import RETRIEVAL, HybridSearch, package_bytes, write_package
from ance_core.modeling.model import load_checkpoint
from ance_core.retrieval.bm25 import BM25
from ance_core.retrieval.config import BM25Config, EncodeConfig
from ance_core.retrieval.encode import encode_documents, encode_queries
from ance_core.retrieval.evaluate import trec_order
from ance_core.retrieval.fusion import Fusion, fuse
from tests.tiny import random_head_checkpoint, training_tables

QUERIES = ["cancer gene", "blood disease mice", "a query of words no passage has: zzyqx"]  # (the first two were
# words of no passage either: BM25's rankings compared were empty)


@pytest.fixture(scope="module")
def packaged(tiny_model, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hybrid")
    checkpoint = random_head_checkpoint(tiny_model, tmp / "checkpoint")
    corpus = training_tables()[1]
    model, tokenizer, meta = load_checkpoint(checkpoint)
    emb, ids, _ = encode_documents(model, tokenizer, meta, corpus, EncodeConfig(precision="fp32"))
    encode = tmp / "encode"
    encode.mkdir()
    np.save(encode / "emb_00000.npy", emb[:20].astype(np.float16))  # two shards, stored as the encode stage does
    np.save(encode / "emb_00001.npy", emb[20:].astype(np.float16))
    (encode / "docids.txt").write_text("\n".join(ids) + "\n")
    index = tmp / "bm25"
    index.mkdir()
    BM25.build([corpus], BM25Config(), spill=index).save(index)
    fusion = Fusion("convex", 0.7)
    record = write_package(checkpoint / RETRIEVAL, encode, index, BM25Config(), fusion)
    assert record["passages"] == 30 and package_bytes(encode, index) > emb[:1].nbytes
    return checkpoint, corpus, emb, ids, index, fusion


def test_dense_bm25_and_hybrid_searches_are_the_pipelines_rankings(packaged):
    checkpoint, corpus, emb, ids, index, fusion = packaged
    searcher = HybridSearch(checkpoint)
    model, tokenizer, meta = load_checkpoint(checkpoint)
    q = encode_queries(model, tokenizer, QUERIES, meta, EncodeConfig(precision="fp32"))
    stored = emb.astype(np.float16).astype(np.float32)
    dense = searcher.search(QUERIES, k=5, mode="dense")
    assert dense["query"].tolist() == [0] * 5 + [1] * 5 + [2] * 5 and dense["rank"].tolist() == [1, 2, 3, 4, 5] * 3
    row = {d: j for j, d in enumerate(ids)}
    for i in range(len(QUERIES)):  # (the corpus repeats its texts: tied documents may come in either order)
        scores = q[i] @ stored.T
        hits = dense[dense["query"] == i]
        assert hits["score"].to_numpy() == pytest.approx(np.sort(scores)[::-1][:5], abs=1e-4)
        assert hits["score"].to_numpy() == pytest.approx(scores[[row[d] for d in hits["doc_id"]]], abs=1e-4)
    queries = pd.DataFrame({"query_id": ["0", "1", "2"], "text": QUERIES})
    sparse = BM25.load(index, BM25Config()).search(queries, 1000)
    bm25 = searcher.search(QUERIES, k=3, mode="bm25")
    assert bm25.groupby("query").size().to_dict() == {0: 3, 1: 3}  # (the third: no word indexed, no hit)
    ranked = trec_order(sparse)  # (equal scores as the evaluation ranks them)
    assert bm25[bm25["query"] == 0]["doc_id"].tolist() == ranked[ranked["query_id"] == "0"]["doc_id"].tolist()[:3]
    whole = searcher.search(QUERIES, k=30, mode="bm25")  # (the whole corpus asked for: its matches alone come back,
    # not the rows of score 0 that fill BM25's ranking to its depth, which the pipeline never scores as hits)
    matches = sparse[sparse["score"] > 0].groupby("query_id").size()
    assert len(matches) and (whole["score"] > 0).all()
    assert whole.groupby("query").size().to_dict() == {int(q): n for q, n in matches.items()}
    assert (matches < 30).any()  # (some query matches fewer than 30 passages: without the filter, it got filler)
    dense_run = pd.DataFrame([(str(i), ids[j], float(q[i] @ stored[j])) for i in range(3) for j in range(30)],
                             columns=["query_id", "doc_id", "score"])
    expected = fuse(dense_run, sparse, fusion, 1000)
    hybrid = searcher.search(QUERIES, k=4)
    for i in range(len(QUERIES)):
        want = expected[expected["query_id"] == str(i)]
        got = hybrid[hybrid["query"] == i]
        assert got["score"].to_numpy() == pytest.approx(want["score"].to_numpy()[:4], abs=1e-4)
        fused = dict(zip(want["doc_id"], want["score"], strict=True))
        assert got["score"].to_numpy() == pytest.approx([fused[d] for d in got["doc_id"]], abs=1e-4)


def test_a_shallower_bm25_ranking_is_served_as_shallow_as_the_run_fused_it(packaged, tmp_path):
    """With bm25.top_k under eval.top_k the run fused BM25's top bm25.top_k (its ranking's depth) with the dense top
    eval.top_k; the package searched BM25 to eval.top_k, so its convex normalisation and its hits differed."""
    checkpoint, corpus, emb, ids, index, fusion = packaged
    shallow = tmp_path / "checkpoint"
    shutil.copytree(checkpoint, shallow, ignore=shutil.ignore_patterns(RETRIEVAL))
    encode = tmp_path / "encode"
    shutil.copytree(checkpoint / RETRIEVAL, encode, ignore=shutil.ignore_patterns("bm25", "package.json"))
    write_package(shallow / RETRIEVAL, encode, index, BM25Config(top_k=3), fusion, depth=20)
    searcher = HybridSearch(shallow)
    assert searcher.search(QUERIES, k=10, mode="bm25").groupby("query").size().max() == 3
    queries = pd.DataFrame({"query_id": ["0", "1", "2"], "text": QUERIES})
    sparse = BM25.load(index, BM25Config()).search(queries, 3)  # the run's BM25 ranking, 3 deep
    dense = searcher._dense(queries, 20)
    expected = fuse(dense, sparse, fusion, 20)
    got = searcher.search(QUERIES, k=20)
    assert got["score"].to_numpy() == pytest.approx(expected["score"].to_numpy(), abs=1e-5)


def test_bad_requests_and_a_checkpoint_without_a_package_are_one_clear_line(packaged, tmp_path):
    checkpoint = packaged[0]
    searcher = HybridSearch(checkpoint)
    with pytest.raises(AnceError, match="mode 'sparse': use one of hybrid, dense, bm25"):
        searcher.search(QUERIES, mode="sparse")
    with pytest.raises(AnceError, match="k 0"):
        searcher.search(QUERIES, k=0)
    assert searcher.search([], k=3).empty
    for mode in ("hybrid", "dense", "bm25"):  # (bm25's search failed on a null with an AttributeError traceback)
        for value, says in ((None, "text 1 is missing"), (float("nan"), "text 1 is missing"), (3, "text 1 is a int")):
            with pytest.raises(AnceError, match=says):
                searcher.search(["cancer", value], mode=mode)
    bare = tmp_path / "bare"
    shutil.copytree(checkpoint, bare, ignore=shutil.ignore_patterns(RETRIEVAL))
    with pytest.raises(AnceError, match="no retrieval package"):
        HybridSearch(bare)
    half = tmp_path / "half"  # a package whose last shard did not arrive (it failed later, with an IndexError)
    shutil.copytree(checkpoint, half)
    (half / RETRIEVAL / "emb_00001.npy").unlink()
    with pytest.raises(AnceError, match=r"inconsistent retrieval package \(embedding rows 20, docids.txt 30"):
        HybridSearch(half)
    other = tmp_path / "other"  # the same count of other documents' ids
    shutil.copytree(checkpoint, other)
    ids = (other / RETRIEVAL / "docids.txt").read_text().splitlines()
    (other / RETRIEVAL / "docids.txt").write_text("\n".join(["x" + i for i in ids]) + "\n")
    with pytest.raises(AnceError, match="the same counts of other documents"):
        HybridSearch(other)
    for name, damage in (  # (a FileNotFoundError, a TypeError when searched, a JSONDecodeError: tracebacks)
            ("no docids", lambda r: (r / "docids.txt").unlink()),
            ("no bm25 file", lambda r: next((r / "bm25").glob("*.json")).unlink()),
            ("a convex fusion without its weight", lambda r: _edit_package(r, fusion={"method": "convex"})),
            ("a weight of 2", lambda r: _edit_package(r, fusion={"method": "convex", "weight": 2})),
            ("package.json cut short", lambda r: (r / "package.json").write_text('{"fusion": '))):
        bad = tmp_path / name.replace(" ", "-")
        shutil.copytree(checkpoint, bad)
        damage(bad / RETRIEVAL)
        with pytest.raises(AnceError, match=r"a damaged retrieval package \(.*\); log the run's package again"):
            HybridSearch(bad)


def _edit_package(folder, **changes):
    record = json.loads((folder / "package.json").read_text())
    (folder / "package.json").write_text(json.dumps(record | changes))


def test_equal_scores_are_served_in_the_order_the_run_was_evaluated_in(packaged):
    """Every mode ranks equal scores as the evaluation does (the greater document id first): dense search ranked them
    by corpus row, so its two modes disagreed on a query whose hits tie (the tiny corpus repeats its texts)."""
    searcher = HybridSearch(packaged[0])
    for mode in ("dense", "bm25", "hybrid"):
        hits = searcher.search(QUERIES, k=30, mode=mode)
        assert hits.duplicated(["query", "score"]).any(), mode  # (ties to order: the test would not see them)
        evaluated = trec_order(hits.assign(query_id=hits["query"].astype(str)))
        assert hits["doc_id"].tolist() == evaluated["doc_id"].tolist(), mode

