"""Corpus encoding as mapped shard tasks (tasks/encode.py, tasks/execution.py): the same encode folder from the local
runner and from prefect-ray's RayTaskRunner on a real local Ray of 2 workers, a task run per shard in Prefect's API,
a shard whose worker is killed or whose task fails once retried, and a deleted shard rebuilt alone."""

import os
import shutil
import time
from pathlib import Path

import pytest
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

from ance_core.artifacts import ArtifactRef, read_manifest, run_stage
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.modeling.config import ModelConfig
from ance_core.modeling.model import init_model
from ance_core.negatives.config import MiningConfig
from ance_core.retrieval.config import EncodeConfig, ExecutionConfig
from ance_core.stage_config import KEY_DUMP
from ance_core.system_metrics import SYSTEM_METRICS
from flows.stages import encode_flow
from tasks.common import stage_task
from tasks.execution import run_mapped

pytestmark = pytest.mark.slow
SHARD_SIZE = 64  # the tiny corpus's 200 documents: 4 shards


def _encode(checkpoint, dataset, work, execution):
    state = encode_flow(str(checkpoint), DataConfig(dataset=str(dataset)),
                        EncodeConfig(shard_size=SHARD_SIZE, batch_size=32), str(work), execution, return_state=True)
    return Path(state.result()["encode"]), state.state_details.flow_run_id


def _files(folder) -> dict[str, bytes]:
    """The folder's outputs (not its manifest, nor the system metrics sampled while it was built)."""
    return {p.name: p.read_bytes() for p in sorted(Path(folder).iterdir())
            if p.name not in ("manifest.json", SYSTEM_METRICS)}


def _task_runs(flow_run_id, done, timeout: float = 120) -> list:
    """The flow run's task runs, once `done(runs)` holds (the server records them from the runs' events: later on a
    busy machine), or what it has at the deadline."""
    deadline = time.time() + timeout
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        if done(runs) or time.time() > deadline:
            return runs
        time.sleep(1)


def _shard_task_runs(flow_run_id, shards: int = 4) -> list:
    """The shard task runs of a flow run, once all of them are recorded in a final state."""
    runs = _task_runs(flow_run_id, lambda runs: sum(r.name.startswith("encode-shard-") and r.state.is_final()
                                                    for r in runs) == shards)
    return sorted((r for r in runs if r.name.startswith("encode-shard-")), key=lambda r: r.name)


@pytest.fixture(scope="module")
def checkpoint(tiny_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("scale") / "checkpoint"
    init_model(ModelConfig(name=str(tiny_model), passage_max_length=48), out)
    return out


def test_ray_encodes_the_corpus_as_local_does_with_a_task_per_shard_retried_after_failures(
        checkpoint, tiny_scifact, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    # `address: null` is a Ray of the run's own, whatever cluster the environment names (found by a review: Ray
    # joined RAY_ADDRESS's, or a `ray start --head` of this machine, and refused num_cpus there)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    local, local_run = _encode(checkpoint, tiny_scifact, tmp_path / "local", ExecutionConfig())
    assert len(_shard_task_runs(local_run)) == 4
    assert read_manifest(local)["summary"]["workers"] == [f"{os.uname().nodename}:{os.getpid()}"]

    # in the Ray workers: the first shard task to start kills its worker (once, across processes), and each worker
    # process's first shard task fails once
    monkeypatch.setenv("ANCE_FAULT", "encode-shard:exit,encode-shard")
    monkeypatch.setenv("ANCE_FAULT_SIGNAL", str(tmp_path / "killed"))
    ray.shutdown()  # Ray starts with this environment (tasks/execution.py forwards ANCE_FAULT to the workers)
    try:
        remote, remote_run = _encode(checkpoint, tiny_scifact, tmp_path / "ray",
                                     ExecutionConfig(task_runner="ray", workers=2))
    finally:
        ray.shutdown()
    assert (tmp_path / "killed").is_file()  # a worker was killed in a shard task
    assert _files(remote) == _files(local)  # byte-identical embeddings, same doc-id order
    summary = read_manifest(remote)["summary"]
    assert summary["task_runner"] == "ray" and summary["shards"] == 4
    assert f"{os.uname().nodename}:{os.getpid()}" not in summary["workers"]  # the work ran in Ray's workers
    runs = _shard_task_runs(remote_run)
    assert [r.name for r in runs] == [f"encode-shard-{k}" for k in range(4)]  # one task run per shard
    assert all(r.state.is_completed() for r in runs)
    assert any(r.run_count > 1 for r in runs)  # a failed shard task was retried


def test_a_ray_shard_whose_folder_gc_removed_before_its_record_is_built_again(checkpoint, tiny_scifact, tmp_path,
                                                                               monkeypatch):
    """On Ray a shard is built on a worker (no run_stage in this process) and recorded here once it has ended: a gc
    in that window (a real one, just before the first shard's record, its grace for unrecorded folders set to 0)
    must not leave the encoding a missing shard; the shard is built again, here, and the encoding is the same (issue
    41 item 4)."""
    ray = pytest.importorskip("ray")
    import ance_core.retention as retention
    import tasks.execution as execution

    local, _ = _encode(checkpoint, tiny_scifact, tmp_path / "local", ExecutionConfig())
    work, removed, hold = tmp_path / "ray", [], execution.hold_refs

    def gc_first(result):
        if not removed:  # the first shard's record: a garbage collection runs first
            monkeypatch.setattr(retention, "GRACE_SECONDS", 0)  # (a folder no run recorded is otherwise kept 1 h)
            retention.collect(work, retention.RetentionConfig(keep_runs=1))
            removed.append(result.path)
            assert not Path(result.path).exists()  # gc took it
        return hold(result)

    monkeypatch.setattr(execution, "hold_refs", gc_first)
    ray.shutdown()
    try:
        remote, _ = _encode(checkpoint, tiny_scifact, work, ExecutionConfig(task_runner="ray", workers=2))
    finally:
        ray.shutdown()
    assert removed and Path(removed[0], "manifest.json").is_file()  # built again, into the same folder
    assert _files(remote) == _files(local)

def test_a_deleted_shard_is_rebuilt_alone(checkpoint, tiny_scifact, tmp_path):
    work = tmp_path / "work"
    first, _ = _encode(checkpoint, tiny_scifact, work, ExecutionConfig())
    files = _files(first)
    shards = sorted((work / "encode-shard").iterdir())
    assert len(shards) == 4
    shutil.rmtree(first)
    shutil.rmtree(shards[2])
    again, _ = _encode(checkpoint, tiny_scifact, work, ExecutionConfig())
    assert again == first and _files(again) == files
    assert read_manifest(again)["summary"]["cached_shards"] == 3


def test_a_shard_task_reads_only_its_rows(tmp_path):
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tasks.encode import read_rows

    table = pd.DataFrame({"doc_id": [str(k) for k in range(1000)], "text": [f"text {k}" for k in range(1000)]})
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), tmp_path / "c.parquet", row_group_size=128)
    corpus = pq.ParquetFile(tmp_path / "c.parquet")
    assert corpus.metadata.num_row_groups == 8
    for start, stop in ((0, 64), (100, 300), (128, 256), (990, 1000), (0, 1000), (1000, 1000)):
        assert read_rows(corpus, start, stop)["doc_id"].tolist() == table["doc_id"][start:stop].tolist()


def test_the_rounds_mine_from_an_approximate_index_in_parts_and_evaluation_stays_exact(tiny_scifact, tiny_model,
                                                                                       tmp_path):
    """index: {type: ivf, shards: 2}: the round's mining searches a 2-part IVF index built from the evaluation's
    encoding; every model is evaluated on an exact flat index (one per model, none of them IVF)."""
    from ance_core.retrieval.index import SearchIndex
    from tests.tiny import run_pipeline_cli, tiny_pipeline_config

    config = tiny_pipeline_config(tiny_scifact, tiny_model, tmp_path / "work", rounds=1, steps=2)
    config |= {"index": {"type": "ivf", "shards": 2, "nlist": 4, "nprobe": 2}, "compression": None}
    result, _ = run_pipeline_cli(config, tmp_path)
    indexes = [p for p in (tmp_path / "work" / "index").iterdir() if not p.name.startswith(".")]
    kinds = sorted(read_manifest(p)["summary"]["type"] for p in indexes)
    # flat: zero-shot, warm-up, round 1 (evaluation); IVF: the warm-up model's, which the round mined from
    assert kinds == ["IndexFlatIP"] * 3 + ["IndexIVFFlat"], kinds
    ivf = next(p for p in indexes if read_manifest(p)["summary"]["type"] == "IndexIVFFlat")
    assert sorted(f.name for f in ivf.iterdir() if f.name.startswith("index")) == ["index-part-0000",
                                                                                    "index-part-0001"]
    assert len(SearchIndex(ivf)) == 200 and result["ndcg_at_10"] >= 0


@pytest.mark.parametrize("sampler", ["simans", "ance+bm25"])
def test_mining_the_queries_in_parts_gives_the_table_of_all_at_once(checkpoint, tiny_scifact, tmp_path, monkeypatch,
                                                                    sampler):
    """tasks/mine.py mines MINE_CHUNK queries at a time (the row groups of their rankings' rows only: the runs are
    written in query-id order, here in row groups of 64 rows): the same negatives, in the same order, as mining every
    query at once."""
    import pandas as pd
    import pyarrow.parquet as pq

    from ance_core.artifacts import NEGATIVES, RUN
    from ance_core.retrieval import search
    from flows.stages import refresh_negatives_flow
    from tasks import mine

    def negatives(work):
        out = refresh_negatives_flow(str(checkpoint), DataConfig(dataset=str(tiny_scifact)), EncodeConfig(),
                                     mining=MiningConfig(sampler=sampler, num_negatives=3, seed=5),
                                     work_dir=str(work))
        return pd.read_parquet(Path(out["mine"], NEGATIVES))

    monkeypatch.setattr(search, "RUN_ROW_GROUP", 64)
    whole = negatives(tmp_path / "whole")
    monkeypatch.setattr(mine, "MINE_CHUNK", 7)
    read, ranking_rows = [], mine.ranking_rows

    def counted(path, ids):
        read.append((path, ranking_rows(path, ids)))
        return read[-1][1]

    monkeypatch.setattr(mine, "ranking_rows", counted)
    parts = negatives(tmp_path / "parts")
    assert whole["query_id"].nunique() > 3 * 7  # several parts
    pd.testing.assert_frame_equal(parts, whole)
    runs = [(len(rows), pq.read_metadata(path).num_rows) for path, rows in read if path.name == RUN]
    assert len(runs) >= 3 and all(rows < total / 2 for rows, total in runs), runs  # a part's row groups at a time


def test_a_shard_that_keeps_failing_is_retried_alone_and_fails_the_encoding_once(checkpoint, tiny_scifact, tmp_path,
                                                                                 monkeypatch):
    """A failure that is not the user's (a worker's disk, a flaky mount: retried) fails every shard: the first shard
    task runs its 3 attempts, and the encode-corpus task fails once, naming it, instead of retrying the shards again
    (3 x 3 attempts). (A corrupt checkpoint did it before; it is a user error now, said once, not retried.)"""
    import tasks.encode

    def unreadable(*args, **kwargs):
        raise OSError("Input/output error")

    monkeypatch.setattr(tasks.encode, "core_encode_shard", unreadable)
    state = encode_flow(str(checkpoint), DataConfig(dataset=str(tiny_scifact)), EncodeConfig(shard_size=SHARD_SIZE),
                        str(tmp_path / "work"), ExecutionConfig(), return_state=True)
    assert state.is_failed()
    runs = _task_runs(state.state_details.flow_run_id, lambda runs: any(
        r.name.startswith("encode-corpus") and r.state.is_final() for r in runs))
    attempts = {r.name: r.run_count for r in runs if r.name.startswith(("encode-shard", "encode-corpus"))}
    assert attempts.pop("encode-shard-0") == 3 and set(attempts) == {next(n for n in attempts if "corpus" in n)}
    assert list(attempts.values()) == [1]
    with pytest.raises(Exception, match="encode-shard call 1 of 4 failed after its retries"):
        state.result()


def test_mining_queries_ranks_mines_and_trains_a_seeded_sample_drawn_again_each_round(checkpoint, tiny_scifact,
                                                                                        tmp_path):
    """`mining.queries: n`: the dense and BM25 rankings and the negatives hold the same n training queries, a sample
    that changes with the round; unset, the config's key is the one it had before the option (nested in a stage key
    by its repr, too)."""
    import pandas as pd

    from ance_core.artifacts import NEGATIVES, RUN
    from ance_core.data.dataset import read_tables
    from ance_core.negatives.randomness import round_sample
    from flows.stages import refresh_negatives_flow

    data = DataConfig(dataset=str(tiny_scifact))
    chosen = []
    for round_ in (1, 2):
        out = refresh_negatives_flow(str(checkpoint), data, EncodeConfig(), round_number=round_,
                                     mining=MiningConfig(sampler="ance+bm25", queries=5), work_dir=str(tmp_path))
        rankings = [set(pd.read_parquet(Path(out[stage], RUN))["query_id"]) for stage in ("retrieve", "bm25")]
        mined = set(pd.read_parquet(Path(out["mine"], NEGATIVES))["query_id"])
        assert rankings[0] == rankings[1] == mined and len(mined) == 5
        chosen.append(mined)
    assert chosen[0] != chosen[1]
    all_train = set(read_tables(next((tmp_path / "data").glob("[!.]*"))).positives("train"))
    assert chosen[1] == set(round_sample(list(all_train), 5, 42, 2)) and len(all_train) > 5
    assert "queries" not in str(MiningConfig()) and "queries" not in MiningConfig().model_dump(context=KEY_DUMP)


@stage_task("mapped-or-not")
def _maybe(work_dir: str, name: str) -> ArtifactRef:
    if name.startswith("bad"):
        raise AnceError(f"{name}: the loss is nan")  # a user error: not retried
    return run_stage(work_dir, "encode", {"name": name}, {}, lambda out: (out / "name.txt").write_text(name) and None)


@flow(name="mapped-with-errors")
def _mapped_with_errors(work_dir: str, names: list[str], execution: ExecutionConfig) -> list:
    return [r if isinstance(r, ArtifactRef) else f"{type(r).__name__}: {r}"
            for r in run_mapped(_maybe, [{"work_dir": work_dir, "name": n} for n in names], execution, errors=True)]


@pytest.mark.parametrize("runner", ["local", "ray"])
def test_mapped_calls_with_errors_all_run_and_a_failed_one_holds_its_error(runner, tmp_path):
    """`run_mapped(errors=True)` (the recipe search's trials): every call runs to its end, each failed one's place
    holds its error, the others their folders; without it the first failure is raised."""
    if runner == "ray":
        ray = pytest.importorskip("ray")
        ray.shutdown()
    execution = ExecutionConfig(task_runner=runner, workers=2)
    try:
        names = ["a", "bad-1", "b", "bad-2"]
        out = _mapped_with_errors(str(tmp_path / "work"), names, execution)
    finally:
        if runner == "ray":
            ray.shutdown()
    assert out[1] == "AnceError: bad-1: the loss is nan" and out[3] == "AnceError: bad-2: the loss is nan"
    assert [Path(r.path, "name.txt").read_text() for r in (out[0], out[2])] == ["a", "b"]
    with pytest.raises(AnceError, match="bad-1"):
        flow(name="mapped")(lambda: run_mapped(_maybe, [{"work_dir": str(tmp_path / "w2"), "name": n}
                                                        for n in names], ExecutionConfig()))()
    outside = run_mapped(_maybe, [{"work_dir": str(tmp_path / "w3"), "name": n} for n in names], ExecutionConfig(),
                         errors=True)  # (the functions called outside Prefect, as bench/ does: the same contract)
    assert [type(r).__name__ for r in outside] == ["ArtifactRef", "AnceError", "ArtifactRef", "AnceError"]
