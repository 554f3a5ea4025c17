import json

import pandas as pd
import pytest

from ance_core.data import load_dataset, read_tables, resolve_dataset, save_tables
from ance_core.errors import AnceError, DataError
from tests.conftest import write_beir

CORPUS = [{"_id": f"d{i}", "title": f"t{i}", "text": f"text {i}"} for i in range(4)]
QUERIES = [{"_id": "q1", "text": "one"}, {"_id": "q2", "text": "two"}, {"_id": "q3", "text": "three"}]
QRELS = {"train": [("q1", "d0", 1), ("q1", "d1", 1)], "test": [("q2", "d2", 1), ("q3", "d3", 0)]}


@pytest.fixture
def beir(tmp_path):
    return write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)


def test_beir_loads_tables(beir, tmp_path):
    ds = load_dataset(beir)
    assert list(ds.corpus.columns) == ["doc_id", "title", "text"] and len(ds.corpus) == 4
    assert sorted(ds.qrels["split"].unique()) == ["test", "train"]
    assert ds.positives("train") == {"q1": {"d0", "d1"}}
    assert ds.positives("test") == {"q2": {"d2"}}  # relevance 0 is not a positive
    assert ds.split_queries("train")["query_id"].tolist() == ["q1"]
    out = tmp_path / "tables"
    out.mkdir()
    save_tables(ds, out)
    again = read_tables(out)
    pd.testing.assert_frame_equal(again.qrels, ds.qrels)


def test_unknown_split_names_available(beir):
    with pytest.raises(AnceError, match="split 'dev' has no qrels.*test, train"):
        load_dataset(beir).split_qrels("dev")


def _corrupt(folder, name, lines: list[str | bytes]):
    data = b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)
    (folder / name).write_bytes(data)


def _doc(i):
    return json.dumps({"_id": f"d{i}", "title": "", "text": f"text {i}"})


@pytest.mark.parametrize(
    ("name", "lines", "line", "message"),
    [
        ("corpus.jsonl", [_doc(0), "{not json", _doc(2)], 2, "malformed JSON"),
        ("corpus.jsonl", [_doc(0), json.dumps({"title": "x", "text": "y"})], 2, "missing field '_id'"),
        ("corpus.jsonl", [_doc(0), json.dumps({"_id": "d9", "title": "x"})], 2, "missing field 'text'"),
        ("corpus.jsonl", [_doc(0), _doc(1), _doc(0)], 3, r"duplicate id 'd0' \(first on line 1\)"),
        ("corpus.jsonl", [_doc(0), b'{"_id": "d1", "text": "caf\xe9"}'], 2, "not valid UTF-8"),
        ("corpus.jsonl", ["[1, 2]"], 1, "expected a JSON object"),
        ("queries.jsonl", [json.dumps({"_id": "q1"})], 1, "missing field 'text'"),
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td0\t1", "qX\td0\t1"], 3, "query 'qX' is not in"),
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td77\t1"], 2, "document 'd77' is not in the corpus"),
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td0"], 2, "expected 3 tab-separated columns"),
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td0\thigh"], 2, "relevance 'high' is not a number"),
    ],
)
def test_malformed_inputs_name_file_and_line(beir, name, lines, line, message):
    _corrupt(beir, name, lines)
    with pytest.raises(DataError, match=message) as err:
        load_dataset(beir)
    assert err.value.path.endswith(name) and err.value.line == line
    assert f"{name}:{line}:" in str(err.value)


def test_empty_corpus(beir):
    _corrupt(beir, "corpus.jsonl", ["", "  "])
    with pytest.raises(DataError, match="empty corpus"):
        load_dataset(beir)


def test_split_with_no_queries(beir):
    _corrupt(beir, "qrels/test.tsv", ["query-id\tcorpus-id\tscore"])
    with pytest.raises(DataError, match="split 'test' has no queries"):
        load_dataset(beir)


def test_msmarco_layout_trec_and_three_column_qrels(tmp_path):
    folder = tmp_path / "marco"
    folder.mkdir()
    (folder / "collection.tsv").write_text("0\tfirst passage\n1\tsecond passage\n2\tthird\n")
    (folder / "queries.train.tsv").write_text("10\twhat first\n11\twhat second\n")
    (folder / "qrels.train.tsv").write_text("10 0 0 1\n11\t0\t1\t1\n")
    (folder / "queries.dev.tsv").write_text("20\tthird?\n")
    (folder / "qrels.dev.tsv").write_text("20 2 1\n")
    ds = load_dataset(folder)
    assert ds.corpus["doc_id"].tolist() == ["0", "1", "2"]
    assert ds.positives("train") == {"10": {"0"}, "11": {"1"}}
    assert ds.positives("dev") == {"20": {"2"}}
    (folder / "qrels.dev.tsv").write_text("20 0 9 1\n")
    with pytest.raises(DataError, match=r"qrels.dev.tsv:1: document '9' is not in the corpus"):
        load_dataset(folder)
    (folder / "qrels.dev.tsv").write_text("20 2 1\n")
    (folder / "queries.train.tsv").write_text("10\twhat first\n10\tagain\n")
    with pytest.raises(DataError, match=r"queries.train.tsv:2: duplicate id '10' \(first on line 1\)"):
        load_dataset(folder)


def test_resolve_dataset(tmp_path, monkeypatch, beir):
    assert resolve_dataset(str(beir)) == beir
    monkeypatch.setenv("ANCE_DATA_HOME", str(beir.parent))
    assert resolve_dataset("ds") == beir
    with pytest.raises(AnceError, match="dataset 'nope' not found"):
        resolve_dataset("nope")
    with pytest.raises(AnceError, match="download is off"):
        resolve_dataset("scifact", home=str(tmp_path / "empty"), download=False)


def test_download_verifies_checksum_and_unpacks_atomically(tmp_path, monkeypatch, beir):
    import hashlib
    import shutil

    from ance_core import data

    archive = shutil.make_archive(str(tmp_path / "ds"), "zip", root_dir=beir.parent, base_dir="ds")
    monkeypatch.setattr(data, "BEIR_URL", f"file://{tmp_path}/{{name}}.zip")
    home = tmp_path / "home"
    monkeypatch.setitem(data.BEIR_MD5, "ds", "0" * 32)
    with pytest.raises(AnceError, match="checksum mismatch"):
        resolve_dataset("ds", home=str(home))
    assert not (home / "ds").exists() and not list(home.glob(".download-*"))  # nothing half-written
    monkeypatch.setitem(data.BEIR_MD5, "ds", hashlib.md5(open(archive, "rb").read()).hexdigest())
    folder = resolve_dataset("ds", home=str(home))
    assert folder == home / "ds" and len(load_dataset(folder).corpus) == 4
