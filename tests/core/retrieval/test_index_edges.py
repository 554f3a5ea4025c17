"""Indexes and searches at the edges a review found (each failed before its fix): ids that hold a line-break
character, an index folder whose ids and vectors disagree, IVF-PQ on one vector, queries encoded to NaN."""

import numpy as np
import pytest

from ance_core.artifacts import DOCIDS, EMBEDDINGS, INDEX_DOCIDS, id_lines
from ance_core.errors import AnceError
from ance_core.retrieval.config import IndexConfig
from ance_core.retrieval.index import SearchIndex, build_index


def _encoding(folder, ids, d=8):
    folder.mkdir()
    vectors = np.eye(len(ids), d, dtype=np.float32)
    np.save(folder / EMBEDDINGS.format(0), vectors)
    (folder / DOCIDS).write_text("".join(f"{i}\n" for i in ids), encoding="utf-8")
    return vectors


def test_an_id_holding_a_unicode_line_separator_keeps_the_ids_after_it_on_their_vectors(tmp_path):
    """docids.txt was read back with str.splitlines, which splits on U+2028 too: every id after one shifted onto the
    next row's vector (the data readers now refuse such ids; a folder built before is read as written)."""
    ids = ["d0", "d1\u2028x", "d2", "d3"]
    vectors = _encoding(tmp_path / "emb", ids)
    assert id_lines(tmp_path / "emb" / DOCIDS) == ids
    (tmp_path / "index").mkdir()
    build_index(tmp_path / "emb", tmp_path / "index", IndexConfig())
    run = SearchIndex(tmp_path / "index").search(vectors, 1)
    assert [hits[0] for hits in run[1]] == ids


def test_an_index_whose_ids_and_vectors_disagree_is_refused(tmp_path):
    _encoding(tmp_path / "emb", ["d0", "d1", "d2"])
    (tmp_path / "index").mkdir()
    build_index(tmp_path / "emb", tmp_path / "index", IndexConfig())
    ids = tmp_path / "index" / INDEX_DOCIDS
    ids.write_text(ids.read_text() + "d3\n")
    with pytest.raises(AnceError, match=r"4 ids in .* for 3 vectors: the index folder is damaged"):
        SearchIndex(tmp_path / "index")


def test_ivf_pq_on_a_single_vector_is_refused_before_it_writes_an_index_it_cannot_read(tmp_path):
    from ance_core.compression.config import CompressConfig
    from ance_core.retrieval.ann import build_ann_index

    _encoding(tmp_path / "emb", ["d0"])
    (tmp_path / "index").mkdir()
    with pytest.raises(AnceError, match="IVF-PQ needs at least 2 vectors"):
        build_ann_index(tmp_path / "emb", tmp_path / "index", "ivfpq", CompressConfig(pq_dims_per_code=2))


def test_queries_encoded_to_nan_are_an_error_naming_the_first(monkeypatch):
    """faiss drops a NaN query from the run without a word (it then scores 0, or mines fallback negatives)."""
    from types import SimpleNamespace

    import ance_core.retrieval.encode as encode
    from ance_core.retrieval.config import EncodeConfig

    def nan_for_the_second(model, tokenizer, texts, *args, **kwargs):
        emb = np.ones((len(texts), 4), dtype=np.float32)
        emb[1, 2] = np.nan
        return emb

    monkeypatch.setattr(encode, "encode_texts", nan_for_the_second)
    import torch

    model = SimpleNamespace(parameters=lambda: iter([torch.zeros(1)]), projector=None)
    meta = SimpleNamespace(queries=lambda texts: texts, query_max_length=8)
    with pytest.raises(AnceError, match=r"1 of 3 queries are encoded to NaN or inf, the first 'second one'"):
        encode.encode_queries(model, None, ["first", "second one", "third"], meta, EncodeConfig(precision="fp32"))


def test_an_index_holds_a_corpus_told_by_its_distinct_ids_whatever_their_order_or_repeats(tmp_path):
    """`ance search --dataset` on a corpus-only copy matches the model's index by the ids it holds (a MaxP index lists
    a document once per window); the ids are read in chunks as arrow strings, not as one Python list."""
    from ance_core.artifacts import INDEX_DOCIDS
    from ance_core.retrieval.provenance import document_set, holds_documents

    (tmp_path / INDEX_DOCIDS).write_text("d1\nd2\nd1\nd 3\n")
    assert holds_documents(tmp_path, document_set(iter(["d 3", "d2", "d1"]), chunk=2))
    assert not holds_documents(tmp_path, document_set(["d1", "d2"]))  # (fewer)
    assert not holds_documents(tmp_path, document_set(["d1", "d2", "d3"]))  # (another id)
    assert not holds_documents(tmp_path / "gone", document_set(["d1"]))
    assert len(document_set((f"d{i % 5}" for i in range(23)), chunk=4)) == 5
