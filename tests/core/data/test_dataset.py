import json
import warnings
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from ance_core.data.config import DataConfig
from ance_core.data.dataset import load_dataset, read_tables, save_tables
from ance_core.data.sources import resolve_dataset
from ance_core.data.splits import with_dev_split, with_training_grades
from ance_core.errors import AnceError, AnceWarning, DataError
from tests.tiny import write_beir

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
    assert ds.judged_nonrelevant("test") == {"q3": {"d3"}} and ds.judged_nonrelevant("train") == {}  # it is a judgment
    assert ds.split_queries("train")["query_id"].tolist() == ["q1"]
    out = tmp_path / "tables"
    out.mkdir()
    save_tables(ds, out)
    again = read_tables(out)
    pd.testing.assert_frame_equal(again.qrels, ds.qrels)
    labels_only = read_tables(out, corpus_columns=[])  # what training reads: its passages come by row (corpus.py)
    assert labels_only.corpus.empty and labels_only.relevant("train") == ds.relevant("train")


def test_unknown_split_names_available(beir):
    with pytest.raises(AnceError, match="split 'dev' has no qrels.*test, train"):
        load_dataset(beir).split_qrels("dev")


def _corrupt(folder, name, lines: list[str | bytes]):
    data = b"".join((x if isinstance(x, bytes) else x.encode()) + b"\n" for x in lines)
    (folder / name).write_bytes(data)


def _doc(i):
    return json.dumps({"_id": f"d{i}", "title": "", "text": f"text {i}"})


BAD_LINES = [  # (file, a line that cannot be read as one of its rows, the problem named)
    ("corpus.jsonl", "{not json", "malformed JSON"),
    ("corpus.jsonl", '{"_id": "d9", "text": "no end', r"malformed JSON: Unterminated string starting at \(column 23\)"),
    ("corpus.jsonl", json.dumps({"title": "x", "text": "y"}), "missing field '_id'"),
    ("corpus.jsonl", json.dumps({"_id": None, "text": "y"}), "field '_id' is null"),
    ("corpus.jsonl", "[1, 2]", "expected a JSON object, got list"),
    ("corpus.jsonl", json.dumps({"_id": "d9", "text": ["a"]}), "field 'text' must be a string"),
    ("corpus.jsonl", json.dumps({"_id": "d9", "title": {"a": 1}, "text": "x"}), "field 'title' must be a string"),
    ("corpus.jsonl", json.dumps({"_id": "", "text": "x"}), "empty '_id'"),
    ("queries.jsonl", json.dumps({"_id": "q9"}), "missing field 'text'"),
    ("queries.jsonl", json.dumps({"_id": "q9", "text": ["a"]}), "field 'text' must be a string"),
    ("qrels/train.tsv", "q1\td2", "expected 3 tab-separated columns"),
    ("qrels/train.tsv", "q1\td2\thigh", "relevance 'high' is not a number"),
    ("qrels/train.tsv", "q1\td2\tinf", "relevance 'inf' is not an integer grade"),
    ("qrels/train.tsv", "q1\td2\t1\tsomething", r"got 4 \(an extra column 'something' after the score 1\?\)"),
]


@pytest.mark.parametrize(("name", "line", "message"), BAD_LINES)
def test_a_line_that_cannot_be_read_is_left_out_with_a_warning_naming_file_and_line(beir, tmp_path, name, line,
                                                                                     message):
    """Real data is messy: one bad row among usable ones is left out, named (file, line, problem) in one warning,
    and the load goes on with the rest."""
    clean = load_dataset(write_beir(tmp_path / "clean", CORPUS, QUERIES, QRELS))
    lines = (beir / name).read_text().splitlines()
    _corrupt(beir, name, [*lines[:1], line, *lines[1:]])  # (after the qrels' header)
    rows = len(lines) + 1 - name.startswith("qrels")  # (a header is not a row)
    with pytest.warns(AnceWarning, match=rf"{name}: 1 of its {rows} rows cannot be read and is left out: line 2: .*"
                      rf"{message}"):
        ds = load_dataset(beir)
    for table in ("corpus", "queries", "qrels"):
        pd.testing.assert_frame_equal(getattr(ds, table), getattr(clean, table))


@pytest.mark.parametrize(("name", "line", "message"), BAD_LINES)
def test_a_file_none_of_whose_lines_can_be_read_names_file_and_line(beir, name, line, message):
    """Nothing usable left (the wrong file, or the wrong format): the first problem, with its file and line."""
    header = ["query-id\tcorpus-id\tscore"] if name.startswith("qrels") else []
    _corrupt(beir, name, [*header, line, line])
    with pytest.raises(DataError, match=message) as err:
        load_dataset(beir)
    number = len(header) + 1
    assert err.value.path.endswith(name) and err.value.line == number and f"{name}:{number}:" in str(err.value)


@pytest.mark.parametrize(
    ("name", "lines", "line", "message"),
    [
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore", "qX\td0\t1"], 2,
         "none of its 1 qrels names a query of the queries file"),
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td77\t1"], 2,
         "none of its 1 qrels names a document of the corpus"),
        ("qrels/train.tsv", ["query-id\tcorpus-id\tscore\tnote", "q1\td0\t1\tx", "q1\td1\t1\t0"], 1,
         r"a header of 4 columns \(query-id corpus-id score note\)"),  # a layout, not one row: it stops the load
    ],
)
def test_malformed_inputs_name_file_and_line(beir, name, lines, line, message):
    _corrupt(beir, name, lines)
    with pytest.raises(DataError, match=message) as err:
        load_dataset(beir)
    assert err.value.path.endswith(name) and err.value.line == line
    assert f"{name}:{line}:" in str(err.value)


def test_usable_but_odd_rows_are_kept_with_a_warning_naming_them(beir):
    """A document with an empty title and text is kept (a qrels row may name it) and named; a pair judged twice with
    different grades keeps the later line's grade, and is named; a pair listed twice with one grade is no news."""
    _corrupt(beir, "corpus.jsonl", [_doc(0), _doc(1), _doc(2), json.dumps({"_id": "d3", "title": " ", "text": ""})])
    _corrupt(beir, "qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td0\t2", "q1\td1\t1", "q1\td0\t1",
                                       "q1\td1\t1", "q1\td0\t2"])
    with pytest.warns(AnceWarning) as caught:
        ds = load_dataset(beir)
    messages = [str(w.message) for w in caught]
    assert any("corpus.jsonl: 1 of 4 documents have an empty title and text (kept; nothing in them to rank by): d3"
               in m for m in messages)
    assert any(m.startswith("1 (query, document) pairs are judged twice with different grades") and
               "q1 / d0 in train (train.tsv lines 2, 4, 6: 2, then 1, then 2)" in m for m in messages)
    assert not any("d1 in train" in m for m in messages)
    assert len(ds.corpus) == 4 and ds.qrels.query("split == 'train'").set_index("doc_id")["relevance"].to_dict() == {
        "d0": 2, "d1": 1}


def test_a_line_that_is_not_utf8_or_repeats_an_id_is_left_as_it_can_be_with_a_warning(beir):
    """Real data is messy: one line with a Latin-1 byte is read with U+FFFD in its place, and a document line that
    repeats an earlier id is left out (the first kept); each gets one warning naming the line, and the load goes on."""
    _corrupt(beir, "corpus.jsonl", [_doc(0), b'{"_id": "d1", "title": "", "text": "caf\xe9"}', _doc(2), _doc(3),
                                    _doc(0)])
    with pytest.warns(AnceWarning) as caught:
        ds = load_dataset(beir)
    messages = [str(w.message) for w in caught]
    assert any("corpus.jsonl:2: not valid UTF-8 (byte 39 of the line): its invalid bytes are read as U+FFFD" in m
               for m in messages)
    assert any("corpus.jsonl: 1 line repeats the id of an earlier line and is left out (the first line of an id is "
               "kept): 'd0' (lines 1 and 5)" in m for m in messages)
    assert ds.corpus["doc_id"].tolist() == ["d0", "d1", "d2", "d3"]
    assert ds.corpus.set_index("doc_id")["text"]["d1"] == "caf\ufffd"


def test_empty_corpus(beir):
    _corrupt(beir, "corpus.jsonl", ["", "  "])
    with pytest.raises(DataError, match="empty corpus"):
        load_dataset(beir)


def test_a_split_with_no_qrels_lines_is_left_out_and_the_others_load(beir):
    """An empty split file (a header alone) is left out with a warning; a run that asks for it is told the split is
    missing; with every split empty, the load is refused."""
    _corrupt(beir, "qrels/test.tsv", ["query-id\tcorpus-id\tscore"])
    with pytest.warns(AnceWarning, match=r"qrels/test.tsv: no qrels lines: split 'test' is left out"):
        ds = load_dataset(beir)
    assert set(ds.qrels["split"]) == {"train"} and len(ds.split_queries("train"))
    with pytest.raises(AnceError, match=r"split 'test' has no qrels \(available splits: train\)"):
        ds.split_qrels("test")
    _corrupt(beir, "qrels/train.tsv", [])
    with pytest.warns(AnceWarning), pytest.raises(DataError, match=r"no qrels lines in any of test.tsv, train.tsv"):
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
    with pytest.raises(DataError, match=r"qrels.dev.tsv:1: split 'dev': none of its 1 qrels names a document of"):
        load_dataset(folder)
    (folder / "qrels.dev.tsv").write_text("20 2 1\n")
    (folder / "queries.train.tsv").write_text("10\twhat first\n10\tagain\n")
    with pytest.warns(AnceWarning, match=r"queries.train.tsv: 1 line repeats the id of an earlier line and is left "
                      r"out \(the first line of an id is kept\): '10' \(lines 1 and 2\)"):
        assert load_dataset(folder).queries.set_index("query_id")["text"].get("10") == "what first"


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

    from ance_core.data import sources as data

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


# ---------------------------------------------------------------- files written on Windows, bad values, error paths


def _windows(text: str) -> bytes:
    """What Windows tools write: a UTF-8 byte-order mark and CRLF line endings."""
    return b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8")


def test_byte_order_mark_and_crlf_are_accepted_in_every_beir_file(beir):
    clean = load_dataset(beir)
    for path in [beir / "corpus.jsonl", beir / "queries.jsonl", *sorted((beir / "qrels").glob("*.tsv"))]:
        path.write_bytes(_windows(path.read_text()))
    windows = load_dataset(beir)
    for name in ("corpus", "queries", "qrels"):
        pd.testing.assert_frame_equal(getattr(windows, name), getattr(clean, name))


def test_a_file_compressed_in_place_under_its_own_name_is_read_decompressed(beir):
    """A probe: a gzip file named corpus.jsonl was read as bytes, 'not valid UTF-8' and every line malformed."""
    import gzip

    clean = load_dataset(beir)
    for path in [beir / "corpus.jsonl", beir / "queries.jsonl", *sorted((beir / "qrels").glob("*.tsv"))]:
        path.write_bytes(gzip.compress(path.read_bytes()))
    pd.testing.assert_frame_equal(load_dataset(beir).corpus, clean.corpus)


def test_byte_order_mark_and_crlf_are_accepted_in_every_msmarco_file(tmp_path):
    folder = tmp_path / "marco"
    folder.mkdir()
    files = {"collection.tsv": "0\tfirst passage\n1\tt\tsecond passage\n", "queries.train.tsv": "10\twhat first\n",
             "qrels.train.tsv": "10 0 0 1\n"}
    for name, text in files.items():
        (folder / name).write_text(text)
    clean = load_dataset(folder)
    for name, text in files.items():
        (folder / name).write_bytes(_windows(text))
    windows = load_dataset(folder)
    for name in ("corpus", "queries", "qrels"):
        pd.testing.assert_frame_equal(getattr(windows, name), getattr(clean, name))
    assert windows.corpus["text"].tolist() == ["first passage", "second passage"]  # no stray '\r'


def test_lines_ending_with_cr_alone_are_read_as_lines_in_every_file(beir, tmp_path):
    """Classic Mac OS tools (and Excel's "CSV (Macintosh)") end lines with CR alone: read as one line, each file was
    the whole of it, and the load failed on the first row with a message about JSON or columns."""
    clean = load_dataset(beir)
    for path in [beir / "corpus.jsonl", beir / "queries.jsonl", *sorted((beir / "qrels").glob("*.tsv"))]:
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnceWarning)
        mac = load_dataset(beir)
    for name in ("corpus", "queries", "qrels"):
        pd.testing.assert_frame_equal(getattr(mac, name), getattr(clean, name))
    marco = load_dataset(_marco(tmp_path, {"collection.tsv": b"0\tfirst passage\r1\tt\tsecond passage\r",
                                           "queries.train.tsv": b"10\twhat first\r",
                                           "qrels.train.tsv": b"10 0 0 1\r"}))
    assert marco.corpus["text"].tolist() == ["first passage", "second passage"]
    assert marco.positives("train") == {"10": {"0"}}


def _marco(tmp_path, files: dict[str, bytes]) -> Path:
    """An MS MARCO folder of these files' bytes."""
    folder = tmp_path / "marco"
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


def test_a_collection_tsv_header_line_is_skipped_with_a_warning(tmp_path):
    folder = _marco(tmp_path, {"collection.tsv": b"pid\tpassage\n0\tfirst passage\n1\tsecond passage\n",
                               "queries.train.tsv": b"10\twhat first\n", "qrels.train.tsv": b"10 0 0 1\n"})
    with pytest.warns(AnceWarning, match=r"collection.tsv:1: read as a header line \(pid passage\) and skipped"):
        ds = load_dataset(folder)
    assert ds.corpus["doc_id"].tolist() == ["0", "1"]
    # a passage whose id is "id" (its text names no column) stays a passage
    (folder / "collection.tsv").write_text("id\tsome passage about text\n0\tfirst passage\n")
    assert load_dataset(folder).corpus["doc_id"].tolist() == ["id", "0"]


@pytest.mark.parametrize("header", ["qid 0 docid rel", "qid\titer\tdocid\trel", "qid 0 pid label"])
def test_a_trec_qrels_header_line_is_skipped_with_a_warning(tmp_path, header):
    """TREC's qrels have no header, and one naming TREC's columns stopped the load (or, naming its grade `label`,
    was left out as a bad row): its rows read as they are, it is skipped, as collection.tsv's is."""
    folder = _marco(tmp_path, {"collection.tsv": b"0\tfirst passage\n1\tsecond passage\n",
                               "queries.train.tsv": b"10\twhat first\n11\twhat second\n",
                               "qrels.train.tsv": f"{header}\n10 0 0 1\n11 0 1 2\n".encode()})
    with pytest.warns(AnceWarning, match=r"qrels.train.tsv:1: read as a header line \(.*\) and skipped: TREC's"):
        ds = load_dataset(folder)
    assert ds.qrels[["query_id", "doc_id", "relevance"]].values.tolist() == [["10", "0", 1], ["11", "1", 2]]


def test_a_trec_qrels_relevance_that_is_not_a_number_is_named_as_such(tmp_path):
    """`10\t0\t3\thigh`: a TREC row (iteration 0) whose relevance is a word, not BEIR's 3 columns and an extra one
    (the numeric document id 3 was read as a score, and the relevance as a column too many)."""
    folder = _marco(tmp_path, {"collection.tsv": b"0\tfirst passage\n3\tthird passage\n",
                               "queries.train.tsv": b"10\twhat first\n11\twhat third\n",
                               "qrels.train.tsv": b"10\t0\t0\t1\n11\t0\t3\thigh\n"})
    with pytest.warns(AnceWarning, match=r"line 2: relevance 'high' is not a number"):
        load_dataset(folder)


@pytest.mark.parametrize("value", ["inf", "nan", "1e400", "-inf", "0.5"])
def test_relevance_that_is_not_an_integer_grade_names_the_line(beir, value):
    _corrupt(beir, "qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td0\t1", f"q1\td1\t{value}"])
    with pytest.warns(AnceWarning, match=f"train.tsv: 1 of its 2 rows cannot be read and is left out: line 3: "
                      f"relevance '{value}' is not an integer grade"):
        assert load_dataset(beir).split_qrels("train")["doc_id"].tolist() == ["d0"]


def test_integer_valued_floats_are_grades(beir):
    _corrupt(beir, "qrels/train.tsv", ["query-id\tcorpus-id\tscore", "q1\td0\t1.0", "q1\td1\t2"])
    assert sorted(load_dataset(beir).split_qrels("train")["relevance"]) == [1, 2]


def test_queries_with_empty_text_are_dropped_with_one_warning_naming_them(beir):
    _corrupt(beir, "queries.jsonl", [json.dumps({"_id": "q1", "text": "one"}), json.dumps({"_id": "q2", "text": " "}),
                                     json.dumps({"_id": "q3", "text": ""})])
    with pytest.warns(AnceWarning, match=r"queries.jsonl: 2 queries with empty text .*: q2, q3") as caught:
        ds = load_dataset(beir)
    # the test split judges q2 and q3 alone: said (it was then told "split 'test' has no qrels", its file full)
    assert [str(w.message).split(": ", 1)[1] for w in caught[1:]] == [
        "every query split 'test' judges has empty text in queries.jsonl: the split is left out"]
    assert ds.queries["query_id"].tolist() == ["q1"] and set(ds.qrels["query_id"]) == {"q1"}


def test_queries_all_of_empty_text_are_named_as_such_not_as_missing_qrels(beir):
    """Once "split 'test' has no qrels (available splits: )", though its qrels file held every line: the warning names
    the queries, and the split's error points at it (the corpus alone stays usable: `ance search --dataset`)."""
    _corrupt(beir, "queries.jsonl", [json.dumps({"_id": q["_id"], "text": " "}) for q in QUERIES])
    with pytest.warns(AnceWarning, match=r"queries.jsonl: 3 queries with empty text are left out of every split"):
        ds = load_dataset(beir)
    assert len(ds.corpus) == len(CORPUS)
    with pytest.raises(AnceError, match=r"split 'test' has no qrels: no qrels line of any split is left \(the "
                       r"warnings above say why each was left out\)"):
        ds.split_qrels("test")


def test_a_corpus_file_that_is_a_folder_or_a_broken_link_is_named_as_such(beir):
    """Once "neither a BEIR folder (corpus.jsonl) nor MS MARCO", with corpus.jsonl right there."""
    (beir / "corpus.jsonl").unlink()
    (beir / "corpus.jsonl").mkdir()
    with pytest.raises(AnceError, match=r"corpus.jsonl: a folder, not the corpus file"):
        load_dataset(beir)
    (beir / "corpus.jsonl").rmdir()
    (beir / "corpus.jsonl").symlink_to(beir / "gone.jsonl")
    with pytest.raises(AnceError, match=r"corpus.jsonl: a link to .*gone.jsonl, which cannot be followed"):
        load_dataset(beir)
    (beir / "corpus.jsonl").unlink()
    (beir / "corpus.jsonl").symlink_to("/dev/null")
    with pytest.raises(AnceError, match=r"corpus.jsonl: not a regular file \(a device or a pipe\)"):
        load_dataset(beir)


def test_missing_files_and_folders_are_named(beir, tmp_path):
    (beir / "queries.jsonl").unlink()
    with pytest.raises(DataError, match=r"queries.jsonl: file not found"):
        load_dataset(beir)
    again = write_beir(tmp_path / "again", CORPUS, QUERIES, QRELS)
    for f in (again / "qrels").iterdir():
        f.unlink()
    (again / "qrels").rmdir()
    with pytest.raises(DataError, match=r"qrels: no qrels/<split>.tsv files"):
        load_dataset(again)
    (tmp_path / "neither").mkdir()
    with pytest.raises(AnceError, match="neither a BEIR folder .* nor MS MARCO"):
        load_dataset(tmp_path / "neither")
    (tmp_path / "neither" / "corpus.jsonl.gz").write_bytes(b"")  # as BEIR's zips and mirrors ship it
    with pytest.raises(AnceError, match=r"nor MS MARCO \(collection.tsv\); it holds corpus.jsonl.gz: unpack it"):
        load_dataset(tmp_path / "neither")
    from ance_core.data.sources import resolve_dataset

    with pytest.raises(AnceError, match=r"dataset '.*corpus.jsonl.gz': .* is a file, not a dataset folder"):
        resolve_dataset(str(tmp_path / "neither" / "corpus.jsonl.gz"), download=False)
    # a file of that name in the data home: named as one (it was "not found: not in the data home")
    with pytest.raises(AnceError, match=r"dataset 'corpus.jsonl.gz': .*neither/corpus.jsonl.gz is a file, not a"):
        resolve_dataset("corpus.jsonl.gz", str(tmp_path / "neither"), download=False)
    with pytest.raises(AnceError, match=r"the dataset is empty: give a dataset folder, or a name"):  # (--dataset ""
        resolve_dataset(" ", str(tmp_path), download=False)  # was the current folder: "neither a BEIR folder")
    # a data home that is a file (a probe: a download was tried first, and failed with "File exists")
    with pytest.raises(AnceError, match=r"dataset 'scifact': the data home .*corpus.jsonl.gz is a file, not a folder"):
        resolve_dataset("scifact", str(tmp_path / "neither" / "corpus.jsonl.gz"))


def test_msmarco_column_count_and_empty_corpus_errors(tmp_path):
    folder = tmp_path / "marco"
    folder.mkdir()
    # tabs inside a passage (line 2), tabs ending a line (line 3): read, the first said; no tab at all: a bad row
    (folder / "collection.tsv").write_text("0\tfirst\n1\ta\tb\tc\n2\tsecond\t\t\n3 no tab\n")
    (folder / "queries.train.tsv").write_text("10\twhat\n")
    (folder / "qrels.train.tsv").write_text("10 0 0 1\n")
    with pytest.warns(AnceWarning) as caught:  # one bad row of each: left out, named, and the load goes on
        ds = load_dataset(folder)
    messages = [str(w.message) for w in caught]
    assert any(m.endswith("collection.tsv: 1 of its 4 rows cannot be read and is left out: line 4: expected 2 (id, "
                          "text) or 3 (id, title, text) columns, got 1") for m in messages), messages
    tabs = ("collection.tsv: 1 lines have more than 3 tab-separated columns (tabs inside a passage's text), read as "
            "the id and a text whose tabs are spaces: lines 2")
    assert any(m.endswith(tabs) for m in messages), messages
    assert ds.corpus[["doc_id", "title", "text"]].values.tolist() == [["0", "", "first"], ["1", "", "a b c"],
                                                                       ["2", "", "second"]]
    assert ds.queries["query_id"].tolist() == ["10"]
    (folder / "collection.tsv").write_text("1 a b c\n")
    with pytest.raises(DataError, match=r"collection.tsv:1: expected 2 \(id, text\) or 3 \(id, title, text\) columns"):
        load_dataset(folder)
    (folder / "collection.tsv").write_text("0\tfirst\n")
    (folder / "qrels.train.tsv").write_text("10 0 0 1 extra\n")
    with pytest.raises(DataError, match=r"qrels.train.tsv:1: expected 3 tab-separated columns .* or TREC's 4 .*got 5"):
        load_dataset(folder)
    (folder / "queries.train.tsv").write_text("10 what\n")
    with pytest.raises(DataError, match=r"queries.train.tsv:1: expected 2 tab-separated columns"):
        load_dataset(folder)
    (folder / "collection.tsv").write_text("\n\n")
    with pytest.raises(DataError, match=r"collection.tsv: empty corpus"):
        load_dataset(folder)
    (folder / "collection.tsv").write_text("0\tfirst\n1\tsecond\n")
    (folder / "qrels.train.tsv").write_text("10 0 0 1\n")
    (folder / "queries.train.tsv").write_text("\n")  # (it said no qrels line names a query of the queries file)
    with pytest.raises(DataError, match=r"queries.train.tsv: no queries: the file is empty"):
        load_dataset(folder)


def test_an_empty_queries_file_is_named_as_empty(beir):
    _corrupt(beir, "queries.jsonl", [""])
    with pytest.raises(DataError, match=r"queries.jsonl: no queries: the file is empty"):
        load_dataset(beir)


def test_archive_entries_that_escape_the_target_folder_are_refused(tmp_path, monkeypatch):
    import hashlib
    import zipfile

    from ance_core.data import sources as data

    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("evil/corpus.jsonl", "{}\n")
        zf.writestr("../../escaped.txt", "gotcha")
    monkeypatch.setattr(data, "BEIR_URL", f"file://{tmp_path}/{{name}}.zip")
    monkeypatch.setitem(data.BEIR_MD5, "evil", hashlib.md5(archive.read_bytes()).hexdigest())
    home = tmp_path / "home"
    with pytest.raises(AnceError, match=r"unsafe path in archive: \.\./\.\./escaped.txt"):
        resolve_dataset("evil", home=str(home))
    assert not (tmp_path / "escaped.txt").exists() and not (home / "evil").exists()
    assert not list(home.glob(".download-*"))


# ---------------------------------------------------------------- the dev split and graded training positives


def _many_queries(tmp_path, n=50, grades=(1,)):
    corpus = [{"_id": f"d{i}", "title": "", "text": f"text {i}"} for i in range(n)]
    queries = [{"_id": f"q{i}", "text": f"query {i}"} for i in range(n)]
    train = [(f"q{i}", f"d{i}", grades[-1]) for i in range(n)] + [(f"q{i}", f"d{(i + 1) % n}", grades[0])
                                                                 for i in range(0, n, 2)]
    return write_beir(tmp_path / "many", corpus, queries, {"train": train, "test": [("q0", "d0", 1)]})


def test_dev_split_is_a_seeded_share_of_the_train_queries(tmp_path):
    ds = load_dataset(_many_queries(tmp_path))
    carved = with_dev_split(ds, "train", "dev", 0.2, seed=0)
    dev, train = set(carved.positives("dev")), set(carved.positives("train"))
    assert len(dev) == 10 and len(train) == 40 and not dev & train
    assert len(carved.qrels) == len(ds.qrels)  # every qrels row kept, ten queries relabelled
    assert set(with_dev_split(ds, "train", "dev", 0.2, seed=0).positives("dev")) == dev  # deterministic
    assert set(with_dev_split(ds, "train", "dev", 0.2, seed=1).positives("dev")) != dev
    # a query's membership depends on nothing but (seed, its id): more queries never move the ones already there
    grown = _many_queries(tmp_path / "grown", n=80)
    bigger = with_dev_split(load_dataset(grown), "train", "dev", 0.2, seed=0)
    assert set(bigger.positives("dev")) & set(carved.positives("train") | carved.positives("dev")) == dev
    assert with_dev_split(carved, "train", "dev", 0.5, seed=3) is carved  # a dataset's own dev split is kept
    assert with_dev_split(ds, "train", "dev", 0.0, seed=0) is ds
    with pytest.warns(AnceWarning, match="no dev split: data.dev_fraction 0.001 of the 50 'train' queries"):
        assert with_dev_split(ds, "train", "dev", 0.001, seed=0) is ds
    # most of the queries held out (0.9 typed for 0.1): carved as asked, and said
    with pytest.warns(AnceWarning, match=r"most training queries held out: data.dev_fraction 0.9 makes \d+ of the 50 "
                      r"'train' queries with a positive the dev split, .* leaves \d+ to train on"):
        held = with_dev_split(ds, "train", "dev", 0.9, seed=0)
    assert len(held.positives("dev")) > len(held.positives("train")) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with_dev_split(ds, "train", "dev", 0.3, seed=0)  # (a usual share: nothing said)


def test_dev_folds_are_disjoint_dev_splits_and_fold_0_is_the_default(tmp_path):
    ds = load_dataset(_many_queries(tmp_path, n=60))
    folds = [with_dev_split(ds, "train", "dev", 0.3, seed=0, fold=i) for i in range(3)]
    devs = [set(f.positives("dev")) for f in folds]
    assert devs[0] == set(with_dev_split(ds, "train", "dev", 0.3, seed=0).positives("dev"))
    assert all(devs) and not (devs[0] & devs[1] or devs[0] & devs[2] or devs[1] & devs[2])
    for fold, dev in zip(folds, devs, strict=True):  # each fold trains on every query but its own dev's
        assert set(fold.positives("train")) == set(ds.positives("train")) - dev
    # 0.3 leaves a tenth of the queries in training under every fold; 0.25 covers them all
    assert len(set().union(*devs)) < 60
    quarters = [set(with_dev_split(ds, "train", "dev", 0.25, seed=0, fold=i).positives("dev")) for i in range(4)]
    assert set().union(*quarters) == set(ds.positives("train")) and sum(map(len, quarters)) == 60
    assert DataConfig(dev_fraction=0.3, dev_fold=2).dev_fold == 2
    with pytest.raises(ValidationError, match="dev_fold 3 with dev_fraction 0.3: folds of that size are 0 to 2"):
        DataConfig(dev_fraction=0.3, dev_fold=3)


def test_a_datasets_own_dev_queries_are_not_trained_on(tmp_path):
    """A dev file naming train queries kept their train rows: the models trained on the queries that then chose the
    run's result and the champion, with no word of it."""
    ds = load_dataset(_many_queries(tmp_path))
    qrels = ds.qrels.copy()
    dev_rows = qrels[qrels["query_id"].isin(["q1", "q2"])].assign(split="dev")
    own = type(ds)(ds.corpus, ds.queries, pd.concat([qrels, dev_rows], ignore_index=True))
    assert {"q1", "q2"} <= set(own.positives("train"))
    with pytest.warns(AnceWarning, match=r"2 queries of the 'dev' split are in the 'train' split too \(q1, q2\)"):
        kept = with_dev_split(own, "train", "dev", 0.2, seed=0)
    assert not {"q1", "q2"} & set(kept.positives("train")) and set(kept.positives("dev")) == {"q1", "q2"}
    assert len(kept.positives("train")) == 48


def test_graded_qrels_train_on_each_querys_top_grade_and_say_what_they_left_out(tmp_path):
    ds = load_dataset(_many_queries(tmp_path, grades=(1, 2)))
    with pytest.warns(AnceWarning, match=r"the 50 'train' pairs at each query's own top grade \(graded qrels, grades "
                                         r"1, 2; queries by their top grade: 2: 50\); the other 25 relevant pairs "
                                         r"\(33%\)"):
        graded = with_training_grades(ds, "train", "auto")
    assert graded.positives("train")["q0"] == {"d0"}  # grade 2 only
    assert graded.relevant("train")["q0"] == {"d0", "d1"}  # grade 1 is still never a negative
    assert with_training_grades(ds, "train", 1).positives("train")["q0"] == {"d0", "d1"}
    ungraded = load_dataset(_many_queries(tmp_path / "flat"))
    assert with_training_grades(ungraded, "train", "auto").min_relevance == {"train": 1}
    with pytest.raises(AnceError, match="no pair of the 'train' split has that grade"):
        with_training_grades(ds, "train", 3)
    out = tmp_path / "tables"
    out.mkdir()
    save_tables(graded, out)
    assert read_tables(out).positives("train") == graded.positives("train")


def _graded_shape(folder, queries: int, grades_of) -> tuple[Path, dict]:
    """A train split whose query i has the (document, grade) list grades_of(i)."""
    qrels = [(f"q{i}", f"d{i}-{j}", g) for i in range(queries) for j, g in enumerate(grades_of(i))]
    corpus = [{"_id": d, "title": "", "text": d} for _, d, _ in qrels]
    return write_beir(folder, corpus, [{"_id": f"q{i}", "text": f"q {i}"} for i in range(queries)],
                      {"train": qrels, "test": qrels[:1]}), {(q, d): g for q, d, g in qrels}


@pytest.mark.parametrize("shape", ["many weak links", "four grades, the top one rare"])
def test_the_auto_rule_keeps_every_query_with_its_best_documents_in_both_graded_shapes(tmp_path, shape):
    """Many weak links per query (one grade-2 document and 12 grade-1 links each, as NFCorpus): each query trains on
    its grade-2 document only. Four grades whose top is rare (a few queries have a grade-4 "complete answer", the rest
    top out at 3, 2 or 1; ~8 relevant each, as the classic collection that lost 61% of its queries to a split-wide top
    grade): every query keeps a positive, its documents of its own best grade, and no lower one."""
    if shape == "many weak links":
        folder, grade = _graded_shape(tmp_path / "a", 40, lambda i: [2] + [1] * 12)
    else:  # query i's best grade: 4 for one query in eight, else 3, 2 or 1
        folder, grade = _graded_shape(tmp_path / "b", 40, lambda i: ([4] if i % 8 == 0 else []) +
                                      [min(3, 1 + i % 3)] * 2 + [1] * 5 + ([2] if i % 3 == 2 else []))
    ds = load_dataset(folder)
    with pytest.warns(AnceWarning, match="each query's own top grade"):
        graded = with_training_grades(ds, "train", "auto")
    positives = graded.positives("train")
    assert len(positives) == 40  # no query lost
    for q, docs in positives.items():
        best = max(g for (query, _), g in grade.items() if query == q)
        assert docs == {d for (query, d), g in grade.items() if query == q and g == best}
    assert graded.relevant("train") == ds.relevant("train")  # every grade stays out of the negatives
    kept = sum(map(len, positives.values()))
    if shape == "many weak links":
        assert kept == 40  # the 480 weak links left out
    else:  # a split-wide top grade keeps 5 queries; each query's best keeps 40 and their 2-3 best documents each
        assert len(with_training_grades(ds, "train", 4).positives("train")) == 5 and kept >= 80


def test_trec_qrels_load_wherever_beir_tsv_does(beir, tmp_path):
    """`qid 0 docid rel`, whitespace-separated, no header (trec_eval's format): the same tables as BEIR's TSV."""
    (beir / "qrels" / "train.tsv").write_text("q1 0 d0 1\nq1\t0\td1\t1\n")
    (beir / "qrels" / "test.tsv").write_text("q2 Q0 d2 1\nq3 0 d3 0\n")
    trec = load_dataset(beir)
    pd.testing.assert_frame_equal(trec.qrels, load_dataset(write_beir(tmp_path / "tsv", CORPUS, QUERIES, QRELS)).qrels)


def test_qrels_naming_absent_documents_or_queries_are_left_out_with_one_warning_per_split(beir):
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\nq1\tgone1\t1\nq1\tgone2\t1\n"
                                              "qX\td0\t1\n")
    with pytest.warns(AnceWarning) as caught:
        ds = load_dataset(beir)
    assert [str(w.message).split("train.tsv: ")[1] for w in caught] == [
        "1 of 4 qrels of split 'train' name queries that are not in the queries file (or on a line of it left out "
        "above); they are left out: qX (line 5)",
        "2 of 3 qrels of split 'train' name documents that are not in the corpus (or on a line of it left out above); "
        "they are left out (BEIR's evaluation counts such a judgement as a relevant document never retrieved: recall "
        "and nDCG here read higher than BEIR's on this split): gone1 (line 3), gone2 (line 4)"]
    assert ds.positives("train") == {"q1": {"d0"}}


def test_a_corpus_of_empty_texts_is_refused_naming_the_file(beir):
    _corrupt(beir, "corpus.jsonl", [json.dumps({"_id": f"d{i}", "title": " ", "text": ""}) for i in range(4)])
    with pytest.raises(DataError, match="corpus.jsonl: all 4 documents have an empty title and text"):
        load_dataset(beir)
    _corrupt(beir, "corpus.jsonl", [json.dumps({"_id": "d0", "title": "", "text": ""}),
                                    *[json.dumps({"_id": f"d{i}", "title": "", "text": "x"}) for i in (1, 2, 3)]])
    assert len(load_dataset(beir).corpus) == 4  # one empty document among others is fine


def test_a_train_split_without_positives_is_refused_naming_its_file(beir):
    from ance_core.data.checks import check_trainable

    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t0\nq1\td1\t0\n")
    ds = load_dataset(beir)
    with pytest.raises(DataError, match=r"qrels/train.tsv: split 'train' has no positive .*nothing to train on"):
        check_trainable(ds, beir, "train")
    check_trainable(ds, beir, "test")  # q2 -> d2


def test_a_training_query_with_no_document_left_to_be_a_negative_is_refused_naming_it(beir):
    """q1 is relevant to d0 and d1, which are never its negatives: of 4 documents 2 are left. Needing 3 negatives, or
    with every document relevant, the pre-flight refuses it by name instead of the mining failing after BM25 and a
    corpus encoding (issue 41)."""
    from ance_core.data.checks import check_trainable

    ds = load_dataset(beir)
    check_trainable(ds, beir, "train", negatives=2)
    with pytest.raises(DataError, match=r"qrels/train.tsv: 1 'train' queries have fewer than 3 documents that are not "
                                        r"relevant to them, so no negative can be mined \(q1; 'q1': 2 of the "
                                        r"corpus's 4\): add documents"):
        check_trainable(ds, beir, "train", negatives=3)
    rows = "".join(f"q1\td{i}\t1\n" for i in range(4))  # every document relevant to q1
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    with pytest.raises(DataError, match=r"fewer than 1 documents .*'q1': 0 of the corpus's 4"):
        check_trainable(load_dataset(beir), beir, "train", negatives=1)
    check_trainable(load_dataset(beir), beir, "train", negatives=0)  # in-batch negatives need none from the corpus


def test_evaluation_queries_that_also_train_are_one_warning_naming_them(beir):
    from ance_core.data.checks import warn_shared_queries

    ds = load_dataset(beir)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_shared_queries(ds, "test", "train", "dev")  # distinct queries (and no dev split): silent
    rows = "query-id\tcorpus-id\tscore\nq1\td0\t1\nq2\td2\t1\n"  # q1 is a training query too
    (beir / "qrels" / "test.tsv").write_text(rows)
    with pytest.warns(AnceWarning) as caught:
        warn_shared_queries(load_dataset(beir), "test", "train", None)
    assert [str(w.message) for w in caught] == [
        "1 of the 2 'test' queries are also 'train' queries (q1): the run trains or chooses on them, so its 'test' "
        "figures are inflated; use splits with distinct queries"]


def test_the_data_stage_writes_the_corpus_as_it_reads_it_and_checks_it_the_same(tmp_path, monkeypatch):
    """`load_dataset(corpus_to=...)` (the data stage's): the corpus goes to parquet a chunk at a time and only its ids
    stay in memory; the stored tables are those of the in-memory load, in both layouts, and a duplicate id in a later
    chunk or a corpus without any text is still refused, naming the file and line."""
    from ance_core.data import dataset

    monkeypatch.setattr(dataset, "CORPUS_CHUNK", 3)
    docs = [{"_id": f"d{i}", "title": "" if i % 2 else f"t{i}", "text": f"passage {i}"} for i in range(11)]
    beir = write_beir(tmp_path / "beir", docs, [{"_id": "q1", "text": "passage"}],
                      {"train": [("q1", "d1", 1)], "test": [("q1", "d9", 1)]})
    msmarco = tmp_path / "msmarco"
    msmarco.mkdir()
    (msmarco / "collection.tsv").write_text("".join(f"{d['_id']}\t{d['title']}\t{d['text']}\n" for d in docs))
    (msmarco / "queries.train.tsv").write_text("q1\tpassage\n")
    (msmarco / "qrels.train.tsv").write_text("q1\t0\td3\t1\n")
    for folder in (beir, msmarco):
        whole = load_dataset(folder)
        out = tmp_path / f"{folder.name}-tables"
        out.mkdir()
        streamed = load_dataset(folder, corpus_to=out / "corpus.parquet")
        assert list(streamed.corpus.columns) == ["doc_id"] and streamed.corpus["doc_id"].tolist() == [
            f"d{i}" for i in range(11)]
        save_tables(streamed, out, corpus_written=True)
        read = read_tables(out)
        pd.testing.assert_frame_equal(read.corpus, whole.corpus)
        pd.testing.assert_frame_equal(read.qrels, whole.qrels)
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in [*docs, docs[1] | {"text": "other"}]))
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 1 line repeats .*: 'd1' \(lines 2 and 12\)"):
        again = load_dataset(beir, corpus_to=tmp_path / "again.parquet")
    assert again.corpus["doc_id"].tolist() == [f"d{i}" for i in range(11)]  # (the first d1 kept, in a later chunk)
    assert pd.read_parquet(tmp_path / "again.parquet").set_index("doc_id")["text"]["d1"] == "passage 1"
    (beir / "corpus.jsonl").write_text("".join(json.dumps(d | {"title": "", "text": " "}) + "\n" for d in docs))
    with pytest.raises(DataError, match="all 11 documents have an empty title and text"):
        load_dataset(beir, corpus_to=tmp_path / "empty.parquet")


def test_a_corpus_alone_loads_in_either_layout_without_queries_or_qrels(tmp_path):
    from ance_core.data.dataset import load_corpus

    (tmp_path / "beir").mkdir()
    (tmp_path / "beir" / "corpus.jsonl").write_text('{"_id": "d1", "title": "T", "text": "one"}\n'
                                                    '{"_id": "d2", "text": "two"}\n')
    (tmp_path / "msmarco").mkdir()
    (tmp_path / "msmarco" / "collection.tsv").write_text("7\tseven\n8\teight\n")
    beir, msmarco = load_corpus(tmp_path / "beir"), load_corpus(tmp_path / "msmarco")
    assert beir.to_dict("records") == [{"doc_id": "d1", "title": "T", "text": "one"},
                                       {"doc_id": "d2", "title": "", "text": "two"}]
    assert msmarco["doc_id"].tolist() == ["7", "8"] and msmarco["text"].tolist() == ["seven", "eight"]
    with pytest.raises(AnceError, match="neither a BEIR folder"):
        load_corpus(tmp_path)
    # written as it is read (`ance search --hybrid`'s corpus stage): the ids come back, the text is in the file
    ids = load_corpus(tmp_path / "msmarco", corpus_to=tmp_path / "c.parquet")
    assert ids.columns.tolist() == ["doc_id"] and pd.read_parquet(tmp_path / "c.parquet").equals(msmarco)


def test_a_folder_has_labels_only_with_queries_and_qrels_for_them(tmp_path):
    """Else it is a corpus to search (`ance search --hybrid` then indexes the corpus alone)."""
    from ance_core.data.layout import has_labels

    beir, msmarco = tmp_path / "beir", tmp_path / "msmarco"
    (beir / "qrels").mkdir(parents=True)
    msmarco.mkdir()
    (beir / "corpus.jsonl").write_text('{"_id": "d1", "text": "one"}\n')
    (msmarco / "collection.tsv").write_text("7\tseven\n")
    assert not has_labels(beir) and not has_labels(msmarco)
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "q"}\n')
    assert not has_labels(beir)  # queries, no qrels
    (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    assert has_labels(beir)
    (msmarco / "qrels.dev.tsv").write_text("1\t0\t7\t1\n")
    assert not has_labels(msmarco)  # qrels whose queries.dev.tsv is missing
    (msmarco / "queries.dev.tsv").write_text("1\tq\n")
    assert has_labels(msmarco)


def test_a_file_whose_first_hundred_lines_cannot_be_read_stops_at_once_and_a_warning_names_the_first_three(beir):
    """A file in the wrong format (a CSV saved as corpus.jsonl) stops after its first 100 lines, not after millions;
    one more than half of whose lines cannot be read is refused too (what is left is not the collection); a few bad
    lines among many are left out, the warning naming the first three and how many more."""
    _corrupt(beir, "corpus.jsonl", ["d,text"] * 100 + [_doc(0)])
    with pytest.raises(DataError, match="corpus.jsonl:1: malformed JSON"):
        load_dataset(beir)
    _corrupt(beir, "corpus.jsonl", [_doc(0), *["d,text"] * 4, _doc(1), _doc(2)])
    with pytest.raises(DataError, match=r"corpus.jsonl:2: 4 of its 7 rows cannot be read, more than half \(the wrong "
                       r"file or format\?\); the first, line 2: malformed JSON"):
        load_dataset(beir)
    docs = [json.dumps({"_id": f"d{i}", "text": f"text {i}"}) for i in range(4, 100)]
    _corrupt(beir, "corpus.jsonl", ["d,text"] * 5 + [_doc(0), _doc(1), _doc(2), _doc(3), *docs])
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 5 of its 105 rows cannot be read and are left out: line 1: "
                      r"malformed JSON: .*; line 2: .*; line 3: .* and 2 more$"):
        assert len(load_dataset(beir).corpus) == 100


def test_json_that_python_cannot_hold_is_a_row_left_out(beir):
    """An integer _id of 5,000 digits and arrays nested 100,000 deep are malformed rows, not a traceback."""
    _corrupt(beir, "corpus.jsonl", [*(_doc(i) for i in range(4)), '{"_id": ' + "9" * 5000 + ', "text": "x"}',
                                    '{"_id": "d9", "text": "x", "deep": ' + "[" * 100_000 + "]" * 100_000 + "}"])
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 2 of its 6 rows .* line 5: malformed JSON: ValueError: .*; "
                      "line 6: malformed JSON: RecursionError"):
        assert len(load_dataset(beir).corpus) == 4


def test_a_qrels_header_after_a_line_left_out_is_still_the_header(beir):
    _corrupt(beir, "qrels/train.tsv", ["q1", "query-id\tcorpus-id\tscore", "q1\td0\t1", "q1\td1\t1"])
    with pytest.warns(AnceWarning, match=r"train.tsv: 1 of its 3 rows cannot be read and is left out: line 1: "):
        assert load_dataset(beir).split_qrels("train")["doc_id"].tolist() == ["d0", "d1"]
