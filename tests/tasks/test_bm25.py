"""BM25 runs share one saved index per corpus and config (bm25-index/<key>), memory-mapped: the same runs as an
index built in memory, built once for every split searched."""

import pandas as pd

from ance_core.artifacts import RUN, read_manifest
from ance_core.data.config import DataConfig
from ance_core.data.dataset import read_tables
from ance_core.retrieval.bm25 import BM25
from ance_core.retrieval.config import BM25Config
from tasks.bm25 import bm25_run
from tasks.data import prepare_data


def test_bm25_runs_of_two_splits_share_one_saved_index_and_match_an_index_in_memory(tiny_scifact, tmp_path):
    work = str(tmp_path / "work")
    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), work)
    tables = read_tables(data.path)
    in_memory = BM25(tables.corpus, BM25Config())
    for split in ("test", "train"):
        ref = bm25_run.fn(data, BM25Config(), split, 50, work)
        expected = in_memory.search(tables.split_queries(split).sort_values("query_id", kind="stable"), 50)
        pd.testing.assert_frame_equal(pd.read_parquet(f"{ref.path}/{RUN}").astype({"query_id": str, "doc_id": str}),
                                      expected.reset_index(drop=True), check_dtype=False)
    indexes = [p for p in (tmp_path / "work" / "bm25-index").iterdir() if not p.name.startswith(".")]
    assert len(indexes) == 1 and read_manifest(indexes[0])["summary"]["documents"] == len(tables.corpus)
    other = bm25_run.fn(data, BM25Config(k1=1.2), "test", 50, work)  # another config: another index
    assert len(list((tmp_path / "work" / "bm25-index").glob("[!.]*"))) == 2 and other.path != ref.path
