"""Mining a part of the queries reads only their rows of a run in query-id order, and a run written before issue 28
(another order, big row groups) still mines the same negatives."""

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ance_core.artifacts import POSITIVE_SCORES, RUN, ArtifactRef
from ance_core.negatives.config import MiningConfig
from ance_core.negatives.mining import sorted_ids
from ance_core.retrieval import search
from ance_core.retrieval.search import run_frame, write_run
from tasks.mine import mine_queries, ranking_rows

CORPUS = [f"d{i}" for i in range(500)]
QUERIES = sorted(f"q{i}" for i in range(60))


def _run(depth=20) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, set[str]]]:
    """A run of QUERIES x depth, its positives' scores, the positives (one per query, half of them ranked)."""
    rng = np.random.default_rng(0)
    ids = np.array([rng.choice(CORPUS, depth, replace=False) for _ in QUERIES], dtype=object)
    run = run_frame(QUERIES, ids, -np.sort(-rng.random((len(QUERIES), depth)), axis=1))
    positives = {q: {ids[i, 3] if i % 2 else f"d{400 + i}"} for i, q in enumerate(QUERIES)}
    scores = pd.DataFrame([(q, d, 0.5) for q, ds in positives.items() for d in ds],
                          columns=["query_id", "doc_id", "score"])
    return run, scores, positives


def _folder(path, run, scores, old: bool) -> ArtifactRef:
    path.mkdir()
    if old:  # as before: the split's order (here: shuffled), each query's rows in rank order, big row groups
        order = np.random.default_rng(1).permutation(QUERIES)
        pd.concat([run[run["query_id"] == q] for q in order]).to_parquet(path / RUN, index=False, row_group_size=300)
        scores.sample(frac=1, random_state=0).to_parquet(path / POSITIVE_SCORES, index=False, row_group_size=20)
    else:
        write_run(run, path / RUN)
        write_run(scores, path / POSITIVE_SCORES)
    return ArtifactRef(str(path), path.name)


@pytest.fixture
def small_row_groups(monkeypatch):
    monkeypatch.setattr(search, "RUN_ROW_GROUP", 100)  # 5 queries of 20 rows


def test_a_part_reads_only_the_row_groups_of_its_queries(tmp_path, small_row_groups):
    run, scores, _ = _run()
    ref = _folder(tmp_path / "new", run, scores, old=False)
    assert pq.ParquetFile(tmp_path / "new" / RUN).metadata.num_row_groups == 12
    part = QUERIES[12:19]
    rows = ranking_rows(tmp_path / "new" / RUN, part)
    got = set(rows["query_id"].to_pylist())
    assert set(part) <= got and len(rows) <= 200 + 2 * 100  # its 7 queries' rows, at most a row group each side
    expected = run[run["query_id"].isin(part)]
    read = rows.to_pandas().astype({"query_id": str})
    pd.testing.assert_frame_equal(read[read["query_id"].isin(part)].reset_index(drop=True),
                                  expected.reset_index(drop=True), check_dtype=False)
    assert ranking_rows(tmp_path / "new" / RUN, []).num_rows == 0
    assert ranking_rows(ref.path + "/" + RUN, None).num_rows == len(run)


def test_a_run_written_before_is_scanned_and_mines_the_same(tmp_path, small_row_groups):
    run, scores, positives = _run()
    new, old = (_folder(tmp_path / name, run, scores, old=name == "old") for name in ("new", "old"))
    part = QUERIES[12:19]
    rows = ranking_rows(tmp_path / "old" / RUN, part)  # the scan keeps the range's rows only
    assert sorted(set(rows["query_id"].to_pylist())) == part and len(rows) == 7 * 20
    ids = sorted_ids(CORPUS)
    for sampler in ("ance", "simans"):
        cfg = MiningConfig(sampler=sampler, top_k=15, num_negatives=3, skip_top=1)
        tables = {}
        for name, ref in (("new", new), ("old", old)):
            parts = [QUERIES[i:i + 7] for i in range(0, len(QUERIES), 7)]
            tables[name] = pd.concat([mine_queries(cfg, {q: positives[q] for q in p}, 2, {"dense": ref}, None,
                                                   positives, ids, None, p) for p in parts], ignore_index=True)
        pd.testing.assert_frame_equal(tables["old"], tables["new"])
        assert len(tables["new"]) == len(QUERIES) and (tables["new"]["fallback"] == 0).all()
        assert all(pos not in ids_ for pos, ids_ in zip(tables["new"]["positive_id"], tables["new"]["negative_ids"],
                                                          strict=True))
    assert isinstance(rows, pa.Table)


def _analysis_inputs(tmp_path):
    """A ranking folder, a data folder (its tables) and a mined negatives table in tmp_path/neg: the negatives
    analysis's inputs. (run, positives, table, ranking ref, data folder)"""
    run, scores, positives = _run()
    ranking = _folder(tmp_path / "run", run, scores, old=False)
    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame({"doc_id": CORPUS, "title": "", "text": "x"}).to_parquet(data / "corpus.parquet")
    pd.DataFrame({"query_id": QUERIES, "text": "q"}).to_parquet(data / "queries.parquet")
    pd.DataFrame([(q, d, 1, "train") for q, ds in positives.items() for d in ds],
                 columns=["query_id", "doc_id", "relevance", "split"]).to_parquet(data / "qrels.parquet")
    table = mine_queries(MiningConfig(top_k=20, num_negatives=3), positives, 1, {"dense": ranking}, None, positives,
                         sorted_ids(CORPUS), None, None)
    (tmp_path / "neg").mkdir()
    table.to_parquet(tmp_path / "neg" / "negatives.parquet")
    return run, positives, table, ranking, data


def test_negative_stats_read_only_the_sampled_queries_rows_and_match_the_whole_runs(tmp_path, small_row_groups,
                                                                                    monkeypatch):
    """The negatives analysis reads its sampled queries' rows of the model's ranking (a filter applied as each row
    group is read), not the whole run: its statistics are those computed from the whole run."""
    import json

    from ance_core.artifacts import STATS
    from ance_core.negatives.analysis import negative_stats, query_sample
    from tasks import analysis

    run, positives, table, ranking, data = _analysis_inputs(tmp_path)
    monkeypatch.setattr(analysis, "SAMPLE_QUERIES", 7)
    read, real = [], pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda path, *a, **kw: read.append((str(path), kw.get("filters"))) or
                        real(path, *a, **kw))
    out = analysis.negatives_analysis.fn(ArtifactRef(str(tmp_path / "neg"), "n"), ranking,
                                         ArtifactRef(str(data), "d"), "train", str(tmp_path / "work"))
    stats = json.loads((tmp_path / "work" / "negative-stats" / out.path.split("/")[-1] / STATS).read_text())
    sample = query_sample(table["query_id"], 7, analysis.SAMPLE_SEED)
    expected = negative_stats(table, run, positives, sample)
    assert {k: stats[k] for k in expected} == pytest.approx(expected) and stats["overlap_queries"] == 7
    assert [f for path, f in read if path.endswith(RUN)] == [[("query_id", "in", sample)]]  # the run: filtered


def test_the_share_above_the_positive_is_measured_on_a_fixed_sample_of_queries(tmp_path, small_row_groups,
                                                                              monkeypatch):
    """With the starting model, the share of negatives it scores above their positive is measured on the pairs of
    ABOVE_POSITIVE_QUERIES queries (a fixed sample), not by scoring every training query's pairs."""
    import json

    from ance_core.artifacts import STATS
    from ance_core.negatives.analysis import query_sample
    from tasks import analysis

    _, _, table, ranking, data = _analysis_inputs(tmp_path)
    scored = []

    def score_pairs(checkpoint, index, queries, pairs):  # the first negative of each pair above its positive
        scored.extend(pairs)
        first = {(r.query_id, r.negative_ids[0]) for r in table.itertuples()}
        return pd.DataFrame([(q, d, 2.0 if (q, d) in first else 1.0) for q, d in pairs],
                            columns=["query_id", "doc_id", "score"])

    monkeypatch.setattr(analysis, "score_pairs", score_pairs)
    monkeypatch.setattr(analysis, "ABOVE_POSITIVE_QUERIES", 9)
    start = {"checkpoint": ArtifactRef("ckpt", "c"), "index": ArtifactRef("index", "i")}
    out = analysis.negatives_analysis.fn(ArtifactRef(str(tmp_path / "neg"), "n"), ranking,
                                         ArtifactRef(str(data), "d"), "train", str(tmp_path / "work"), start)
    stats = json.loads((Path(out.path) / STATS).read_text())
    sample = set(query_sample(table["query_id"], 9, analysis.SAMPLE_SEED))
    assert {q for q, _ in scored} == sample and len(sample) == 9
    assert stats["negatives"] == 9 * 3 and stats["above_positive"] == pytest.approx(1 / 3)


def test_the_negatives_analysis_ranks_only_its_sampled_queries_unless_the_mining_ranked_them_all(tmp_path,
                                                                                                monkeypatch):
    """A model whose ranking of the training queries the next round's mining made is analysed against that ranking;
    the last model (no next round) gets a ranking of the analysis's sampled queries only, not of every training
    query."""
    from ance_core.negatives.analysis import query_sample
    from tasks import analysis

    (tmp_path / "neg").mkdir()
    pd.DataFrame({"query_id": QUERIES}).to_parquet(tmp_path / "neg" / "negatives.parquet")
    calls = []
    monkeypatch.setattr(analysis, "run_task", lambda task, *args: calls.append((task, args)) or ArtifactRef("r", "r"))
    monkeypatch.setattr(analysis, "SAMPLE_QUERIES", 7)
    negatives, mined = ArtifactRef(str(tmp_path / "neg"), "n"), ArtifactRef("mined", "m")
    ref = ArtifactRef("x", "x")
    analysis.analyse_negatives(negatives, ref, ref, ref, "train", None, None, "w", None, mined)
    assert [task for task, _ in calls] == [analysis.negatives_analysis] and calls[0][1][1] is mined
    calls.clear()
    analysis.analyse_negatives(negatives, ref, ref, ref, "train", None, None, "w")
    (task, args), (stats, stats_args) = calls
    assert task is analysis.dense_run and args[4] == analysis.DEPTH
    assert args[-1] == {"query_ids": query_sample(QUERIES, 7, analysis.SAMPLE_SEED)} and len(args[-1]["query_ids"]) == 7
    assert stats is analysis.negatives_analysis and stats_args[1].path == "r"


def test_a_stage_of_several_epochs_gets_a_draw_per_epoch(tmp_path):
    """epoch_draws: the epochs the training stage will take on the pairs mined (its max_steps over its steps per
    epoch, or its epochs), at most MAX_DRAWS; one for no stage or a sampler that mines nothing."""
    from ance_core.training.config import TrainConfig
    from tasks.mine import MAX_DRAWS, epoch_draws

    pd.DataFrame({"doc_id": CORPUS[:5], "title": "", "text": "x"}).to_parquet(tmp_path / "corpus.parquet")
    pd.DataFrame({"query_id": QUERIES, "text": "x"}).to_parquet(tmp_path / "queries.parquet")
    pd.DataFrame({"query_id": QUERIES, "doc_id": "d0", "relevance": 1, "split": "train"}).to_parquet(
        tmp_path / "qrels.parquet")
    data, mining = ArtifactRef(str(tmp_path), "data"), MiningConfig()
    assert epoch_draws(data, "train", mining, 1, None) == 1
    assert epoch_draws(data, "train", mining, 1, TrainConfig()) == 1
    assert epoch_draws(data, "train", mining, 1, TrainConfig(epochs=3)) == 3
    assert epoch_draws(data, "train", mining, 1, TrainConfig(epochs=50)) == MAX_DRAWS
    assert epoch_draws(data, "train", MiningConfig(sampler="in-batch"), 1, TrainConfig(epochs=3)) == 1
    # 60 pairs in batches of 16: 4 steps per epoch, 9 steps begin 3 epochs; a sample of 20 queries: 2 per epoch
    assert epoch_draws(data, "train", mining, 1, TrainConfig(max_steps=9, batch_size=16)) == 3
    assert epoch_draws(data, "train", MiningConfig(queries=20), 1, TrainConfig(max_steps=9, batch_size=16)) == 5


def test_bm25s_zero_score_filler_rows_are_no_candidates(tmp_path):
    """BM25 pads a query with few matches to its depth with score-0 rows that match no query term: one fixed block of
    the corpus. A query with two matches drew nearly all its warm-up negatives from that block."""
    rows = [("q0", "d1", 1, 3.2), ("q0", "d2", 2, 1.1)] + [("q0", f"d{100 + r}", r, 0.0) for r in range(3, 101)]
    ref = _folder(tmp_path / "bm25", pd.DataFrame(rows, columns=["query_id", "doc_id", "rank", "score"]),
                  pd.DataFrame(columns=["query_id", "doc_id", "score"]), old=False)
    positives = {"q0": {"d1"}}
    cfg = MiningConfig(sampler="bm25", top_k=100, num_negatives=2, seed=0)
    table = mine_queries(cfg, positives, 0, {"bm25": ref}, None, positives, sorted_ids(CORPUS), None, None)
    [negatives] = [set(ids) for ids in table["negative_ids"]]
    assert "d2" in negatives and not negatives & {f"d{100 + r}" for r in range(3, 101)}  # the match, then random
