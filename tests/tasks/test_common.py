"""Unit tests of the task layer's helpers: fault injection and what a cache key is made of."""

import pytest

from ance_core.artifacts import ArtifactRef
from ance_core.faults import drills_armed
from ance_core.negatives.config import MiningConfig
from ance_core.pipeline.report import StageTiming
from ance_core.training.config import TrainConfig
from tasks import common
from tasks.common import InjectedFault, _content, artifact_paths, inject_fault


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(common, "_fired", set())


def test_fault_fires_once_for_the_named_task(monkeypatch):
    monkeypatch.setenv("ANCE_FAULT", "encode-corpus")
    inject_fault("train")  # other tasks are untouched
    with pytest.raises(InjectedFault, match="encode-corpus"):
        inject_fault("encode-corpus")
    inject_fault("encode-corpus")  # the retry succeeds


def test_step_fault_fires_only_at_its_step(monkeypatch):
    monkeypatch.setenv("ANCE_FAULT", "train@3, evaluate")
    inject_fault("train")  # task start: no step yet
    inject_fault("train", step=2)
    with pytest.raises(InjectedFault, match="at step 3"):
        inject_fault("train", step=3)
    inject_fault("evaluate", step=3)  # a task-level fault does not fire inside training steps
    with pytest.raises(InjectedFault):
        inject_fault("evaluate")


def test_cache_key_content_uses_digests_not_paths_or_timings():
    a = ArtifactRef("/w/encode/abc", "abc", seconds=12.0, cached=False)
    b = ArtifactRef("/elsewhere/abc", "abc", seconds=0.1, cached=True)
    assert _content(a) == _content(b) == "abc"
    assert _content([StageTiming("warmup", "train", a)]) == _content([StageTiming("warmup", "train", b)])
    assert _content(MiningConfig(top_k=5)) != _content(MiningConfig(top_k=6))
    cadence = TrainConfig(checkpoint_every=7, checkpoint_seconds=30)  # when checkpoints are taken changes no result
    assert _content(cadence) == _content(TrainConfig()) != _content(TrainConfig(seed=1))
    assert artifact_paths({"checkpoint": a, "snapshots": [b], "refresh": {"x": 1}}) == [a.path, b.path]


def test_drills_are_armed_only_while_ance_fault_asks_for_one(monkeypatch):
    """The training writes each checkpoint before its step's drill may fire only when one is asked for (else in the
    background, training/checkpointing.py)."""
    monkeypatch.delenv("ANCE_FAULT", raising=False)
    assert not drills_armed()
    monkeypatch.setenv("ANCE_FAULT", "train@3")
    assert drills_armed()
    with common.faults_off():
        assert not drills_armed()


def test_stage_task_runs_are_named_after_the_model_and_split_they_ran_for(prefect_server, monkeypatch, tmp_path):
    """The Prefect UI's task runs read `encode-2`, `evaluate-5`: neither which model nor which split. Within
    `stages_for(label)` a stage's runs are named after the label (and its split, where it takes one); a stage that
    names its runs itself keeps its names."""
    import time

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from tasks.common import held_result, stage_task, stages_for

    monkeypatch.setenv("PREFECT_API_URL", prefect_server)

    @stage_task("probe-evaluate")
    def evaluate(split: str, salt: str) -> str:
        return split

    @stage_task("probe-shard", task_run_name="probe-shard-{n}")
    def shard(n: int, salt: str) -> int:
        return n

    @flow(name="named-task-runs")
    def named_runs(salt: str) -> None:
        with stages_for("ANCE round {1}"):  # (braces: the label is not a template)
            held_result(evaluate, "dev", salt)  # (run_task, without its ArtifactRef)
            held_result(shard, 3, salt)
        held_result(evaluate, "test", salt)

    state = named_runs(str(tmp_path), return_state=True)
    deadline, names = time.time() + 120, []
    while len(names) < 3 and time.time() < deadline:  # (the server records task runs from events: later when busy)
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
        names = sorted(r.name for r in runs)
        time.sleep(0.5)
    assert {"probe-evaluate (ANCE round {1}, dev)", "probe-shard-3"} < set(names) and len(names) == 3, names
    assert any(n.startswith("probe-evaluate-") for n in names), names  # no label: Prefect's own name
