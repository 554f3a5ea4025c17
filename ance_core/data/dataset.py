"""Dataset loading (BEIR and MS MARCO layouts) with validation, resolution from a data home, parquet tables.

Tables (what every later stage reads):
  corpus.parquet   doc_id, title, text
  queries.parquet  query_id, text          (only queries that appear in some qrels split)
  qrels.parquet    query_id, doc_id, relevance, split

Files written on Windows load as they are: a UTF-8 byte-order mark and CRLF line endings are accepted in every file.
A query whose text is empty is dropped with one warning naming it (it can be neither trained on nor searched for).
"""

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ance_core.artifacts import digest_of
from ance_core.data.layout import beir_qrels, detect_format, msmarco_splits, split_files
from ance_core.data.lines import (
    LeftOut,
    claim_id,
    id_problem,
    jsonl_rows,
    read_jsonl,
    read_lines,
    read_tsv,
    refuse_index_column,
    warn_repeats,
)
from ance_core.data.qrels import check_qrels, read_qrels
from ance_core.errors import AnceError, DataError, damaged_stage, preview, warn
from ance_core.faults import fault_point

QUERY_TOP_GRADE = "query-top"  # a split's training positives: each query's documents of its own highest grade


@dataclass(frozen=True)
class Dataset:
    corpus: pd.DataFrame
    queries: pd.DataFrame
    qrels: pd.DataFrame
    # split -> the lowest grade that is a training positive, or QUERY_TOP_GRADE (data/splits.py with_training_grades)
    min_relevance: dict[str, int | str] = field(default_factory=dict)

    def split_qrels(self, split: str) -> pd.DataFrame:
        qrels = self.qrels[self.qrels["split"] == split]
        if qrels.empty:
            available = sorted(self.qrels["split"].unique())
            if not available:  # (every line left out: every query of empty text, say; not "available splits: ")
                raise AnceError(f"split '{split}' has no qrels: no qrels line of any split is left (the warnings above "
                                "say why each was left out)")
            raise AnceError(f"split '{split}' has no qrels (available splits: {', '.join(available)})")
        return qrels

    def split_queries(self, split: str) -> pd.DataFrame:
        ids = self.split_qrels(split)["query_id"].unique()
        return self.queries[self.queries["query_id"].isin(ids)].reset_index(drop=True)

    def positives(self, split: str) -> dict[str, set[str]]:
        """The training positives of each query of the split: relevance >= the split's `min_relevance` (1 unless
        set for graded qrels, `ance_core.data.splits.with_training_grades`), or with QUERY_TOP_GRADE, the documents
        of each query's own highest grade. Queries without one are left out."""
        rule = self.min_relevance.get(split, 1)
        if rule != QUERY_TOP_GRADE:
            return self._at_least(split, int(rule))
        rel = self.split_qrels(split)
        rel = rel[rel["relevance"] > 0]
        rel = rel[rel["relevance"] == rel.groupby("query_id")["relevance"].transform("max")]
        return {q: set(d) for q, d in rel.groupby("query_id")["doc_id"]}

    def relevant(self, split: str) -> dict[str, set[str]]:
        """Every labelled-relevant document of each query of the split (relevance > 0): never a negative."""
        return self._at_least(split, 1)

    def judged_nonrelevant(self, split: str) -> dict[str, set[str]]:
        """The documents each query of the split is judged non-relevant to (relevance <= 0: the judged-and-rejected
        rows of pooled qrels, TREC's); queries without such rows are left out."""
        rel = self.split_qrels(split)
        rel = rel[rel["relevance"] <= 0]
        return {q: set(d) for q, d in rel.groupby("query_id")["doc_id"]}

    def _at_least(self, split: str, grade: int) -> dict[str, set[str]]:
        rel = self.split_qrels(split)
        rel = rel[rel["relevance"] >= max(grade, 1)]
        return {q: set(d) for q, d in rel.groupby("query_id")["doc_id"]}


# ---------------------------------------------------------------- layouts


CORPUS_CHUNK = 100_000  # documents read into a table at a time (and written, when the corpus goes to a file)


def _collection_rows(path: Path, seen: dict[str, int]) -> Iterator[tuple[str, str, str]]:
    """(id, title, text) of each line of an MS MARCO collection.tsv, validated as it is read. Empty columns that end
    a line are dropped; a line of more than 3 columns after that holds tabs in its text: its columns after the id
    are the text, joined by spaces (said once, with the first such lines)."""
    repeats: list[str] = []
    left_out = LeftOut(path)
    tabbed: list[int] = []
    for number, line in read_lines(path):
        parts = line.split("\t")
        while len(parts) > 2 and not parts[-1].strip():  # (tabs ending the line: its text is the column before)
            parts.pop()
        doc_id = parts[0].strip()  # (ids trimmed, as qrels' are)
        if not left_out.read and not left_out.count:
            refuse_index_column(path, number, line.split("\t"))
        if not left_out.read and not left_out.count and _header(parts):
            warn(f"{path}:{number}: read as a header line ({' '.join(p.strip() for p in parts)}) and skipped: "
                 "MS MARCO's collection.tsv has none, its first line is a passage")
            continue
        problem = ("expected 2 (id, text) or 3 (id, title, text) columns, got 1" if len(parts) == 1
                   else id_problem(doc_id))
        if problem:
            left_out.add(DataError(path, problem, number))
            continue
        left_out.keep()
        if len(parts) > 3:
            tabbed.append(number)
            parts = [doc_id, " ".join(parts[1:])]
        if claim_id(seen, doc_id, number, repeats):
            yield doc_id, parts[1] if len(parts) == 3 else "", parts[-1]
    left_out.done()
    warn_repeats(path, repeats)
    if tabbed:
        warn(f"{path}: {len(tabbed)} lines have more than 3 tab-separated columns (tabs inside a passage's text), read "
             f"as the id and a text whose tabs are spaces: lines {preview(tabbed)}")


COLLECTION_ID_NAMES = {"id", "pid", "docid", "doc_id", "doc-id", "passage_id", "passageid", "corpus-id", "corpus_id",
                       "corpusid", "_id"}
COLLECTION_TEXT_NAMES = {"text", "passage", "passage_text", "body", "contents", "content", "document"}


def _header(parts: list[str]) -> bool:
    """Whether a collection.tsv line names its columns (an id column's name, then a text column's) instead of
    holding a passage."""
    return parts[0].strip().lower() in COLLECTION_ID_NAMES and parts[-1].strip().lower() in COLLECTION_TEXT_NAMES


def _read_corpus(path: Path, rows: Iterator[tuple[str, str, str]], out: Path | None) -> pd.DataFrame:
    """The corpus (doc_id, title, text), CORPUS_CHUNK documents at a time. With `out`, each chunk is written there
    as parquet (row groups of CORPUS_ROW_GROUP) as soon as it is read, and only the doc ids are kept: memory holds
    one chunk's text, not the corpus's (8.8M MS MARCO passages are ~3 GB of text). An empty corpus, and one whose
    every title and text is empty (nothing to index: BM25 cannot even build its vocabulary), are refused."""
    frames, writer, n, empty, first_empty = [], None, 0, 0, []
    try:
        while chunk := list(itertools.islice(rows, CORPUS_CHUNK)):
            frame = pd.DataFrame(chunk, columns=["doc_id", "title", "text"])
            n += len(frame)
            ids = frame.loc[(frame["text"].str.strip() == "") & (frame["title"].str.strip() == ""), "doc_id"]
            empty, first_empty = empty + len(ids), first_empty + ids.head(5 - len(first_empty)).tolist()
            if out is None:
                frames.append(frame)
                continue
            table = pa.Table.from_pandas(frame, preserve_index=False)
            writer = writer or pq.ParquetWriter(out, table.schema)
            writer.write_table(table, row_group_size=CORPUS_ROW_GROUP)
            frames.append(frame[["doc_id"]])
    finally:
        if writer is not None:
            writer.close()
    if not n:
        raise DataError(path, "empty corpus")
    if empty == n:
        raise DataError(path, f"all {n} documents have an empty title and text: nothing to index")
    if empty:  # kept (a qrels row may name one), but a model ranks its empty text anywhere: said
        more = f" and {empty - len(first_empty)} more" if empty > len(first_empty) else ""
        warn(f"{path}: {empty} of {n} documents have an empty title and text (kept; nothing in them to rank by): "
             f"{', '.join(first_empty)}{more}")
    return pd.concat(frames, ignore_index=True)


def _beir_rows(path: Path, seen: dict[str, int]) -> Iterator[tuple[str, str, str]]:
    # a missing or null text is empty, as a missing title is (BEIR's loader reads both so): a title-only document is
    # kept, and one with neither is said (`_read_corpus`)
    return ((d, title, text) for d, text, title in jsonl_rows(path, (), ("text", "title"), seen, expected="text"))


def _beir_corpus(folder: Path, seen: dict[str, int], corpus_to: Path | None = None) -> pd.DataFrame:
    return _read_corpus(folder / "corpus.jsonl", _beir_rows(folder / "corpus.jsonl", seen), corpus_to)


def corpus_rows(folder: str | Path, fmt: str = "auto") -> tuple[Path, Iterator[tuple[str, str, str]]]:
    """A corpus folder's file and its (doc_id, title, text) rows, validated as they are read, one at a time."""
    folder = Path(folder)
    if (detect_format(folder) if fmt == "auto" else fmt) == "beir":
        return folder / "corpus.jsonl", _beir_rows(folder / "corpus.jsonl", {})
    return folder / "collection.tsv", _collection_rows(folder / "collection.tsv", {})


def load_corpus(folder: str | Path, fmt: str = "auto", corpus_to: Path | None = None) -> pd.DataFrame:
    """The corpus alone (doc_id, title, text), validated as `load_dataset` validates it: for a folder that holds a
    corpus to search and no queries or qrels (`ance search --dataset`). With `corpus_to`, written there as it is read
    and only the doc ids returned (`_read_corpus`)."""
    return _read_corpus(*corpus_rows(folder, fmt), corpus_to)


def _load_beir(folder: Path, corpus_to: Path | None) -> Dataset:
    seen: dict[str, int] = {}
    corpus = _beir_corpus(folder, seen, corpus_to)
    queries_file = folder / "queries.jsonl"
    if not queries_file.exists() and (near := sorted(p.name for p in folder.glob("queries*") if p.is_file())):
        unpack = "unpack it (e.g. gunzip) in place: " if near == ["queries.jsonl.gz"] else ""
        raise DataError(queries_file, f"file not found; the folder holds {', '.join(near)}: {unpack}a BEIR folder's "
                        'queries are queries.jsonl, one JSON object {"_id": ..., "text": ...} per line')
    queries = read_jsonl(queries_file, ("text",)).rename(columns={"id": "query_id"})
    if queries.empty:
        raise DataError(queries_file, "no queries: the file is empty (a query is a line "
                        '{"_id": ..., "text": ...})')
    qrels_dir = folder / "qrels"
    files = beir_qrels(qrels_dir)
    if not files:
        near = sorted(p.name for p in qrels_dir.glob("*") if not p.name.startswith(".")) if qrels_dir.is_dir() else []
        unpack = "; unpack them (e.g. gunzip) in place" if near and near[0].endswith(".gz") else ""
        raise DataError(qrels_dir, "no qrels/<split>.tsv files" + (f" (it holds {', '.join(near[:5])}{unpack})"
                                                                   if near else ""))
    query_ids = set(queries["query_id"])
    frames = []
    for path in files:
        if (rows := _usable_qrels(path, path.stem, query_ids, seen)) is not None:
            frames.append(_qrels_frame(rows, path.stem))
    return _finish(corpus, queries, _all_splits(frames, files), queries_file, {p.stem: p for p in files})


def _usable_qrels(path: Path, split: str, query_ids: set, doc_ids: dict[str, int]
                  ) -> list[tuple[int, str, str, int]] | None:
    """A split's usable qrels rows (`check_qrels`), or None, with a warning, for a file with no qrels lines (a header
    alone, or nothing): that split is left out and the others load (a run that asks for it is told it is missing). A
    file whose lines cannot be used is an error: the wrong file, or the wrong corpus."""
    rows = read_qrels(path)
    if not rows:
        warn(f"{path}: no qrels lines: split '{split}' is left out")
        return None
    return check_qrels(path, rows, query_ids, doc_ids, split)


def _qrels_frame(rows: list[tuple[int, str, str, int]], split: str) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["line", "query_id", "doc_id", "relevance"]).assign(split=split)


def _all_splits(frames: list[pd.DataFrame], files: list[Path]) -> pd.DataFrame:
    if not frames:
        raise DataError(files[0].parent, f"no qrels lines in any of {', '.join(f.name for f in files)}")
    return pd.concat(frames, ignore_index=True)


def _load_msmarco(folder: Path, corpus_to: Path | None) -> Dataset:
    path = folder / "collection.tsv"
    seen: dict[str, int] = {}
    corpus = _read_corpus(path, _collection_rows(path, seen), corpus_to)
    query_frames, qrel_frames = [], []
    splits = msmarco_splits(folder)
    if not splits:
        raise DataError(folder, "no qrels.<split>.tsv files")
    texts: dict[str, tuple[str, str]] = {}  # query id -> (its text, where it was first read): one query per id
    for split, qpath, queries_path in splits:
        first: dict[str, int] = {}
        repeats: list[str] = []
        qs = [(parts[0], parts[1], number) for number, parts in read_tsv(queries_path, 2, "id, text")
              if claim_id(first, parts[0], number, repeats)]
        if not qs:
            raise DataError(queries_path, "no queries: the file is empty (a query is a line 'id<TAB>text')")
        warn_repeats(queries_path, repeats)
        clashes = [f"'{q}' ('{texts[q][0][:40]}' in {texts[q][1]}, '{text[:40]}' in {queries_path.name}:{number})"
                   for q, text, number in qs if q in texts and texts[q][0] != text]
        if clashes:  # each split numbered from 1: the other split's qrels would be read against this split's text
            raise DataError(queries_path, f"{len(clashes)} query id(s) already name another query in an "
                            f"earlier split's queries file: {preview(clashes)}; an id must name one query across the "
                            "collection's splits: give one split's queries other ids (in its queries and qrels files)")
        texts |= {q: (text, f"{queries_path.name}:{number}") for q, text, number in qs if q not in texts}
        if (rows := _usable_qrels(qpath, split, set(first), seen)) is not None:
            query_frames.append(pd.DataFrame([q[:2] for q in qs], columns=["query_id", "text"]))
            qrel_frames.append(_qrels_frame(rows, split))
    qrels = _all_splits(qrel_frames, [s[1] for s in splits])  # (no split with qrels lines: one clear line)
    queries = pd.concat(query_frames, ignore_index=True).drop_duplicates("query_id")
    return _finish(corpus, queries, qrels, folder / "queries.<split>.tsv", {split: q for split, q, _ in splits})


def _finish(corpus: pd.DataFrame, queries: pd.DataFrame, qrels: pd.DataFrame, queries_file: Path,
            qrels_files: dict[str, Path]) -> Dataset:
    """The dataset of the rows read, checked across files (`qrels` holds each row's `line` in its split's file)."""
    used = set(qrels["query_id"])
    queries = queries[queries["query_id"].isin(used)].reset_index(drop=True)
    empty = queries["text"].str.strip() == ""
    if empty.any():
        ids = queries.loc[empty, "query_id"].tolist()
        warn(f"{queries_file}: {len(ids)} queries with empty text are left out of every split (nothing to train on "
             f"or search for): {preview(ids)}")
        queries = queries[~empty].reset_index(drop=True)
        kept = qrels[~qrels["query_id"].isin(ids)]
        for split in sorted(set(qrels["split"]) - set(kept["split"])):  # (else said as a split with no qrels file)
            warn(f"{qrels_files[split]}: every query split '{split}' judges has empty text in {queries_file.name}: "
                 "the split is left out")
        qrels = kept
    pairs = ["query_id", "doc_id", "split"]
    grades = qrels[qrels.duplicated(pairs, keep=False)].groupby(pairs)[["relevance", "line"]].agg(list)  # in order
    if len(conflicts := grades[grades["relevance"].map(lambda g: len(set(g)) > 1)]):  # two grades: the last stands
        warn(f"{len(conflicts)} (query, document) pairs are judged twice with different grades in the qrels; the "
             "later line's grade is kept: " + preview(
                 f"{q} / {d} in {split} ({qrels_files[split].name} lines {', '.join(map(str, row['line']))}: "
                 f"{', then '.join(map(str, row['relevance']))})" for (q, d, split), row in conflicts.iterrows()))
    qrels = qrels.drop_duplicates(pairs, keep="last").drop(columns="line").reset_index(drop=True)
    return Dataset(corpus.reset_index(drop=True), queries, qrels)


def qrels_file(folder: Path, split: str, fmt: str = "auto") -> Path:
    """Where a split's qrels are read from (BEIR: qrels/<split>.tsv; MS MARCO: qrels.<split>.tsv), by the folder's
    layout as the loader reads it (`split_files`)."""
    return split_files(folder, fmt)[1](split)


def positive_grades(folder: Path, split: str, fmt: str = "auto") -> set[int]:
    """The positive relevance grades of a dataset folder's qrels of `split` (none when it has no such file)."""
    path = qrels_file(folder, split, fmt)
    return {grade for _, _, _, grade in read_qrels(path) if grade > 0} if path.is_file() else set()


def load_dataset(folder: str | Path, fmt: str = "auto", corpus_to: Path | None = None) -> Dataset:
    """The collection, validated. With `corpus_to`, the corpus is written there as parquet while it is read (the data
    stage's corpus.parquet) and the dataset's corpus holds only its doc ids (`save_tables(..., corpus_written=True)`
    then writes the rest)."""
    folder = Path(folder)
    fmt = detect_format(folder) if fmt == "auto" else fmt
    return (_load_beir if fmt == "beir" else _load_msmarco)(folder, corpus_to)


# ---------------------------------------------------------------- parquet tables


TRAINING_GRADES = "training_grades.json"
CORPUS_ROW_GROUP = 10_000  # a corpus shard task reads only the row groups of its documents (tasks/encode.read_rows)


def save_tables(dataset: Dataset, out: Path, corpus_written: bool = False) -> dict[str, int]:
    if not corpus_written:  # (else load_dataset wrote it while reading: `corpus_to`)
        dataset.corpus.to_parquet(out / "corpus.parquet", index=False, row_group_size=CORPUS_ROW_GROUP)
    fault_point("prepare-data", 1)  # the corpus written, the queries and qrels not yet
    dataset.queries.to_parquet(out / "queries.parquet", index=False)
    dataset.qrels.to_parquet(out / "qrels.parquet", index=False)
    (out / TRAINING_GRADES).write_text(json.dumps(dataset.min_relevance))
    return {
        "documents": len(dataset.corpus),
        "queries": len(dataset.queries),
        "splits": sorted(dataset.qrels["split"].unique()),
        # what a dev score was measured on: the champion is compared only with scores on the same queries and labels
        "split_digests": {split: digest_of(sorted(rows[["query_id", "doc_id", "relevance"]].values.tolist()))
                          for split, rows in dataset.qrels.groupby("split")},
        **{f"qrels_{s}": int(n) for s, n in dataset.qrels["split"].value_counts().items()},
    }


def read_tables(folder: str | Path, corpus_columns: list[str] | None = None) -> Dataset:
    """The stored tables; `corpus_columns` reads only those of the corpus (["doc_id"]: not its text; []: none of it,
    for a stage that reads passages by row: data/corpus.py)."""
    folder, grades = Path(folder), Path(folder) / TRAINING_GRADES
    with damaged_stage(folder):
        return Dataset(corpus=pd.read_parquet(folder / "corpus.parquet", columns=corpus_columns),
                       queries=pd.read_parquet(folder / "queries.parquet"),
                       qrels=pd.read_parquet(folder / "qrels.parquet"),
                       min_relevance=json.loads(grades.read_text()) if grades.is_file() else {})


def passage_texts(corpus: pd.DataFrame) -> list[str]:
    """Title and text joined, as both BM25 and the encoder see a passage."""
    titles = corpus["title"].fillna("").astype(str)
    texts = corpus["text"].astype(str)
    return [f"{t} {x}".strip() if t else x for t, x in zip(titles, texts, strict=True)]

