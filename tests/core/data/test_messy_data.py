"""Collections as users bring them: JSON written by JavaScript or pandas, files saved by Windows tools or joined by
`cat`, ids with stray spaces, MS MARCO-style splits numbered each from 1. Each loads as meant, or is refused naming
the file and what to change; a bad row is left out with a warning, never a traceback."""

import json
import warnings

import pandas as pd
import pytest

from ance_core.data.dataset import load_dataset, save_tables
from ance_core.errors import AnceError, AnceWarning, DataError
from tests.tiny import write_beir

CORPUS = [{"_id": "d1", "title": "t1", "text": "apple pie"}, {"_id": "d2", "title": "t2", "text": "cherry tart"}]
QUERIES = [{"_id": "q1", "text": "apple"}, {"_id": "q2", "text": "cherry"}]
QRELS = {"train": [("q1", "d1", 1)], "test": [("q2", "d2", 1)]}


def _lines(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_half_a_surrogate_pair_is_read_as_a_replacement_character_with_one_warning(tmp_path):
    """`\\ud83d` alone (an emoji cut in two by JavaScript) is valid JSON but not text: it used to crash the load when
    the table was built (UnicodeEncodeError, a traceback)."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "corpus.jsonl").write_text((folder / "corpus.jsonl").read_text()
                                         + '{"_id": "d3", "title": "t", "text": "bad \\ud83d end"}\n')
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "apple \\udc00"}\n{"_id": "q2", "text": "cherry"}\n')
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 1 lines hold half of a UTF-16 surrogate pair .*lines 3"):
        ds = load_dataset(folder)
    assert ds.corpus.set_index("doc_id").loc["d3", "text"] == "bad \ufffd end"
    assert ds.queries.set_index("query_id").loc["q1", "text"] == "apple \ufffd"
    (tmp_path / "tables").mkdir()
    save_tables(ds, tmp_path / "tables")  # (parquet took no surrogates either)


def test_ids_and_titles_as_pandas_and_spreadsheets_write_them(tmp_path):
    """A title NaN (pandas' `to_json` of a missing value) is no title, not the word 'nan'; an id 1.0 is the id qrels
    call 1; ids are trimmed in every file as they are in qrels; an id that is a list is a bad row, left out."""
    folder = tmp_path / "ds"
    write_beir(folder, CORPUS, QUERIES, {"train": [("q1", "1", 1), ("q1", "d1", 1)], "test": [("q2", "d2", 1)]})
    (folder / "corpus.jsonl").write_text('{"_id": "d1 ", "title": NaN, "text": "apple pie"}\n'
                                         '{"_id": " d2", "title": "t2", "text": "cherry tart"}\n'
                                         '{"_id": 1.0, "title": "t", "text": "one"}\n'
                                         '{"_id": ["x"], "title": "t", "text": "list"}\n')
    (folder / "queries.jsonl").write_text('{"_id": "q1\\t", "text": "apple"}\n{"_id": "q2", "text": "cherry"}\n')
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 1 of its 4 rows cannot be read .*line 4: '_id' must be a "
                      r"string or an integer"):
        ds = load_dataset(folder)
    corpus = ds.corpus.set_index("doc_id")
    assert sorted(corpus.index) == ["1", "d1", "d2"] and corpus.loc["d1", "title"] == ""
    assert sorted(ds.qrels["doc_id"]) == ["1", "d1", "d2"] and sorted(ds.queries["query_id"]) == ["q1", "q2"]


def test_a_grade_too_large_to_store_is_a_bad_row(tmp_path):
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t1e20\n")
    with pytest.warns(AnceWarning, match=r"train.tsv: 1 of its 2 rows .*line 3: relevance '1e20' is out of range"):
        ds = load_dataset(folder)
    (tmp_path / "tables").mkdir()
    save_tables(ds, tmp_path / "tables")  # (it was an OverflowError here)
    assert ds.qrels[ds.qrels["split"] == "train"]["doc_id"].tolist() == ["d1"]


@pytest.mark.parametrize("encoding,mark", [("utf-16", ""), ("utf-16-be", "be"), ("utf-16-le", None),
                                           ("utf-16-be", None)])
def test_files_saved_as_utf16_load_as_their_utf8_twins(tmp_path, encoding, mark):
    """Windows PowerShell 5.1's `>` writes UTF-16 with a byte-order mark: it used to be read as UTF-8 (a NUL between
    characters) and refused as malformed JSON or a grade that is not a number. `iconv -t utf-16le` writes none
    (`mark` None): told by the NUL byte beside each character."""
    clean = load_dataset(write_beir(tmp_path / "clean", CORPUS, QUERIES, QRELS))
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/train.tsv"):
        text = (folder / name).read_text().replace("\n", "\r\n")
        (folder / name).write_bytes((b"\xfe\xff" if mark == "be" else b"") + text.encode(encoding))
    ds = load_dataset(folder)
    for table in ("corpus", "queries", "qrels"):
        pd.testing.assert_frame_equal(getattr(ds, table), getattr(clean, table))


def test_files_joined_by_cat_keep_every_id(tmp_path):
    """A byte-order mark at the start of the second of two files `cat` joined is not part of its first id."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    rows = [json.dumps(r) for r in CORPUS]
    (folder / "corpus.jsonl").write_bytes(("\ufeff" + rows[0] + "\r\n" + "\ufeff" + rows[1] + "\r\n").encode())
    assert sorted(load_dataset(folder).corpus["doc_id"]) == ["d1", "d2"]


def _marco(tmp_path, train_queries: str, test_queries: str):
    folder = tmp_path / "marco"
    folder.mkdir()
    (folder / "collection.tsv").write_text("d1\tapple pie\nd2 \tcherry tart\n")
    (folder / "queries.train.tsv").write_text(train_queries)
    (folder / "qrels.train.tsv").write_text("1\t0\td1\t1\n")
    (folder / "queries.test.tsv").write_text(test_queries)
    (folder / "qrels.test.tsv").write_text("2\t0\td2\t1\n")
    return folder


def test_msmarco_queries_with_a_trailing_tab_or_a_tab_in_their_text_load(tmp_path):
    """`1\\tapple recipe\\t` (a trailing tab, as spreadsheet exports write) was a bad row, and with most lines so the
    file was refused; the text is everything after the id's tab. Ids are trimmed (the collection's 'd2 ')."""
    ds = load_dataset(_marco(tmp_path, "1\tapple recipe\t\n", "2\tcherry\tdessert\n"))
    assert dict(zip(ds.queries["query_id"], ds.queries["text"], strict=True)) == {"1": "apple recipe",
                                                                                  "2": "cherry\tdessert"}
    assert sorted(ds.qrels["doc_id"]) == ["d1", "d2"]


def test_msmarco_splits_that_give_one_query_id_two_texts_are_refused(tmp_path):
    """Splits numbered each from 1: train's qrels would be read against test's text, silently (the shared-queries
    warning then blamed the splits for overlapping). The same query in two splits' files is fine."""
    folder = _marco(tmp_path, "1\tapple recipe\n2\tcherry\n", "2\tcherry\n")
    assert sorted(load_dataset(folder).queries["query_id"]) == ["1", "2"]
    (folder / "queries.test.tsv").write_text("1\tcherry dessert\n2\tcherry\n")
    (folder / "queries.train.tsv").write_text("1\tapple recipe\n")  # (splits are read in name order: test first)
    with pytest.raises(DataError, match=r"queries.train.tsv: 1 query id\(s\) already name another query in an "
                       r"earlier split's queries file: '1' \('cherry dessert' in queries.test.tsv:1, 'apple recipe' in "
                       r"queries.train.tsv:1\); an id must name one query"):
        load_dataset(folder)


def test_a_trec_header_line_is_named_as_a_header(tmp_path):
    """Naming TREC's columns in TREC's order, it is skipped with a warning (its rows read as they are); in another
    order, the load stops there (the ids would be read swapped)."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "qrels" / "train.tsv").write_text("qid iter docno rel\nq1 0 d1 1\n")
    with pytest.warns(AnceWarning, match="read as a header line .* skipped"):
        assert load_dataset(folder).split_qrels("train")["doc_id"].tolist() == ["d1"]
    (folder / "qrels" / "train.tsv").write_text("docno iter qid rel\nd1 0 q1 1\n")
    with pytest.raises(DataError, match="remove the header line"):
        load_dataset(folder)


@pytest.mark.parametrize("header", ["corpus-id\tquery-id\tscore", "doc_id\tqid\trelevance"])
def test_a_qrels_header_naming_the_document_column_first_is_refused(tmp_path, header):
    """Found by a review: the columns are read as query-id, corpus-id, score whatever the header says, so a file
    written the other way round loaded with every pair's ids swapped, without a word."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "qrels" / "train.tsv").write_text(f"{header}\nd1\tq1\t1\n")
    with pytest.raises(DataError, match=r"train.tsv:1: its header \(.*\) names the document column before the query "
                                        "column: qrels are read as query-id, corpus-id, score; swap the two columns"):
        load_dataset(folder)
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")  # the usual header: read
    assert load_dataset(folder).qrels["doc_id"].tolist().count("d1") >= 1


def test_an_id_holding_a_line_break_is_a_bad_row(tmp_path):
    """An id with \\u2028 or \\x1c inside (trimming keeps them) would break every file that holds ids one per line."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "corpus.jsonl").write_text((folder / "corpus.jsonl").read_text()
                                         + '{"_id": "d3\\u2028x", "title": "t", "text": "three"}\n')
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 1 of its 3 rows .*line 3: id \"d3\\u2028x\" holds a line "
                      r"break"):
        assert sorted(load_dataset(folder).corpus["doc_id"]) == ["d1", "d2"]
    marco = _marco(tmp_path, "1\tapple\n", "2\tcherry\n")
    (marco / "collection.tsv").write_text("d1\tapple pie\nd2\tcherry tart\nd\x1c3\tthree\n")
    with pytest.warns(AnceWarning, match=r"collection.tsv: 1 of its 3 rows .*line 3: id .* holds a line break"):
        assert sorted(load_dataset(marco).corpus["doc_id"]) == ["d1", "d2"]


def test_an_id_holding_a_space_or_a_tab_is_a_bad_row(tmp_path):
    """A TREC run or qrels file separates its columns by whitespace: "d 3" would be written as two columns (a run
    read back loses the row). A query id is refused the same way."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "corpus.jsonl").write_text((folder / "corpus.jsonl").read_text()
                                         + '{"_id": "d 3", "title": "t", "text": "three"}\n'
                                         + '{"_id": "d\\t4", "title": "t", "text": "four"}\n')
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 2 of its 4 rows .*line 3: id \"d 3\" holds whitespace"):
        assert sorted(load_dataset(folder).corpus["doc_id"]) == ["d1", "d2"]
    folder = write_beir(tmp_path / "ds2", CORPUS, QUERIES, QRELS)
    (folder / "queries.jsonl").write_text((folder / "queries.jsonl").read_text() + '{"_id": "my q", "text": "x"}\n')
    with pytest.warns(AnceWarning, match=r"queries.jsonl: 1 of its .* rows .*id \"my q\" holds whitespace"):
        assert "my q" not in set(load_dataset(folder).queries["query_id"])


def test_a_qrels_id_in_another_unicode_normal_form_is_named_as_such(tmp_path):
    """'café' written precomposed (NFC) in the corpus and decomposed (NFD) in the qrels prints alike: the warning says
    why the judgement names no document."""
    corpus = [*CORPUS, {"_id": "caf\u00e9", "title": "", "text": "coffee"}]
    folder = write_beir(tmp_path / "ds", corpus, QUERIES, QRELS)
    with open(folder / "qrels" / "train.tsv", "a") as f:
        f.write("q1\tcafe\u0301\t1\n")
    with pytest.warns(AnceWarning, match=r"is 'café' there in Unicode NFC \(they print alike\): normalise the ids"):
        load_dataset(folder)


def test_a_document_without_text_is_kept_with_its_title(tmp_path):
    """Found by a review: `text` was required, so a document with a title and no text (missing, null, NaN) was left
    out with its qrels, and a corpus of titles alone was refused; BEIR's loader reads them with an empty text. One
    with neither is kept and named (nothing in it to rank by); a number is read as its digits."""
    corpus = [{"_id": "d1", "title": "apple pie"}, {"_id": "d2", "title": "cherry tart", "text": None},
              {"_id": "d3", "title": "", "text": 1001}, {"_id": "d4"}]
    folder = write_beir(tmp_path / "ds", corpus, QUERIES, QRELS)
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: 1 of 4 documents have an empty title and text \(kept; "
                                         r"nothing in them to rank by\): d4"):
        ds = load_dataset(folder)
    rows = ds.corpus.set_index("doc_id")[["title", "text"]].to_dict("index")
    assert rows == {"d1": {"title": "apple pie", "text": ""}, "d2": {"title": "cherry tart", "text": ""},
                    "d3": {"title": "", "text": "1001"}, "d4": {"title": "", "text": ""}}
    assert len(ds.qrels) == 2  # (d1's and d2's qrels kept)


@pytest.mark.parametrize("text", [json.dumps(CORPUS, indent=2), json.dumps(CORPUS)])
def test_a_corpus_written_as_a_json_array_is_named_as_such(tmp_path, text):
    """A .jsonl written by json.dump: its first line '[' read as 'malformed JSON: Expecting value (column 2)', no word
    of what the file should be."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "corpus.jsonl").write_text(text + "\n")
    with pytest.raises(DataError, match=r"one JSON object per line \(JSON Lines\), not a JSON array"):
        load_dataset(folder)


def test_a_folder_copied_from_a_mac_loads_without_its_appledouble_files(tmp_path):
    """macOS leaves `._<name>` beside each file it zips or copies to a drive: `qrels/._test.tsv` was read as a split
    `._test`, and its binary lines stopped the load. The dataset's digest skipped them already; `has_labels` and
    `split_files` read the same files as the load."""
    from ance_core.data.layout import has_labels, split_files

    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    for name in ("._test.tsv", "._train.tsv"):
        (folder / "qrels" / name).write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02" * 8)
    ds = load_dataset(folder)
    assert sorted(ds.qrels["split"].unique()) == ["test", "train"]
    assert sorted(split_files(folder)[0]) == ["test", "train"]
    for name in ("test.tsv", "train.tsv"):
        (folder / "qrels" / name).unlink()
    assert not has_labels(folder)


def test_msmarco_splits_none_of_which_has_a_qrels_line_is_one_clear_error(tmp_path):
    """It was a traceback (`ValueError: No objects to concatenate`) after the two splits' warnings."""
    folder = _marco(tmp_path, "1\tapple\n", "2\tcherry\n")
    (folder / "qrels.train.tsv").write_text("")
    (folder / "qrels.test.tsv").write_text("\n")
    with pytest.warns(AnceWarning, match="no qrels lines"), pytest.raises(
            DataError, match=r"no qrels lines in any of qrels.test.tsv, qrels.train.tsv"):
        load_dataset(folder)


def test_a_four_column_row_whose_second_column_is_no_trec_iteration_is_a_bad_row(tmp_path):
    """`q1<TAB>d1<TAB>1<TAB>5` (a count after the score) was read as TREC's `qid iteration docid relevance`: d1 the
    iteration, document '1', grade 5; the split was then refused for naming no document of the corpus."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "qrels" / "train.tsv").write_text("q1\td1\t1\t5\nq1 0 d1 1\nq1 Q0 d2 0\n")
    with pytest.warns(AnceWarning, match=r"train.tsv: 1 of its 3 rows .*line 1: 4 columns, but the second \('d1'\) "
                      r"is not TREC's iteration \(a number, or Q0\)"):
        ds = load_dataset(folder)
    assert sorted(ds.split_qrels("train")["doc_id"]) == ["d1", "d2"]


@pytest.mark.parametrize("name", ["label", "grade", "Judgment"])
def test_a_three_column_header_naming_the_grade_otherwise_is_a_header(tmp_path, name):
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "qrels" / "train.tsv").write_text(f"qid\tdocid\t{name}\nq1\td1\t1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error", AnceWarning)  # (it was a bad row: "relevance 'label' is not a number")
        assert load_dataset(folder).split_qrels("train")["doc_id"].tolist() == ["d1"]


def test_a_missing_file_or_field_says_what_is_there(tmp_path):
    """Qrels ids written as floats (`1.0`: pandas writes an integer column with gaps so) are named as such; a BEIR
    folder with queries.tsv is told its queries are queries.jsonl; a null text is null, not missing."""
    corpus = [{"_id": "1", "title": "", "text": "apple pie"}, {"_id": "2", "title": "", "text": "cherry tart"}]
    folder = write_beir(tmp_path / "ds", corpus, [{"_id": "1", "text": "apple"}, {"_id": "2", "text": None}],
                        {"train": [("1", "1.0", 1)], "test": [("1", "2.0", 1)]})
    with pytest.warns(AnceWarning, match=r"queries.jsonl: 1 of its 2 rows .*line 2: id '2': field 'text' is null"), \
            pytest.raises(DataError, match=r"'2.0' is '2' there: the qrels' ids were written as floats"):
        load_dataset(folder)
    (folder / "queries.jsonl").rename(folder / "queries.tsv")
    with pytest.raises(DataError, match=r"queries.jsonl: file not found; the folder holds queries.tsv: a BEIR "
                       "folder's queries are queries.jsonl"):
        load_dataset(folder)


def test_a_fourth_column_after_numeric_document_ids_is_refused_not_read_as_trec(tmp_path):
    """`q<TAB>4983<TAB>1<TAB>5` passes as TREC's `qid iteration docid relevance` row by row (4983 a number): read so,
    a collection with numeric document ids got document 1 at grade 5. A file whose "iteration" column holds more than
    a few values is refused; TREC-COVID's rounds (0.5 to 5) are not."""
    corpus = [{"_id": str(k), "title": "", "text": f"passage {k}"} for k in range(40)]
    queries = [{"_id": "q1", "text": "passage"}, {"_id": "q2", "text": "other"}]
    folder = write_beir(tmp_path / "ds", corpus, queries, {"train": [("q1", "1", 1)], "test": [("q2", "2", 1)]})
    (folder / "qrels" / "train.tsv").write_text("".join(f"q1\t{k}\t1\t5\n" for k in range(3, 30)))
    with pytest.raises(DataError, match=r"train.tsv: read as TREC's qrels .*its second column holds 27 different "
                       r"values .*remove that column"):
        load_dataset(folder)
    rounds = ["0.5", "1", "1.5", "2", "2.5", "3", "3.5", "4", "4.5", "5"]
    (folder / "qrels" / "train.tsv").write_text("".join(f"q1 {rounds[k % 10]} {k} 1\n" for k in range(3, 30)))
    assert len(load_dataset(folder).split_qrels("train")) == 27


@pytest.mark.parametrize("name", ["qrels/train.tsv", "collection.tsv", "queries.train.tsv"])
def test_a_tsv_file_with_pandas_row_numbers_is_refused(tmp_path, name):
    """`to_csv(sep="\\t")` writes row numbers first, their column unnamed: a BEIR qrels file was read as TREC's (the
    row number as the query id: every positive shifted), a collection's passage id as its title, each without a
    word."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS) if name.startswith("qrels") else \
        _marco(tmp_path, "1\tapple recipe\n", "2\tcherry\n")
    frames = {"qrels/train.tsv": pd.DataFrame([("q1", "d1", 1)], columns=["query-id", "corpus-id", "score"]),
              "collection.tsv": pd.DataFrame([("d1", "apple pie"), ("d2", "cherry tart")], columns=["id", "text"]),
              "queries.train.tsv": pd.DataFrame([("1", "apple recipe")], columns=["id", "text"])}
    frames[name].to_csv(folder / name, sep="\t")
    with pytest.raises(DataError, match=rf"{name}:1: its header \(\S+ \S+( score)?\) follows an unnamed first "
                       r"column: row numbers, as pandas' to_csv writes unless index=False"):
        load_dataset(folder)
    frames[name].to_csv(folder / name, sep="\t", index=False)
    load_dataset(folder)


def test_a_corpus_whose_text_field_has_another_name_is_refused_naming_it(tmp_path):
    """`body` for `text`: every document was read as its title alone, without a word. A corpus of titles alone (no
    other field) loads, said once."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    _lines(folder / "corpus.jsonl", [{"_id": d["_id"], "title": d["title"], "body": d["text"]} for d in CORPUS])
    with pytest.raises(DataError, match=r"corpus.jsonl: no line has a 'text' field; its lines have body besides _id "
                       "and title: rename the field that holds each row's text to 'text'"):
        load_dataset(folder)
    _lines(folder / "corpus.jsonl", [{"_id": d["_id"], "title": d["text"]} for d in CORPUS])
    with pytest.warns(AnceWarning, match=r"corpus.jsonl: no line has a 'text' field: every row is read as its title "
                      "alone"):
        assert load_dataset(folder).corpus["title"].tolist() == ["apple pie", "cherry tart"]


def test_a_query_text_that_is_a_number_is_read_as_its_digits_and_a_bad_row_names_its_id(tmp_path):
    folder = write_beir(tmp_path / "ds", CORPUS, [{"_id": "q1", "text": 1984}, {"_id": "q2", "text": ["cherry"]},
                                                  {"_id": "q3", "text": "tart"}],
                        {"train": [("q1", "d1", 1)], "test": [("q2", "d2", 1), ("q3", "d2", 1)]})
    with pytest.warns(AnceWarning, match=r"queries.jsonl: 1 of its 3 rows .*line 2: id 'q2': field 'text' must be a "
                      "string"):
        ds = load_dataset(folder)
    assert dict(zip(ds.queries["query_id"], ds.queries["text"], strict=True)) == {"q1": "1984", "q3": "tart"}


def test_bytes_that_are_not_utf16_in_a_utf16_file_are_said(tmp_path):
    """Read as U+FFFD as in a UTF-8 file, but without the warning a UTF-8 file gets."""
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    encoded = (folder / "corpus.jsonl").read_text().replace("pie", "p\u2603e").encode("utf-16-le")
    encoded = encoded.replace("\u2603".encode("utf-16-le"), b"\x00\xd8")  # half a surrogate pair
    (folder / "corpus.jsonl").write_bytes(b"\xff\xfe" + encoded)
    with pytest.warns(AnceWarning, match=r"corpus.jsonl:1: not valid UTF-16 \(near this line\): its invalid bytes "
                      "are read as U\\+FFFD"):
        ds = load_dataset(folder)
    assert ds.corpus["text"].tolist() == ["apple p\ufffde", "cherry tart"]


def test_files_of_a_near_name_or_still_packed_are_named(tmp_path):
    folder = write_beir(tmp_path / "ds", CORPUS, QUERIES, QRELS)
    (folder / "corpus.jsonl").rename(folder / "Corpus.jsonl")
    with pytest.raises(AnceError, match=r"neither a BEIR folder .*; it holds Corpus.jsonl: name it corpus.jsonl"):
        load_dataset(folder)
    (folder / "Corpus.jsonl").rename(folder / "corpus.jsonl")
    for path in (folder / "queries.jsonl", *(folder / "qrels").glob("*.tsv")):
        path.rename(path.with_name(path.name + ".gz"))
    with pytest.raises(DataError, match=r"queries.jsonl: file not found; the folder holds queries.jsonl.gz: unpack it"):
        load_dataset(folder)
    (folder / "queries.jsonl.gz").rename(folder / "queries.jsonl")
    with pytest.raises(DataError, match=r"qrels: no qrels/<split>.tsv files \(it holds test.tsv.gz, train.tsv.gz; "
                       r"unpack them \(e.g. gunzip\) in place\)"):
        load_dataset(folder)
