"""Run files: written in query-id order, in small row groups whose statistics let mining skip the others."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from ance_core.retrieval import search
from ance_core.retrieval.search import RunWriter, run_frame, write_run


def test_a_run_line_whose_score_is_nan_is_left_out_with_a_warning_naming_it(tmp_path):
    """A score of nan was read as a number and ranked the query's other documents arbitrarily (another nDCG@10); an
    infinite score ranks, as trec_eval ranks it."""
    import pytest

    from ance_core.errors import AnceWarning

    (tmp_path / "run.trec").write_text("q1 Q0 d1 1 2.5 s\nq1 Q0 d2 2 nan s\nq1 Q0 d3 3 1.5 s\nq1 Q0 d4 4 -inf s\n"
                                       "q1 Q0 d5 5 inf s\n")
    with pytest.warns(AnceWarning, match=r"run.trec: 1 of its 5 rows cannot be read and is left out: line 2: score "
                      r"'nan' is not a number"):
        run = search.read_trec(tmp_path / "run.trec")
    assert run["doc_id"].tolist() == ["d5", "d1", "d3", "d4"] and run["rank"].tolist() == [1, 2, 3, 4]


def test_a_run_is_written_in_query_id_order_in_row_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(search, "RUN_ROW_GROUP", 4)
    run = pd.DataFrame({"query_id": ["q2", "q2", "q10", "q10", "q1", "q1", "q3"], "doc_id": list("abcdefg"),
                        "rank": [1, 2, 1, 2, 1, 2, 1], "score": [2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]})
    write_run(run, tmp_path / "run.parquet")
    back = pd.read_parquet(tmp_path / "run.parquet")
    assert back["query_id"].tolist() == ["q1", "q1", "q10", "q10", "q2", "q2", "q3"]  # string order, stable
    assert back["rank"].tolist() == [1, 2, 1, 2, 1, 2, 1]
    meta = pq.ParquetFile(tmp_path / "run.parquet").metadata
    stats = [meta.row_group(i).column(0).statistics for i in range(meta.num_row_groups)]
    assert [(s.min, s.max) for s in stats] == [("q1", "q10"), ("q2", "q3")]


def test_an_empty_first_part_still_gives_string_columns(tmp_path):
    with RunWriter(tmp_path / "run.parquet") as writer:
        writer.write(run_frame([], np.empty((0, 3), dtype=object), np.empty((0, 3), dtype=np.float32)))
        writer.write(run_frame(["q1"], np.array([["d1", None, None]], dtype=object), np.ones((1, 3))))
    assert pd.read_parquet(tmp_path / "run.parquet")["doc_id"].tolist() == ["d1"]
