"""Unit tests of the deployment inferencer's tries (Prefect replaced by fakes; the real server and workers are in
test_inferencer.py): each try is a flow run with its own idempotency key, so a resumed trainer follows the run it
had started, and a run that had already failed before the trainer resumed does not use up the resumed trainer's
retries."""

import json
import logging
import uuid
from types import SimpleNamespace

import pytest
from prefect.states import Completed, Failed, Running

import tasks.inferencer as inferencer
from ance_core.artifacts import ArtifactRef
from ance_core.config import DataConfig, EncodeConfig, ExecutionConfig, IndexConfig, InferencerConfig, MiningConfig
from ance_core.errors import AnceError


class FakeServer:
    """run_deployment as the server answers it: a known idempotency key returns that key's flow run (in the state
    it reached), a new key creates a scheduled run. `outcomes[name]` is what following that run finds."""

    def __init__(self, earlier: dict, outcomes: dict, result_file):
        self.runs = {key: SimpleNamespace(id=uuid.uuid4(), name=name, state=state)
                     for key, (name, state) in earlier.items()}
        self.outcomes, self.result_file, self.created = outcomes, result_file, []

    def run_deployment(self, name, parameters, timeout, flow_run_name, idempotency_key, tags):
        assert timeout == 0 and parameters["result_file"] == str(self.result_file)
        if idempotency_key not in self.runs:
            self.created.append(flow_run_name)
            self.runs[idempotency_key] = SimpleNamespace(id=uuid.uuid4(), name=flow_run_name, state=None)
        return self.runs[idempotency_key]

    def follow(self, flow_run):
        problem = self.outcomes[flow_run.name]
        if problem is None:
            self.result_file.write_text(json.dumps({"mine": f"mined-by-{flow_run.name}"}))
        return problem


def refresh(tmp_path, monkeypatch, earlier: dict, outcomes: dict, retries: int = 2):
    result_file = tmp_path / "trainer" / inferencer.RESULTS / "step-6.json"
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
    earlier = {f"trainer-key-step-6-try-{k}": (f"refresh-step-6-try-{k}", Failed()) for k in range(3)}
    server, run = refresh(tmp_path, monkeypatch, earlier, {"refresh-step-6-try-3": None})
    assert run() == "mined-by-refresh-step-6-try-3"
    assert server.created == ["refresh-step-6-try-3"]

    # one failed, the next still running when the trainer died: followed, not started again
    earlier = {"trainer-key-step-6-try-0": ("refresh-step-6-try-0", Failed()),
               "trainer-key-step-6-try-1": ("refresh-step-6-try-1", Running())}
    server, run = refresh(tmp_path, monkeypatch, earlier, {"refresh-step-6-try-1": None})
    assert run() == "mined-by-refresh-step-6-try-1" and server.created == []

    # already completed: its result is read, nothing runs
    earlier = {"trainer-key-step-6-try-0": ("refresh-step-6-try-0", Completed())}
    server, run = refresh(tmp_path, monkeypatch, earlier, {"refresh-step-6-try-0": None})
    assert run() == "mined-by-refresh-step-6-try-0" and server.created == []
