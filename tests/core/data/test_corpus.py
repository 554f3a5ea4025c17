import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import ance_core.data.corpus as corpus_module
from ance_core.data.corpus import FrameCorpus, ParquetCorpus
from ance_core.data.dataset import passage_texts


@pytest.fixture
def corpus_file(tmp_path, monkeypatch) -> tuple[pd.DataFrame, ParquetCorpus]:
    """25 documents in row groups of 10 (as save_tables writes, smaller), some titled, read in batches of 4."""
    frame = pd.DataFrame({"doc_id": [f"d{i}" for i in range(25)],
                          "title": [f"t{i}" if i % 3 else "" for i in range(25)],
                          "text": [f"text {i}" for i in range(25)]})
    frame.to_parquet(tmp_path / "corpus.parquet", index=False, row_group_size=10)
    monkeypatch.setattr(corpus_module, "CORPUS_ROW_GROUP", 4)
    return frame, ParquetCorpus.of_folder(tmp_path)


def test_ids_map_to_rows_and_unknown_ids_to_minus_one(corpus_file):
    frame, corpus = corpus_file
    assert corpus.size == 25
    assert corpus.rows_of(["d3", "nope", "d24", "d0"]).tolist() == [3, -1, 24, 0]
    assert FrameCorpus(frame).rows_of(["d3", "nope", "d24", "d0"]).tolist() == [3, -1, 24, 0]


def test_passages_are_the_joined_texts_of_the_rows_asked_for_only(corpus_file, monkeypatch):
    """Rows in two of the three row groups: the third is never decoded, and only the asked rows come back, each as
    passage_texts joins it (title and text)."""
    frame, corpus = corpus_file
    decoded = []
    original = pq.ParquetFile.iter_batches

    def spy(self, *args, row_groups=None, **kwargs):
        decoded.extend(row_groups)
        return original(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", spy)
    rows = np.array([1, 2, 9, 21, 24])
    parts = list(corpus.passages(rows))
    assert decoded == [0, 2]
    assert np.concatenate([r for r, _ in parts]).tolist() == rows.tolist()
    assert [t for _, ts in parts for t in ts] == passage_texts(frame.iloc[rows])
    assert [len(r) for r, _ in parts] == [2, 1, 1, 1]  # one part per batch of 4 rows (in a group) that holds some
    framed = list(FrameCorpus(frame).passages(rows))
    assert [t for _, ts in framed for t in ts] == passage_texts(frame.iloc[rows])
