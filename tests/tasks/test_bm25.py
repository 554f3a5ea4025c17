"""BM25 runs share one saved index per corpus and config (bm25-index/<key>), memory-mapped: the same runs as an
index built in memory, built once for every split searched."""

import pandas as pd

from ance_core.artifacts import RUN, read_manifest
from ance_core.data.config import DataConfig
from ance_core.data.dataset import read_tables
from ance_core.retrieval.bm25 import BM25
from ance_core.retrieval.config import BM25Config, EvalConfig
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


def test_the_evaluation_depth_is_in_no_key_of_the_training_chain(tiny_scifact, tmp_path):
    """`bm25.top_k` is how deep the BM25 baseline is evaluated: changing it re-runs that evaluation, not the index nor
    the warm-up's candidates (issue 41: it used to rebuild the index and retrain every stage)."""
    from ance_core.negatives.config import MiningConfig

    work = str(tmp_path / "work")
    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), work)
    shallow, deep = BM25Config(top_k=20), BM25Config(top_k=1000)
    depth = MiningConfig().depth
    runs = [bm25_run.fn(data, cfg.scoring(), "train", depth, work) for cfg in (shallow, deep)]
    assert runs[0].path == runs[1].path and shallow.scoring() == deep.scoring() == BM25Config()
    assert len(list((tmp_path / "work" / "bm25-index").glob("[!.]*"))) == 1
    baseline = bm25_run.fn(data, shallow, "test", shallow.top_k, work)  # the baseline itself: its own depth
    assert len(list((tmp_path / "work" / "bm25-index").glob("[!.]*"))) == 1 and baseline.path != runs[0].path
    # the warm-up's negatives, through the cached tasks a pipeline runs: the same folders at either depth
    from ance_core.retrieval.config import EncodeConfig, IndexConfig
    from tasks.refresh import refresh_negatives

    mining = MiningConfig(sampler="bm25")
    refs = [refresh_negatives(None, data, "train", EncodeConfig(), IndexConfig(), mining, 0, work, cfg)
            for cfg in (shallow, deep)]
    assert refs[0]["bm25"].path == refs[1]["bm25"].path and refs[1]["bm25"].cached
    assert refs[0]["mine"].path == refs[1]["mine"].path and refs[1]["mine"].cached


def test_with_dev_checks_the_evaluation_depth_leaves_the_training_stages_key(tiny_scifact, tmp_path):
    """With `dev_check` on, the BM25 dev run (made at `bm25.top_k`) feeds the dev checks' candidate set: rankings of
    either depth give the same pairs, and the training stage is keyed by those pairs, not by the run they came from
    (issue 41: `top_k` retrained every stage when dev checks were on)."""
    from ance_core.retrieval.config import EncodeConfig
    from ance_core.training.config import DevCheckConfig
    from tasks.train import DevInputs, dev_candidates

    work = str(tmp_path / "work")
    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), work)
    dev = [DevInputs(dev_candidates.fn([bm25_run.fn(data, BM25Config(top_k=k), "test", k, work)], data, "test", 5,
                                       work), "test", DevCheckConfig(), None, EncodeConfig()) for k in (20, 1000)]
    assert dev[0].candidates.path != dev[1].candidates.path  # (the runs differ: each its own folder)
    assert dev[0].content() == dev[1].content()
    fewer = dev_candidates.fn([bm25_run.fn(data, BM25Config(top_k=2), "test", 2, work)], data, "test", 5, work)
    assert DevInputs(fewer, "test", DevCheckConfig(), None, EncodeConfig()).content() != dev[0].content()


def test_bm25_is_evaluated_on_its_matches_not_its_filler(tiny_scifact, tmp_path):
    """BM25 fills a query's run to its depth with documents that match no query term (score 0): they were scored as
    retrieved, arbitrary documents that could be relevant (BEIR's BM25 returns no such rows), in R@1000 most."""
    from ance_core.retrieval.evaluate import evaluate_run
    from ance_core.retrieval.search import read_trec
    from tasks.evaluate import evaluate

    work = str(tmp_path / "work")
    data = prepare_data.fn(DataConfig(dataset=str(tiny_scifact)), work)
    run = bm25_run.fn(data, BM25Config(), "test", 1000, work)  # 200 documents: every query's run is filled to 200
    rows = pd.read_parquet(f"{run.path}/{RUN}")
    assert (rows["score"] == 0).any()
    scored = evaluate.fn(run, data, "test", work)
    written = read_trec(f"{scored.path}/run.trec")
    assert len(written) == (rows["score"] > 0).sum() and (written["score"] > 0).all()
    qrels = read_tables(data.path, corpus_columns=[]).split_qrels("test")
    with_filler = evaluate_run(rows, qrels)[0]
    assert read_manifest(scored.path)["summary"]["recall_at_1000"] < with_filler["recall_at_1000"]
    # eval.relevant_grade: an evaluation of its own (SciFact grades every relevant document 1: none counts at 2)
    graded = evaluate.fn(run, data, "test", work, EvalConfig(relevant_grade=2))
    binary, strict = read_manifest(scored.path)["summary"], read_manifest(graded.path)["summary"]
    assert graded.path != scored.path and strict["mrr_at_10"] == strict["recall_at_1000"] == 0.0
    assert strict["ndcg_at_10"] == binary["ndcg_at_10"] > 0
