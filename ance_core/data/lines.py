"""A collection's files read line by line, each problem naming its file and line: decoding (a byte-order mark, CRLF,
gzip, bytes that are not UTF-8), ids claimed once, JSON lines and TSV rows (qrels: data/qrels.py)."""

import codecs
import contextlib
import gzip
import io
import json
import math
import re
import threading
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
    evaluation's TREC run as MLflow keeps it), and so is a gzip file under another name (a corpus.jsonl that was
    compressed in place: it was read as bytes that are not UTF-8, every line malformed)."""
    if not path.is_file():
        raise DataError(path, "a folder, not a file" if path.is_dir() else "file not found")
    warned = False
    with open(path, "rb") as head:
        gzipped = path.suffix == ".gz" or head.read(2) == b"\x1f\x8b"
    with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as f, _readable_gzip(path):
        if (utf16 := _utf16_encoding(f.peek(4)[:4])) is not None:
            yield from _utf16_lines(f, path, utf16)
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


def _utf16_lines(f, path: Path, encoding: str = "utf-16") -> Iterator[tuple[int, str]]:
    """`read_lines` of a UTF-16 file, with its byte-order mark (Windows PowerShell 5.1's `>` and `Out-File` write
    them) or without (`encoding` utf-16-le or -be): decoded as UTF-16, not read as UTF-8 with a NUL byte between
    every character."""
    replaced = _REPLACED.__dict__.setdefault("count", [0])
    start, warned = replaced[0], False
    with io.TextIOWrapper(f, encoding=encoding, errors=UTF16_ERRORS, newline=None) as text:
        for number, line in enumerate(text, start=1):  # (decoded a chunk at a time: a bad unit is near the line)
            if replaced[0] > start and not warned:
                warn(f"{path}:{number}: not valid UTF-16 (near this line): its invalid bytes are read as U+FFFD, and "
                     "so are any later line's")
                warned = True
            line = line.rstrip("\r\n").lstrip("\ufeff")
            if line.strip():
                yield number, line


UTF16_ERRORS = "ance-utf16-replace"  # errors="replace" that counts (per thread) what it replaced
_REPLACED = threading.local()


def _count_and_replace(error: UnicodeDecodeError) -> tuple[str, int]:
    _REPLACED.__dict__.setdefault("count", [0])[0] += 1
    return "\ufffd", error.end


codecs.register_error(UTF16_ERRORS, _count_and_replace)


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


def jsonl_rows(path: Path, fields: tuple[str, ...], optional: tuple[str, ...], seen: dict[str, int],
               expected: str | None = None) -> Iterator[tuple[str, ...]]:
    """(id, *fields, *optional) of each line, validated as it is read; `seen` collects the ids (and their lines).
    `expected`: an optional field that no line holding it is an error when lines hold other fields (a corpus's text
    under another name, `body`: every document read as its title alone, without a word), else a warning."""
    repeats: list[str] = []
    left_out = LeftOut(path)
    surrogates: list[int] = []
    missing, others = expected, set()  # (the expected field until a line holds it; the fields lines hold instead)
    for number, line in read_lines(path):
        try:
            doc_id, obj = _json_row(path, number, line, fields, optional)
        except DataError as e:
            left_out.add(e)
            continue
        left_out.keep()
        if missing is not None and missing in obj:
            missing = None
        elif missing is not None:
            others |= set(obj) - {"_id", *fields, *optional}
        row = (doc_id, *(obj[f] for f in fields), *(_optional_text(obj.get(f)) for f in optional))
        if "\\u" in line and any(_SURROGATE.search(value) for value in row):  # (only a \u escape makes one)
            surrogates.append(number)
            row = tuple(_SURROGATE.sub("\ufffd", value) for value in row)
        if claim_id(seen, row[0], number, repeats):
            yield row
    left_out.done()
    if missing is not None and left_out.read:
        _no_field(path, missing, others)
    warn_repeats(path, repeats)
    if surrogates:
        warn(f"{path}: {len(surrogates)} lines hold half of a UTF-16 surrogate pair (a \\ud800-\\udfff escape "
             f"alone, as an emoji cut in two; not text), read as U+FFFD: lines {preview(surrogates)}")


def _no_field(path: Path, name: str, others: set[str]) -> None:
    """No line of the file holds the field `name`: refused when its lines hold other fields (the text under another
    name), said when they hold none."""
    if others:
        raise DataError(path, f"no line has a '{name}' field; its lines have {', '.join(sorted(others)[:8])} besides "
                        f"_id and title: rename the field that holds each row's {name} to '{name}'")
    warn(f"{path}: no line has a '{name}' field: every row is read as its title alone")


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
    if obj.get("_id") is None:
        raise DataError(path, "field '_id' is null" if "_id" in obj else "missing field '_id'", number)
    row_id = _id_text(path, number, obj["_id"])
    for name in fields:  # (the row's id named: a bad row is found by it, as its qrels name it)
        value = obj.get(name)
        if value is None:
            raise DataError(path, f"id '{row_id}': " + (f"field '{name}' is null" if name in obj
                                                        else f"missing field '{name}'"), number)
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            obj[name] = str(value)  # (a number is read as its digits, as in an optional field)
        elif not isinstance(value, str):
            raise DataError(path, f"id '{row_id}': field '{name}' must be a string", number)
    for name in optional:
        if isinstance(obj.get(name), list | dict | bool):
            raise DataError(path, f"id '{row_id}': field '{name}' must be a string", number)
    return row_id, obj


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


class FileLayoutError(DataError):
    """A problem with a file's layout (not one of its rows): it stops the load."""


INDEX_COLUMNS = {"", "unnamed: 0", "index"}  # what pandas' to_csv names its row numbers' column (index=True)
ID_COLUMNS = {"id", "qid", "pid", "docid", "docno", "queryid", "corpusid", "documentid", "passageid", "topic",
              "topicid", "query", "doc", "document"}  # (lower case, without '-' and '_')


def refuse_index_column(path: Path, number: int, parts: list[str]) -> None:
    """A TSV file's first line, split on tabs, that is a header after an unnamed first column: the row numbers
    pandas' `to_csv` writes unless `index=False`. Read on, every row's columns were shifted by one (a qrels row taken
    for TREC's, the row number as the query id; a passage's id as its title), without a word."""
    names = [p.strip().lower() for p in parts]
    if len(names) >= 3 and names[0] in INDEX_COLUMNS and names[1].replace("-", "").replace("_", "") in ID_COLUMNS \
            and all(name and not re.fullmatch(r"[-+.\d]+", name) for name in names[1:]):
        raise FileLayoutError(path, f"its header ({' '.join(p.strip() for p in parts[1:])}) follows an unnamed first "
                              "column: row numbers, as pandas' to_csv writes unless index=False, which would be read "
                              "as the ids; write the file without them", number)


def read_jsonl(path: Path, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> pd.DataFrame:
    return pd.DataFrame(list(jsonl_rows(path, fields, optional, {})), columns=["id", *fields, *optional])


def read_tsv(path: Path, columns: int, name: str) -> Iterator[tuple[int, list[str]]]:
    """(line, its `columns` tab-separated values) of each readable line, the first trimmed (an id); the last holds the
    rest of the line, tabs included, trimmed (text with a tab in it, or a trailing tab, is still one value)."""
    left_out = LeftOut(path)
    for number, line in read_lines(path):
        if not left_out.read and not left_out.count:
            refuse_index_column(path, number, line.split("\t"))
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
