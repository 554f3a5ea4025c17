"""Dataset loading (BEIR and MS MARCO layouts) with validation, resolution from a data home, parquet tables.

Tables (what every later stage reads):
  corpus.parquet   doc_id, title, text
  queries.parquet  query_id, text          (only queries that appear in some qrels split)
  qrels.parquet    query_id, doc_id, relevance, split

Files written on Windows load as they are: a UTF-8 byte-order mark and CRLF line endings are accepted in every file.
A query whose text is empty is dropped with one warning naming it (it can be neither trained on nor searched for).
"""

import gzip
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ance_core.artifacts import digest_of
from ance_core.errors import AnceError, DataError, preview, warn
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

    def _at_least(self, split: str, grade: int) -> dict[str, set[str]]:
        rel = self.split_qrels(split)
        rel = rel[rel["relevance"] >= max(grade, 1)]
        return {q: set(d) for q, d in rel.groupby("query_id")["doc_id"]}


# ---------------------------------------------------------------- layout (where a dataset comes from: data/sources.py)


def detect_format(folder: Path) -> str:
    if (folder / "corpus.jsonl").is_file():
        return "beir"
    if (folder / "collection.tsv").is_file():
        return "msmarco"
    raise AnceError(f"{folder}: neither a BEIR folder (corpus.jsonl) nor MS MARCO (collection.tsv)")


# ---------------------------------------------------------------- line readers


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) for non-blank lines. Bytes that are not UTF-8 are read as U+FFFD, with one
    warning per file naming the first such line (one bad row does not stop a load). A byte-order mark at the start of
    the file and CRLF line endings (Windows tools write both) are dropped. A `.gz` file is read decompressed (an
    evaluation's TREC run as MLflow keeps it)."""
    if not path.is_file():
        raise DataError(path, "file not found")
    warned = False
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
        for number, raw in _numbered(f, path):
            encoding = "utf-8-sig" if number == 1 else "utf-8"
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as e:
                line = raw.decode(encoding, errors="replace")
                if not warned:
                    warn(f"{path}:{number}: not valid UTF-8 (byte {e.start} of the line): its invalid bytes are read "
                         "as U+FFFD, and so are any later line's")
                    warned = True
            line = line.rstrip("\r\n")
            if line.strip():
                yield number, line


def _numbered(f, path: Path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw line); a gzip file that cannot be read is an error naming it."""
    try:
        yield from enumerate(f, start=1)
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(path, f"not a readable gzip file ({e})") from None


def _claim_id(seen: dict[str, int], item_id: str, number: int, repeats: list[str]) -> bool:
    """Record the line an id first appears on (True); a later line with the same id is left out (False), noted in
    `repeats` for `_warn_repeats`."""
    if item_id in seen:
        repeats.append(f"'{item_id}' (lines {seen[item_id]} and {number})")
        return False
    seen[item_id] = number
    return True


def _warn_repeats(path: Path, repeats: list[str]) -> None:
    if repeats:
        warn(f"{path}: {len(repeats)} lines repeat the id of an earlier line and are left out (the first line of an "
             f"id is kept): {preview(repeats)}")


def _jsonl_rows(path: Path, fields: tuple[str, ...], optional: tuple[str, ...], seen: dict[str, int]
                ) -> Iterator[tuple[str, ...]]:
    """(id, *fields, *optional) of each line, validated as it is read; `seen` collects the ids (and their lines)."""
    repeats: list[str] = []
    for number, line in read_lines(path):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(path, f"malformed JSON: {e.msg} (column {e.colno})", number) from None
        if not isinstance(obj, dict):
            raise DataError(path, f"expected a JSON object, got {type(obj).__name__}", number)
        for name in ("_id", *fields):
            if name not in obj or obj[name] is None:
                raise DataError(path, f"missing field '{name}'", number)
            if name != "_id" and not isinstance(obj[name], str):
                raise DataError(path, f"field '{name}' must be a string", number)
        doc_id = str(obj["_id"])
        if not doc_id:
            raise DataError(path, "empty '_id'", number)
        if _claim_id(seen, doc_id, number, repeats):
            yield (doc_id, *(obj[f] for f in fields), *(str(obj.get(f) or "") for f in optional))
    _warn_repeats(path, repeats)


def _read_jsonl(path: Path, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> pd.DataFrame:
    return pd.DataFrame(list(_jsonl_rows(path, fields, optional, {})), columns=["id", *fields, *optional])


def _read_tsv(path: Path, columns: int, name: str) -> Iterator[tuple[int, list[str]]]:
    for number, line in read_lines(path):
        parts = line.split("\t")
        if len(parts) != columns:
            raise DataError(path, f"expected {columns} tab-separated columns ({name}), got {len(parts)}", number)
        yield number, parts


# ---------------------------------------------------------------- layouts


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _relevance(path: Path, number: int, value: str) -> int:
    """An integer relevance grade ("1", "1.0"); inf, nan, 1e400 and 0.5 are errors naming the line."""
    try:
        grade = float(value)
    except ValueError:
        raise DataError(path, f"relevance '{value}' is not a number", number) from None
    if not math.isfinite(grade) or grade != int(grade):
        raise DataError(path, f"relevance '{value}' is not an integer grade", number)
    return int(grade)


def _read_qrels(path: Path) -> list[tuple[int, str, str, int]]:
    """(line, query id, document id, grade) of a qrels file: BEIR's TSV (query-id, corpus-id, score; a header line)
    or TREC's (`qid iteration docid relevance`, whitespace-separated, no header: trec_eval's, pyserini's and
    ir_datasets' format), told apart line by line from the content."""
    rows: list[tuple[int, str, str, int]] = []
    header = {"score", "relevance", "rel"}
    for number, line in read_lines(path):
        parts = line.split("\t")
        if len(parts) != 3:
            tabs, parts = parts, line.split()
            if len(parts) == 4:  # TREC: qid iteration docid relevance
                if not rows and header & {p.strip().lower() for p in parts}:
                    raise DataError(path, f"a header of 4 columns ({' '.join(parts)}): BEIR's qrels have 3 "
                                    "(query-id, corpus-id, score), TREC's 4 (query-id iteration doc-id relevance) "
                                    "and no header; remove the extra column", number)
                if len(tabs) == 4 and _number(tabs[2]) and not _number(tabs[3]):
                    raise DataError(path, f"expected 3 tab-separated columns (query-id, corpus-id, score), got 4 "
                                    f"(an extra column '{tabs[3].strip()}' after the score {tabs[2].strip()}?); "
                                    "TREC's 4 columns end with the relevance", number)
                parts = [parts[0], parts[2], parts[3]]
            elif len(parts) != 3:
                raise DataError(path, "expected 3 tab-separated columns (query-id, corpus-id, score) or TREC's 4 "
                                f"(query-id iteration doc-id relevance), got {len(parts)}", number)
        parts = [p.strip() for p in parts]
        if not rows and parts[2].lower() in header:
            continue  # header
        rows.append((number, parts[0], parts[1], _relevance(path, number, parts[2])))
    return rows


def _check_qrels(path: Path, rows: list[tuple[int, str, str, int]], query_ids: set, doc_ids: set, split: str
                 ) -> list[tuple[int, str, str, int]]:
    """The usable qrels of a split: a row naming a query missing from the queries file, or a document missing from
    the corpus, is left out with one warning per kind (real collections have such rows; ir_datasets and trec_eval
    skip them, BEIR's loader skips the documents), unless the split loses every row."""
    if not rows:
        raise DataError(path, f"split '{split}' has no queries (no qrels lines)")
    for column, known, file, one, what in ((1, query_ids, "queries file", "a query", "queries"),
                                           (2, doc_ids, "corpus", "a document", "documents")):
        missing = [row for row in rows if row[column] not in known]
        if len(missing) == len(rows):
            raise DataError(path, f"split '{split}': none of its {len(rows)} qrels names {one} of the {file} "
                            f"(first: '{missing[0][column]}'); is this the {file} they were made for?", missing[0][0])
        if missing:
            warn(f"{path}: {len(missing)} of {len(rows)} qrels of split '{split}' name {what} that are not in the "
                 f"{file}; they are left out: {preview([f'{r[column]} (line {r[0]})' for r in missing])}")
            rows = [row for row in rows if row[column] in known]
    return rows


CORPUS_CHUNK = 100_000  # documents read into a table at a time (and written, when the corpus goes to a file)


def _collection_rows(path: Path, seen: dict[str, int]) -> Iterator[tuple[str, str, str]]:
    """(id, title, text) of each line of an MS MARCO collection.tsv, validated as it is read."""
    repeats: list[str] = []
    for number, line in read_lines(path):
        parts = line.split("\t")
        if len(parts) not in (2, 3):
            raise DataError(path, f"expected 2 (id, text) or 3 (id, title, text) columns, got {len(parts)}", number)
        if _claim_id(seen, parts[0], number, repeats):
            yield parts[0], parts[1] if len(parts) == 3 else "", parts[-1]
    _warn_repeats(path, repeats)


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


def _load_beir(folder: Path, corpus_to: Path | None) -> Dataset:
    seen: dict[str, int] = {}
    path = folder / "corpus.jsonl"
    rows = ((d, title, text) for d, text, title in _jsonl_rows(path, ("text",), ("title",), seen))
    corpus = _read_corpus(path, rows, corpus_to)
    queries = _read_jsonl(folder / "queries.jsonl", ("text",)).rename(columns={"id": "query_id"})
    qrels_dir = folder / "qrels"
    files = sorted(qrels_dir.glob("*.tsv")) if qrels_dir.is_dir() else []
    if not files:
        raise DataError(qrels_dir, "no qrels/<split>.tsv files")
    query_ids = set(queries["query_id"])
    frames = []
    for path in files:
        rows = _check_qrels(path, _read_qrels(path), query_ids, seen, path.stem)
        frames.append(pd.DataFrame([r[1:] for r in rows], columns=["query_id", "doc_id", "relevance"]).assign(
            split=path.stem))
    return _finish(corpus, queries, pd.concat(frames, ignore_index=True), folder / "queries.jsonl")


def _load_msmarco(folder: Path, corpus_to: Path | None) -> Dataset:
    path = folder / "collection.tsv"
    seen: dict[str, int] = {}
    corpus = _read_corpus(path, _collection_rows(path, seen), corpus_to)
    query_frames, qrel_frames = [], []
    qrel_files = sorted(folder.glob("qrels.*.tsv"))
    if not qrel_files:
        raise DataError(folder, "no qrels.<split>.tsv files")
    for qpath in qrel_files:
        split = qpath.name[len("qrels."):-len(".tsv")]
        queries_path = folder / f"queries.{split}.tsv"
        first: dict[str, int] = {}
        repeats: list[str] = []
        qs = [(parts[0], parts[1], number) for number, parts in _read_tsv(queries_path, 2, "id, text")
              if _claim_id(first, parts[0], number, repeats)]
        _warn_repeats(queries_path, repeats)
        rows = _check_qrels(qpath, _read_qrels(qpath), set(first), seen, split)
        query_frames.append(pd.DataFrame([q[:2] for q in qs], columns=["query_id", "text"]))
        qrel_frames.append(pd.DataFrame([r[1:] for r in rows], columns=["query_id", "doc_id", "relevance"]).assign(
            split=split))
    queries = pd.concat(query_frames, ignore_index=True).drop_duplicates("query_id")
    return _finish(corpus, queries, pd.concat(qrel_frames, ignore_index=True), folder / "queries.<split>.tsv")


def _finish(corpus: pd.DataFrame, queries: pd.DataFrame, qrels: pd.DataFrame, queries_file: Path) -> Dataset:
    used = set(qrels["query_id"])
    queries = queries[queries["query_id"].isin(used)].reset_index(drop=True)
    empty = queries["text"].str.strip() == ""
    if empty.any():
        ids = queries.loc[empty, "query_id"].tolist()
        warn(f"{queries_file}: {len(ids)} queries with empty text are left out of every split (nothing to train on "
             f"or search for): {preview(ids)}")
        queries = queries[~empty].reset_index(drop=True)
        qrels = qrels[~qrels["query_id"].isin(ids)]
    pairs = ["query_id", "doc_id", "split"]
    grades = qrels[qrels.duplicated(pairs, keep=False)].groupby(pairs)["relevance"].agg(list)  # in line order
    if len(conflicts := grades[grades.map(lambda g: len(set(g)) > 1)]):  # two grades for one pair: the last stands
        warn(f"{len(conflicts)} (query, document) pairs are judged twice with different grades in the qrels; the "
             "later line's grade is kept: " + preview(f"{q} / {d} in {split} ({', then '.join(map(str, g))})"
                                                     for (q, d, split), g in conflicts.items()))
    qrels = qrels.drop_duplicates(pairs, keep="last").reset_index(drop=True)
    return Dataset(corpus.reset_index(drop=True), queries, qrels)


def qrels_file(folder: Path, split: str) -> Path:
    """Where a split's qrels are read from (BEIR: qrels/<split>.tsv; MS MARCO: qrels.<split>.tsv)."""
    beir = folder / "qrels" / f"{split}.tsv"
    return beir if beir.is_file() or not (folder / f"qrels.{split}.tsv").is_file() else folder / f"qrels.{split}.tsv"


def positive_grades(folder: Path, split: str) -> set[int]:
    """The positive relevance grades of a dataset folder's qrels of `split` (none when it has no such file)."""
    path = qrels_file(folder, split)
    return {grade for _, _, _, grade in _read_qrels(path) if grade > 0} if path.is_file() else set()


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
    folder = Path(folder)
    grades = folder / TRAINING_GRADES
    return Dataset(
        corpus=pd.read_parquet(folder / "corpus.parquet", columns=corpus_columns),
        queries=pd.read_parquet(folder / "queries.parquet"),
        qrels=pd.read_parquet(folder / "qrels.parquet"),
        min_relevance=json.loads(grades.read_text()) if grades.is_file() else {},
    )


def passage_texts(corpus: pd.DataFrame) -> list[str]:
    """Title and text joined, as both BM25 and the encoder see a passage."""
    titles = corpus["title"].fillna("").astype(str)
    texts = corpus["text"].astype(str)
    return [f"{t} {x}".strip() if t else x for t, x in zip(titles, texts, strict=True)]

