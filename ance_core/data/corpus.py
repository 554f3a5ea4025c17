"""A corpus read by row: what the training stage gathers of it (the passages its negatives reference), never the whole
text column.

`ParquetCorpus` reads a data folder's corpus.parquet (dataset.py `save_tables`, row groups of CORPUS_ROW_GROUP):
its doc-id column alone, through a memory map, maps ids to rows (every DDP rank derives the same rows from the file,
no text read), and `passages(rows)` decodes only the row groups that hold those rows, one batch of
CORPUS_ROW_GROUP rows at a time, keeping just the wanted ones. Data folders written before the row groups (one
large group) are read the same way. `FrameCorpus` is the same over a DataFrame already in memory (tests, scripts).

The texts are read with buffered reads, not through a memory map: a mapping keeps every page of the file it touched
resident in the process until it is closed, and the negatives' documents are spread over the whole file (measured,
20,000 rows gathered from 1M passages, a 271 MB file: peak RSS 490 MB mapped, 254 MB buffered).
"""

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ance_core.data.dataset import CORPUS_ROW_GROUP, passage_texts


class CorpusRows(ABC):
    """A corpus whose documents are read by row number (its order in the stored table)."""

    @property
    @abstractmethod
    def size(self) -> int:
        """Documents in the corpus (rows are 0 .. size-1)."""

    @abstractmethod
    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        """(len(doc_ids),) int64: the row of each document id, -1 where the corpus has no such id."""

    @abstractmethod
    def passages(self, rows: np.ndarray) -> Iterator[tuple[np.ndarray, list[str]]]:
        """The passage texts (title and text joined: dataset.py `passage_texts`) of `rows` (ascending, unique), as
        (rows, texts) parts in row order."""


class ParquetCorpus(CorpusRows):
    """A data folder's corpus.parquet, read by row; nothing is held between calls but its path and row count."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._rows = pq.ParquetFile(self.path, memory_map=True).metadata.num_rows

    @classmethod
    def of_folder(cls, folder: str | Path) -> "ParquetCorpus":
        """The corpus of a data folder (the data stage's output)."""
        return cls(Path(folder) / "corpus.parquet")

    @property
    def size(self) -> int:
        return self._rows

    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        # the id column only (~100 MB at MS MARCO's 8.8M passages), read again per call: a stage asks at its start and
        # at each swap of negatives, so it is not held in between
        ids = pq.read_table(self.path, columns=["doc_id"], memory_map=True).column("doc_id").combine_chunks()
        wanted = pa.array(list(doc_ids), type=pa.string()).cast(ids.type)
        return pc.index_in(wanted, value_set=ids).fill_null(-1).to_numpy().astype(np.int64)

    def passages(self, rows: np.ndarray) -> Iterator[tuple[np.ndarray, list[str]]]:
        table = pq.ParquetFile(self.path)  # buffered reads, a row group's bytes at a time (module docstring)
        columns = ["title", "text"]
        start = 0
        for group in range(table.metadata.num_row_groups):
            stop = start + table.metadata.row_group(group).num_rows
            lo, hi = np.searchsorted(rows, [start, stop])
            if lo < hi:  # a group that holds none of the rows is not decoded
                offset = start
                for batch in table.iter_batches(batch_size=CORPUS_ROW_GROUP, row_groups=[group], columns=columns):
                    a, b = np.searchsorted(rows, [offset, offset + batch.num_rows])
                    if a < b:
                        wanted = rows[a:b]
                        yield wanted, passage_texts(batch.take(pa.array(wanted - offset)).to_pandas())
                    offset += batch.num_rows
            start = stop


class FrameCorpus(CorpusRows):
    """A corpus DataFrame (doc_id, title, text) already in memory."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame.reset_index(drop=True)
        self._index = pd.Index(self.frame["doc_id"])

    @property
    def size(self) -> int:
        return len(self.frame)

    def rows_of(self, doc_ids: Sequence[str]) -> np.ndarray:
        return self._index.get_indexer(list(doc_ids)).astype(np.int64)

    def passages(self, rows: np.ndarray) -> Iterator[tuple[np.ndarray, list[str]]]:
        for start in range(0, len(rows), CORPUS_ROW_GROUP):
            part = rows[start : start + CORPUS_ROW_GROUP]
            yield part, passage_texts(self.frame.iloc[part])


def read_corpus_rows(folder: str | Path, doc_ids: list[str]) -> pd.DataFrame:
    """A data folder's corpus rows of these documents only (a filter applied as each row group is read: a few
    passages of a corpus of millions without reading its text)."""
    return pq.read_table(Path(folder) / "corpus.parquet", filters=[("doc_id", "in", list(doc_ids))]).to_pandas()


def corpus_chunks(folder: str | Path, size: int) -> Iterator[pd.DataFrame]:
    """A data folder's whole corpus (doc_id, title, text), `size` rows at a time in row order: what a stage that reads
    every passage once (the BM25 index) holds of it."""
    # pre_buffer off: with it, the reader keeps every row group's bytes it read until it is closed (the whole file)
    table = pq.ParquetFile(Path(folder) / "corpus.parquet", pre_buffer=False)
    for batch in table.iter_batches(batch_size=size, columns=["doc_id", "title", "text"]):
        yield batch.to_pandas()
