"""Qrels files read line by line: BEIR's TSV or TREC's format, told apart from the content, each line's grade
checked, and the pairs whose query or document the collection lacks left out with one warning."""

import math
import unicodedata
from pathlib import Path

from ance_core.data.lines import FileLayoutError, LeftOut, read_lines, refuse_index_column
from ance_core.errors import DataError, preview, warn


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
    left_out, first, iterations = LeftOut(path), True, set()
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
            if len(line.split("\t")) != 3 and len(parts := line.split()) == 4:  # read as TREC's
                iterations.add(parts[1])
        first = False
    left_out.done()
    if len(iterations) > MAX_ITERATIONS:  # `q1<TAB>4983<TAB>1<TAB>5`: a document id read as the iteration
        raise FileLayoutError(path, f"read as TREC's qrels (query-id iteration doc-id relevance), its second column "
                              f"holds {len(iterations):,} different values (e.g. {', '.join(sorted(iterations)[:3])}); "
                              "TREC's iteration holds a few (0, Q0, a round's number): is it BEIR's 3 columns "
                              "(query-id, corpus-id, score) with a fourth, a row number before them (pandas' to_csv "
                              "writes one unless index=False) or a value after the score? remove that column")
    return rows


MAX_ITERATIONS = 20  # TREC's qrels: 0 or Q0; TREC-COVID's the round of each judgement (0.5 to 5)


QRELS_HEADER = {"score", "relevance", "rel"}
TREC_GRADE_NAMES = {"label", "grade", "judgment", "judgement", "qrel"}  # a TREC header's last column, besides those
TREC_ITERATIONS = {"0", "q0"}


def _qrels_row(path: Path, number: int, line: str, first: bool) -> tuple[int, str, str, int] | None:
    """(line, query id, document id, grade) of one qrels line; None for a header (the file's first line). A header of
    4 columns is an error that stops the load: a file's layout, not one bad row."""
    parts = line.split("\t")
    if first:
        refuse_index_column(path, number, parts)
    if len(parts) != 3:
        tabs, parts = parts, line.split()
        if len(parts) == 4:  # TREC: qid iteration docid relevance
            names = [_column(q) for q in parts]
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
            if not _number(parts[1]) and parts[1].lower() not in TREC_ITERATIONS:  # (read as TREC, `q1 d1 1 5`
                # took d1 for the iteration, 1 for the document and 5 for its grade)
                raise DataError(path, f"4 columns, but the second ('{parts[1]}') is not TREC's iteration (a number, "
                                "or Q0): expected 3 tab-separated columns (query-id, corpus-id, score) or TREC's 4 "
                                "(query-id iteration doc-id relevance)", number)
            parts = [parts[0], parts[2], parts[3]]
        elif len(parts) != 3:
            raise DataError(path, "expected 3 tab-separated columns (query-id, corpus-id, score) or TREC's 4 "
                            f"(query-id iteration doc-id relevance), got {len(parts)}", number)
    parts = [p.strip() for p in parts]
    if first and parts[2].lower() in QRELS_HEADER | TREC_GRADE_NAMES:
        # the columns are read in one order: a header naming the document column first had every row's ids read
        # swapped, without a word
        names = [_column(p) for p in parts[:2]]
        if names[0] in DOC_COLUMN_NAMES or names[1] in QUERY_COLUMN_NAMES:
            raise FileLayoutError(path, f"its header ({' '.join(parts)}) names the document column before the query "
                                  "column: qrels are read as query-id, corpus-id, score; swap the two columns (and "
                                  "the header's names)", number)
        return None
    return number, parts[0], parts[1], _relevance(path, number, parts[2])


def _column(name: str) -> str:
    """A header's column name as the name sets below hold it: lower case, without '-' and '_'."""
    return name.lower().replace("-", "").replace("_", "")


DOC_COLUMN_NAMES = {"corpusid", "docid", "documentid", "doc", "document", "pid", "passageid", "docno"}
QUERY_COLUMN_NAMES = {"queryid", "qid", "query", "topic", "topicid"}


def _normalisation_hint(missing: list[tuple], column: int, known: set) -> str:
    """When a missing id is a known one in another Unicode normal form (NFC 'café' against NFD 'cafe\u0301': the two
    print alike), say so: one file was written by a tool that normalises text. When it is a known integer id written
    as a float ('12.0': pandas writes an integer column with gaps so), say that."""
    for row in missing:
        whole, dot, zeros = row[column].partition(".")
        if dot and whole.lstrip("-").isdigit() and zeros and set(zeros) == {"0"} and whole in known:
            return (f"; {row[column]!r} is {whole!r} there: the qrels' ids were written as floats (pandas writes an "
                    "integer column with gaps so): write them as integers")
    for row in missing:
        for form in ("NFC", "NFD"):
            if (other := unicodedata.normalize(form, row[column])) != row[column] and other in known:
                return (f"; {row[column]!r} is {other!r} there in Unicode {form} (they print alike): normalise the "
                        "ids of both files to one form")
    return ""


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
