"""A collection's files read line by line, each problem naming its file and line: decoding (a byte-order mark, CRLF,
gzip, bytes that are not UTF-8), ids claimed once, JSON lines, TSV rows, and qrels in BEIR's or TREC's layout."""

import contextlib
import gzip
import io
import json
import math
import re
import unicodedata
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from ance_core.errors import DataError, preview, warn

JSON_LINES = "; a .jsonl file holds one JSON object per line (JSON Lines), not a JSON array"  # (said of one that is)


def read_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, decoded line) for non-blank lines. Bytes that are not UTF-8 are read as U+FFFD, with one
    warning per file naming the first such line (one bad row does not stop a load). A byte-order mark at the start of
    the file and CRLF line endings (Windows tools write both) are dropped; a file whose lines end with CR alone (classic
    Mac OS, Excel's "CSV (Macintosh)") is read line by line too. A `.gz` file is read decompressed (an
    evaluation's TREC run as MLflow keeps it)."""
    if not path.is_file():
        raise DataError(path, "a folder, not a file" if path.is_dir() else "file not found")
    warned = False
    with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f, _readable_gzip(path):
        if (utf16 := _utf16_encoding(f.peek(4)[:4])) is not None:
            yield from _utf16_lines(f, utf16)
            return
        for number, raw in enumerate(_cr_split(f), start=1):
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
            if number > 1 and line.startswith("\ufeff"):  # files joined by `cat`: a mark at each one's start
                line = line[1:]
            if line.strip():
                yield number, line


def _cr_split(f) -> Iterator[bytes]:
    """The raw lines of a binary file: split on LF, or on CR in a file that holds no LF at all (lines ending with CR
    alone, which a LF split reads as one line: the whole file, then held whole once)."""
    raw = next(f, b"")
    if not raw.endswith(b"\n") and b"\r" in raw.rstrip(b"\r"):
        yield from raw.split(b"\r")
        return
    yield raw
    yield from f


UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")  # a UTF-16 file's first bytes (little-, big-endian)


def _utf16_encoding(head: bytes) -> str | None:
    """The UTF-16 codec of a file that starts with these bytes, or None (UTF-8): its byte-order mark, or without one
    a NUL byte beside each of its first two characters (`iconv -t utf-16le` writes no mark; a JSON or TSV file in
    UTF-8 holds no NUL byte)."""
    if head[:2] in UTF16_BOMS:
        return "utf-16"
    if len(head) == 4 and head[1] == head[3] == 0 and head[0] and head[2]:
        return "utf-16-le"
    if len(head) == 4 and head[0] == head[2] == 0 and head[1] and head[3]:
        return "utf-16-be"
    return None


@contextlib.contextmanager
def _readable_gzip(path: Path) -> Iterator[None]:
    """A gzip file that cannot be read (gzip.BadGzipFile is an OSError; a cut-off one an EOFError) is an error naming
    it."""
    try:
        yield
    except (OSError, EOFError) as e:
        raise DataError(path, f"not a readable gzip file ({e})") from None


def _utf16_lines(f, encoding: str = "utf-16") -> Iterator[tuple[int, str]]:
    """`read_lines` of a UTF-16 file, with its byte-order mark (Windows PowerShell 5.1's `>` and `Out-File` write
    them) or without (`encoding` utf-16-le or -be): decoded as UTF-16, not read as UTF-8 with a NUL byte between
    every character."""
    for number, line in enumerate(io.TextIOWrapper(f, encoding=encoding, errors="replace", newline=None), start=1):
        line = line.rstrip("\r\n").lstrip("\ufeff")
        if line.strip():
            yield number, line


class LeftOut:
    """The lines of a file that cannot be read as one of its rows (malformed JSON, a missing field, a wrong number of
    columns, a grade that is not one): each is left out and the load goes on, with one warning per file naming them
    (one bad row of real data does not stop a run). A file more than half of whose lines cannot be read is an error
    naming its first problem (the wrong file, or the wrong format: what is left is not the collection), at once when
    its first `EARLY` lines are all unreadable (not after reading millions of them)."""

    EARLY, SHOWN = 100, 3

    def __init__(self, path: Path):
        self.path, self.errors, self.count, self.read = path, [], 0, 0

    def keep(self) -> None:
        """A line read as a row."""
        self.read += 1

    def add(self, error: DataError) -> None:
        """`error` of a line left out."""
        self.count += 1
        if len(self.errors) < self.SHOWN:
            self.errors.append(error)
        if not self.read and self.count >= self.EARLY:
            raise self.errors[0] from None  # (raised inside the caller's handling of this line's error)

    def done(self) -> None:
        n, read = self.count, self.read
        if n and not read:
            raise self.errors[0]
        if n > read:
            e = self.errors[0]
            raise DataError(self.path, f"{n:,} of its {n + read:,} rows cannot be read, more than half (the wrong file "
                            f"or format?); the first, line {e.line}: {e.problem}", e.line)
        if n:
            shown = "; ".join(f"line {e.line}: {e.problem}" for e in self.errors)
            warn(f"{self.path}: {n:,} of its {n + read:,} rows cannot be read and {'are' if n != 1 else 'is'} left "
                 f"out: {shown}{f' and {n - len(self.errors):,} more' if n > len(self.errors) else ''}")


def claim_id(seen: dict[str, int], item_id: str, number: int, repeats: list[str]) -> bool:
    """Record the line an id first appears on (True); a later line with the same id is left out (False), noted in
    `repeats` for `warn_repeats`."""
    if item_id in seen:
        repeats.append(f"'{item_id}' (lines {seen[item_id]} and {number})")
        return False
    seen[item_id] = number
    return True


def warn_repeats(path: Path, repeats: list[str]) -> None:
    if repeats:
        lines = "1 line repeats" if len(repeats) == 1 else f"{len(repeats)} lines repeat"
        left = "is" if len(repeats) == 1 else "are"
        warn(f"{path}: {lines} the id of an earlier line and {left} left out (the first line of an id is kept): "
             f"{preview(repeats)}")


def jsonl_rows(path: Path, fields: tuple[str, ...], optional: tuple[str, ...], seen: dict[str, int]
                ) -> Iterator[tuple[str, ...]]:
    """(id, *fields, *optional) of each line, validated as it is read; `seen` collects the ids (and their lines)."""
    repeats: list[str] = []
    left_out = LeftOut(path)
    surrogates: list[int] = []
    for number, line in read_lines(path):
        try:
            doc_id, obj = _json_row(path, number, line, fields, optional)
        except DataError as e:
            left_out.add(e)
            continue
        left_out.keep()
        row = (doc_id, *(obj[f] for f in fields), *(_optional_text(obj.get(f)) for f in optional))
        if "\\u" in line and any(_SURROGATE.search(value) for value in row):  # (only a \u escape makes one)
            surrogates.append(number)
            row = tuple(_SURROGATE.sub("\ufffd", value) for value in row)
        if claim_id(seen, row[0], number, repeats):
            yield row
    left_out.done()
    warn_repeats(path, repeats)
    if surrogates:
        warn(f"{path}: {len(surrogates)} lines hold half of a UTF-16 surrogate pair (a \\ud800-\\udfff escape "
             f"alone, as an emoji cut in two; not text), read as U+FFFD: lines {preview(surrogates)}")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _optional_text(value) -> str:
    """An optional field's text: missing, null and NaN (pandas' `to_json` writes a missing title as NaN) are empty."""
    if value is None or isinstance(value, float) and not math.isfinite(value):
        return ""
    return str(value)


def _json_row(path: Path, number: int, line: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()
              ) -> tuple[str, dict]:
    """(id, object) of a JSON line with its required fields (strings), and its optional ones text where given (a
    number is read as its digits; a list, a mapping or true/false is no text)."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        array = JSON_LINES if line.lstrip('\ufeff \t').startswith("[") else ""
        raise DataError(path, f"malformed JSON: {e.msg} (column {e.colno}){array}", number) from None
    except (ValueError, RecursionError) as e:  # an integer of thousands of digits, arrays nested thousands deep
        raise DataError(path, f"malformed JSON: {type(e).__name__}: {str(e)[:100]}", number) from None
    if not isinstance(obj, dict):
        raise DataError(path, f"expected a JSON object, got {type(obj).__name__}"
                        + (JSON_LINES if isinstance(obj, list) else ""), number)
    for name in ("_id", *fields):
        if name not in obj or obj[name] is None:
            raise DataError(path, f"missing field '{name}'", number)
        if name != "_id" and not isinstance(obj[name], str):
            raise DataError(path, f"field '{name}' must be a string", number)
    for name in optional:
        if isinstance(obj.get(name), list | dict | bool):
            raise DataError(path, f"field '{name}' must be a string", number)
    return _id_text(path, number, obj["_id"]), obj


def _id_text(path: Path, number: int, value) -> str:
    """A JSON `_id` as the text qrels name it: a string trimmed (qrels ids are), an integer as its digits, an integral
    float as its integer's (pandas writes an int column with gaps as 1.0); anything else is an error naming the line."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataError(path, f"'_id' must be a string or an integer, got {json.dumps(value)[:40]}", number)
    text = str(value).strip()
    if not text:
        raise DataError(path, "empty '_id'", number)
    if problem := id_problem(text):
        raise DataError(path, problem, number)
    return text


LINE_BREAKS = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")  # what str.splitlines splits on


def id_problem(text: str) -> str | None:
    """Why `text` (trimmed) cannot be an id, or None: empty; holding a line break (\\n, \\r, \\u2028 ... inside
    it), which would break every file that holds ids one per line (docids.txt, TREC runs) and shift the ids after
    it; or holding a space or a tab, which would split it into two columns of a TREC run or qrels file."""
    if not text:
        return "empty id"
    if LINE_BREAKS.search(text):
        return f"id {json.dumps(text)[:60]} holds a line break"
    if any(c.isspace() for c in text):
        return (f"id {json.dumps(text)[:60]} holds whitespace, which separates the columns of TREC run and qrels "
                "files (write it with '_' instead)")
    return None


def read_jsonl(path: Path, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> pd.DataFrame:
    return pd.DataFrame(list(jsonl_rows(path, fields, optional, {})), columns=["id", *fields, *optional])


def read_tsv(path: Path, columns: int, name: str) -> Iterator[tuple[int, list[str]]]:
    """(line, its `columns` tab-separated values) of each readable line, the first trimmed (an id); the last holds the
    rest of the line, tabs included, trimmed (text with a tab in it, or a trailing tab, is still one value)."""
    left_out = LeftOut(path)
    for number, line in read_lines(path):
        parts = line.split("\t", columns - 1)
        parts[0], parts[-1] = parts[0].strip(), parts[-1].strip()
        problem = (f"expected {columns} tab-separated columns ({name}), got {len(parts)}" if len(parts) != columns
                   else id_problem(parts[0]))
        if problem:
            left_out.add(DataError(path, problem, number))
            continue
        left_out.keep()
        yield number, parts
    left_out.done()


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
    if abs(grade) > MAX_GRADE:
        raise DataError(path, f"relevance '{value}' is out of range (a grade is a small integer: at most "
                        f"{MAX_GRADE:,} either way)", number)
    return int(grade)


MAX_GRADE = 2**31 - 1  # (qrels are stored as 64-bit integers; trec_eval's are 32-bit)


def read_qrels(path: Path) -> list[tuple[int, str, str, int]]:
    """(line, query id, document id, grade) of a qrels file: BEIR's TSV (query-id, corpus-id, score; a header line)
    or TREC's (`qid iteration docid relevance`, whitespace-separated, no header: trec_eval's, pyserini's and
    ir_datasets' format), told apart line by line from the content."""
    rows: list[tuple[int, str, str, int]] = []
    left_out, first = LeftOut(path), True
    for number, line in read_lines(path):
        try:
            row = _qrels_row(path, number, line, first)
        except FileLayoutError:
            raise
        except DataError as e:
            left_out.add(e)
            continue
        if row is not None:  # (None: the header, which may follow lines left out)
            rows.append(row)
            left_out.keep()
        first = False
    left_out.done()
    return rows


QRELS_HEADER = {"score", "relevance", "rel"}
TREC_GRADE_NAMES = {"label", "grade", "judgment", "judgement", "qrel"}  # a TREC header's last column, besides those
TREC_ITERATIONS = {"0", "q0"}


def _qrels_row(path: Path, number: int, line: str, first: bool) -> tuple[int, str, str, int] | None:
    """(line, query id, document id, grade) of one qrels line; None for a header (the file's first line). A header of
    4 columns is an error that stops the load: a file's layout, not one bad row."""
    parts = line.split("\t")
    if len(parts) != 3:
        tabs, parts = parts, line.split()
        if len(parts) == 4:  # TREC: qid iteration docid relevance
            names = [q.lower().replace("-", "").replace("_", "") for q in parts]
            if first and names[0] in QUERY_COLUMN_NAMES and names[2] in DOC_COLUMN_NAMES and \
                    names[3] in QRELS_HEADER | TREC_GRADE_NAMES:  # TREC's columns named, in TREC's order
                warn(f"{path}:{number}: read as a header line ({' '.join(parts)}) and skipped: TREC's qrels "
                     "(query-id iteration doc-id relevance) have none")
                return None
            if first and QRELS_HEADER & {p.strip().lower() for p in parts}:
                raise FileLayoutError(path, f"a header of 4 columns ({' '.join(parts)}): BEIR's qrels have 3 "
                                      "(query-id, corpus-id, score), TREC's 4 (query-id iteration doc-id relevance) "
                                      "and no header; remove the header line", number)
            if len(tabs) == 4 and _number(tabs[2]) and not _number(tabs[3]) and tabs[1].strip().lower() not in \
                    TREC_ITERATIONS:  # (TREC's second column is 0 or Q0: its relevance is the one not a number)
                raise DataError(path, f"expected 3 tab-separated columns (query-id, corpus-id, score), got 4 "
                                f"(an extra column '{tabs[3].strip()}' after the score {tabs[2].strip()}?); "
                                "TREC's 4 columns end with the relevance", number)
            parts = [parts[0], parts[2], parts[3]]
        elif len(parts) != 3:
            raise DataError(path, "expected 3 tab-separated columns (query-id, corpus-id, score) or TREC's 4 "
                            f"(query-id iteration doc-id relevance), got {len(parts)}", number)
    parts = [p.strip() for p in parts]
    if first and parts[2].lower() in QRELS_HEADER:
        # the columns are read in one order: a header naming the document column first had every row's ids read
        # swapped, without a word
        names = [p.lower().replace("-", "").replace("_", "") for p in parts[:2]]
        if names[0] in DOC_COLUMN_NAMES or names[1] in QUERY_COLUMN_NAMES:
            raise FileLayoutError(path, f"its header ({' '.join(parts)}) names the document column before the query "
                                  "column: qrels are read as query-id, corpus-id, score; swap the two columns (and "
                                  "the header's names)", number)
        return None
    return number, parts[0], parts[1], _relevance(path, number, parts[2])


DOC_COLUMN_NAMES = {"corpusid", "docid", "documentid", "doc", "document", "pid", "passageid", "docno"}
QUERY_COLUMN_NAMES = {"queryid", "qid", "query", "topic", "topicid"}


def _normalisation_hint(missing: list[tuple], column: int, known: set) -> str:
    """When a missing id is a known one in another Unicode normal form (NFC 'café' against NFD 'cafe\u0301': the two
    print alike), say so: one file was written by a tool that normalises text."""
    for row in missing:
        for form in ("NFC", "NFD"):
            if (other := unicodedata.normalize(form, row[column])) != row[column] and other in known:
                return (f"; {row[column]!r} is {other!r} there in Unicode {form} (they print alike): normalise the "
                        "ids of both files to one form")
    return ""


class FileLayoutError(DataError):
    """A problem with a file's layout (not one of its rows): it stops the load."""


def check_qrels(path: Path, rows: list[tuple[int, str, str, int]], query_ids: set, doc_ids: set, split: str
                 ) -> list[tuple[int, str, str, int]]:
    """The usable qrels of a split: a row naming a query missing from the queries file, or a document missing from
    the corpus, is left out with one warning per kind (real collections have such rows), unless the split loses
    every row. BEIR's loader keeps a judgement of a missing document, and trec_eval counts it as relevant and never
    retrieved: on such a collection the metrics here read higher than BEIR's (the warning says so)."""
    if not rows:
        raise DataError(path, f"split '{split}' has no queries (no qrels lines)")
    for column, known, file, one, what in ((1, query_ids, "queries file", "a query", "queries"),
                                           (2, doc_ids, "corpus", "a document", "documents")):
        missing = [row for row in rows if row[column] not in known]
        if len(missing) == len(rows):
            raise DataError(path, f"split '{split}': none of its {len(rows)} qrels names {one} of the {file} "
                            f"(first: '{missing[0][column]}'); is this the {file} they were made for? (or was it on a "
                            "line left out above?)" + _normalisation_hint(missing, column, known), missing[0][0])
        if missing:
            beir = (" (BEIR's evaluation counts such a judgement as a relevant document never retrieved: recall and "
                    "nDCG here read higher than BEIR's on this split)" if what == "documents" else "")
            warn(f"{path}: {len(missing)} of {len(rows)} qrels of split '{split}' name {what} that are not in the "
                 f"{file} (or on a line of it left out above); they are left out{beir}: "
                 f"{preview([f'{r[column]} (line {r[0]})' for r in missing])}"
                 + _normalisation_hint(missing, column, known))
            rows = [row for row in rows if row[column] in known]
    return rows
