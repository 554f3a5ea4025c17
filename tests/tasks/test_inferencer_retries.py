"""Unit tests of the deployment inferencer's tries (Prefect replaced by fakes; the real server and workers are in
test_inferencer.py): each try is a flow run with its own idempotency key, so a resumed trainer follows the run it
had started, and a run that had already failed before the trainer resumed does not use up the resumed trainer's
retries."""

import datetime
import json
import logging
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prefect.client.schemas.objects import WorkerStatus
from prefect.client.schemas.responses import SetStateStatus
from prefect.states import Completed, Failed, Running, Scheduled

import tasks.inferencer as inferencer
from ance_core.artifacts import ArtifactRef
from ance_core.data.config import DataConfig
from ance_core.errors import AnceError
from ance_core.negatives.config import InferencerConfig, MiningConfig
from ance_core.retrieval.config import EncodeConfig, ExecutionConfig, IndexConfig


class FakeServer:
    """run_deployment as the server answers it: a known idempotency key returns that key's flow run (in the state
    it reached), a new key creates a scheduled run. `outcomes[name]` is what following that run finds."""

    def __init__(self, earlier: dict, outcomes: dict, result_file):
        self.runs = {key: SimpleNamespace(id=uuid.uuid4(), name=name, state=state)
                     for key, (name, state) in earlier.items()}
        self.outcomes, self.result_file, self.created = outcomes, result_file, []
        self.writes = True  # a completed run writes its result file

    def run_deployment(self, name, parameters, timeout, flow_run_name, idempotency_key, tags):
        assert timeout == 0 and parameters["result_file"] == str(self.result_file)
        if idempotency_key not in self.runs:
            self.created.append(flow_run_name)
            self.runs[idempotency_key] = SimpleNamespace(id=uuid.uuid4(), name=flow_run_name, state=None)
        return self.runs[idempotency_key]

    def follow(self, flow_run):
        problem = self.outcomes[flow_run.name]
        if problem is None and self.writes:
            self.result_file.write_text(json.dumps({"mine": f"mined-by-{flow_run.name}"}))
        return problem


def refresh(tmp_path, monkeypatch, earlier: dict, outcomes: dict, retries: int = 2):
    result_file = tmp_path / "trainer" / inferencer.RESULTS / "step-6.json"
    prefix = f"trainer-key-{inferencer._folder_id(tmp_path / 'trainer')}-refresh-negatives/refresh-negatives"
    earlier = {f"{prefix}-{key}": run for key, run in earlier.items()}
    server = FakeServer(earlier, outcomes, result_file.resolve())
    monkeypatch.setattr(inferencer, "run_deployment", server.run_deployment)
    remote = inferencer.DeploymentInferencer(InferencerConfig(mode="deployment", retries=retries), DataConfig(),
                                             logging.getLogger("test"))
    monkeypatch.setattr(remote, "_follow", server.follow)
    args = {"encode": EncodeConfig(), "index": IndexConfig(), "mining": MiningConfig(),
            "execution": ExecutionConfig(), "work_dir": tmp_path}
    snapshot = ArtifactRef(path=str(tmp_path / "snap"), digest="d")
    return server, lambda: remote.refresh(snapshot, 6, 1, args, tmp_path / "trainer", "trainer-key")


def test_a_failed_try_is_replaced_until_retries_run_out(tmp_path, monkeypatch):
    server, run = refresh(tmp_path, monkeypatch, {}, {"refresh-step-6-try-0": "crashed: worker lost",
                                                      "refresh-step-6-try-1": None})
    assert run() == "mined-by-refresh-step-6-try-1"
    assert server.created == ["refresh-step-6-try-0", "refresh-step-6-try-1"]

    outcomes = {f"refresh-step-6-try-{k}": f"ended Failed: {k}" for k in range(3)}
    server, run = refresh(tmp_path, monkeypatch, {}, outcomes)
    with pytest.raises(AnceError, match="every flow run of the step-6 refresh failed.*try-0.*try-1.*try-2"):
        run()
    assert len(server.created) == 3


def test_a_resumed_trainer_follows_its_running_try_and_skips_failed_ones(tmp_path, monkeypatch):
    # the earlier trainer process used up its three tries on failures: the resumed one gets three more
    earlier = {f"step-6-try-{k}": (f"refresh-step-6-try-{k}", Failed()) for k in range(3)}
    server, run = refresh(tmp_path, monkeypatch, earlier, {"refresh-step-6-try-3": None})
    assert run() == "mined-by-refresh-step-6-try-3"
    assert server.created == ["refresh-step-6-try-3"]

    # one failed, the next still running when the trainer died: followed, not started again
    earlier = {"step-6-try-0": ("refresh-step-6-try-0", Failed()), "step-6-try-1": ("refresh-step-6-try-1", Running())}
    server, run = refresh(tmp_path, monkeypatch, earlier, {"refresh-step-6-try-1": None})
    assert run() == "mined-by-refresh-step-6-try-1" and server.created == []

    # already completed: its result is read, nothing runs
    earlier = {"step-6-try-0": ("refresh-step-6-try-0", Completed())}
    server, run = refresh(tmp_path, monkeypatch, earlier, {"refresh-step-6-try-0": None})
    assert run() == "mined-by-refresh-step-6-try-0" and server.created == []


class FakeClient:
    """The Prefect client as _follow uses it: the flow run's states in turn (the last one stays), its worker's
    heartbeats, and the states the trainer set (`refuse`: the server refuses them, the run having `then` instead)."""

    def __init__(self, states, worker=None, refuse_with=None):
        self.states, self.worker, self.refuse_with, self.set = list(states), worker, refuse_with, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def read_flow_run(self, flow_run_id):
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        if isinstance(state, Exception):
            raise state
        labels = {"prefect.worker.name": "infer-1"} if self.worker else {}
        return SimpleNamespace(id=flow_run_id, name="refresh-step-6-try-0", state=state, labels=labels,
                               work_pool_name="infer")

    def read_workers_for_work_pool(self, pool):
        return [self.worker] if self.worker else []

    def set_flow_run_state(self, flow_run_id, state, force=False):
        self.set.append((state.type.value, force))
        if self.refuse_with is not None and not force:
            self.states = [self.refuse_with]
            return SimpleNamespace(status=SetStateStatus.ABORT)
        self.states = [state]
        return SimpleNamespace(status=SetStateStatus.ACCEPT)


def follow(monkeypatch, client, **cfg):
    monkeypatch.setattr(inferencer, "get_client", lambda sync_client: client)
    remote = inferencer.DeploymentInferencer(InferencerConfig(mode="deployment", poll_seconds=0.01, **cfg),
                                             DataConfig(), logging.getLogger("test"))
    return remote, SimpleNamespace(id=uuid.uuid4(), name="refresh-step-6-try-0", work_pool_name="infer")


def test_a_worker_that_stops_beating_loses_its_run_whatever_the_clocks_say(monkeypatch):
    # its last heartbeat is stamped a day ahead (another clock): only whether it changes counts
    worker = SimpleNamespace(name="infer-1", status=WorkerStatus.ONLINE, heartbeat_interval_seconds=0.02,
                             last_heartbeat_time=datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=1))
    client = FakeClient([Running()], worker)
    remote, run = follow(monkeypatch, client)
    problem = remote._follow(run)
    assert problem.startswith("crashed: its worker infer-1 sent no heartbeat") and client.set == [("CRASHED", False)]


def test_a_run_that_completes_while_it_is_given_up_keeps_its_result(monkeypatch):
    worker = SimpleNamespace(name="infer-1", status=WorkerStatus.OFFLINE, heartbeat_interval_seconds=5,
                             last_heartbeat_time=None)
    client = FakeClient([Running()], worker, refuse_with=Completed())  # it completed between the read and the write
    remote, run = follow(monkeypatch, client)
    assert remote._follow(run) is None and client.set == [("CRASHED", False)]


def test_api_errors_are_polled_through_and_timeouts_cancel(monkeypatch):
    down = httpx.ConnectError("connection refused")
    client = FakeClient([down, down, Running(), Completed()])
    remote, run = follow(monkeypatch, client)
    assert remote._follow(run) is None and client.set == []

    client = FakeClient([Running()], SimpleNamespace(name="infer-1", status=WorkerStatus.ONLINE,
                                                     heartbeat_interval_seconds=30, last_heartbeat_time=None))
    remote, run = follow(monkeypatch, client, timeout_s=0.05)
    assert remote._follow(run).startswith("cancelled: not finished 0.05 s")
    assert client.set == [("CANCELLING", False)]  # taken by a worker: it stops the run


def test_training_that_finishes_first_cancels_the_refresh(tmp_path, monkeypatch):
    client = FakeClient([Scheduled()])  # no worker took it
    remote, run = follow(monkeypatch, client)
    remote.stop()
    assert remote._follow(run) == inferencer.STOPPED and client.set == [("CANCELLED", False)]


def test_a_completed_run_without_its_result_is_a_failed_try(tmp_path, monkeypatch):
    server, run_refresh = refresh(tmp_path, monkeypatch, {}, {f"refresh-step-6-try-{k}": None for k in range(3)})
    server.writes = False  # completed, but its result file is missing
    read = inferencer._read_result
    monkeypatch.setattr(inferencer, "_read_result", lambda path: read(path, wait_s=0.1))
    with pytest.raises(AnceError, match="try-2: completed without a readable result in .*step-6.json"):
        run_refresh()
    assert len(server.created) == 3


def test_the_refresh_flow_run_gets_the_runs_bm25_and_every_parameter_binds(tmp_path, monkeypatch):
    """The deployment's refresh mines with the run's BM25 (ance+bm25: issue 41 found it mined with BM25's defaults,
    from a second index), and each parameter is one the flow takes."""
    import inspect

    from ance_core.retrieval.config import BM25Config
    from flows.stages import refresh_negatives_flow

    sent = {}

    def run_deployment(name, parameters, timeout, flow_run_name, idempotency_key, tags):
        sent.update(parameters)
        raise RuntimeError("stop here")  # the parameters are what is checked

    monkeypatch.setattr(inferencer, "run_deployment", run_deployment)
    monkeypatch.setattr(inferencer, "_transient_retried", lambda fn, *a, **k: fn(*a, **k))
    remote = inferencer.DeploymentInferencer(InferencerConfig(mode="deployment"), DataConfig(), logging.getLogger("t"))
    args = {"encode": EncodeConfig(), "index": IndexConfig(), "mining": MiningConfig(sampler="ance+bm25"),
            "execution": ExecutionConfig(), "work_dir": tmp_path, "bm25": BM25Config(k1=1.2)}
    with pytest.raises(RuntimeError, match="stop here"):
        remote.refresh(ArtifactRef(str(tmp_path / "snap"), "d"), 6, 1, args, tmp_path / "trainer", "key")
    inspect.signature(refresh_negatives_flow.fn).bind(**sent)
    assert BM25Config.model_validate(sent["bm25"]) == BM25Config(k1=1.2)
    # options at their unsaid values are not sent (a review: since a config's plain dump holds them, a deployment
    # registered by code from before one existed would refuse the run, its configs forbidding unknown keys)
    assert not {"judged_only", "teacher", "queries"} & set(sent["mining"]) and "dev_fold" not in sent["data"]
    assert MiningConfig.model_validate(sent["mining"]) == args["mining"]


def test_a_try_whose_folders_gc_removed_before_the_trainer_recorded_them_is_replaced(tmp_path, monkeypatch):
    """A refresh built on another worker is recorded by the trainer's run when it reads the result file: a gc that
    removed its folders in between makes that try a failed one (a new try builds them again), never negatives read
    from a missing folder (issue 41 item 4)."""
    import ance_core.retention as retention
    from ance_core.artifacts import is_complete, run_stage

    work, built = tmp_path / "work", {}

    def follow(server, flow_run):  # each try builds its negatives; a real gc takes the first try's before the record
        ref = run_stage(str(work), "mine", {"try": flow_run.name}, {},
                        lambda out: (out / "n.txt").write_text("n") and None)
        built[flow_run.name] = ref.path
        if len(built) == 1:
            monkeypatch.setattr(retention, "GRACE_SECONDS", 0)  # (a folder no run recorded is otherwise kept 1 h)
            retention.collect(work, retention.RetentionConfig(keep_runs=1))
            assert not Path(ref.path).exists()
        server.result_file.parent.mkdir(parents=True, exist_ok=True)
        server.result_file.write_text(json.dumps({"mine": ref.path}))
        return None

    monkeypatch.setattr(FakeServer, "follow", follow)
    server, run_refresh = refresh(tmp_path, monkeypatch, {}, {f"refresh-step-6-try-{k}": None for k in range(3)})
    mined = run_refresh()
    assert server.created == ["refresh-step-6-try-0", "refresh-step-6-try-1"]
    assert mined == built["refresh-step-6-try-1"] and is_complete(mined)
