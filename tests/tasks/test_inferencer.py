"""The asynchronous trainer with its inferencer on a worker of its own (`inferencer.mode: deployment`; ANCE Fig. 2's
1:1 allocation), on a real local stack: `prefect server` on 127.0.0.1, prefect.yaml's deployments registered by
`prefect deploy` (the pipeline on pool `train`, `refresh-negatives` on pool `infer`) and two process workers. The
inferencer's worker is SIGKILLed mid-refresh (with its flow run process: a machine lost), then comes back."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prefect.settings import PREFECT_API_URL, temporary_settings

from ance_core.errors import AnceError
from ance_core.negatives.config import InferencerConfig
from ance_core.negatives.refresh_state import read_refresh_state
from tasks.inferencer import check_deployment
from tests.tiny import REPO, failure_report, tiny_pipeline_config

pytestmark = pytest.mark.slow
PREFECT = str(Path(sys.executable).parent / "prefect")
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def call(api: str, method: str, path: str, **kwargs) -> httpx.Response:
    """One REST call; 503/429 (SQLite busy under load) are retried with backoff, as Prefect's own client does."""
    for attempt in range(6):
        response = httpx.request(method, api + path, timeout=30, **kwargs)
        if response.status_code not in (429, 503):
            return response
        time.sleep(2**attempt)
    return response


def until(what: str, check, timeout: float = 600, every: float = 1.0, explain=None):
    """Poll `check()` until it returns something true (that value), failing with `what` after `timeout` s (and what
    `explain()` then says: the state of things, for a failure on a machine the test no longer runs on)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if value := check():
            return value
        time.sleep(every)
    detail = ""
    if explain is not None:
        try:
            detail = "\n" + explain()
        except Exception as e:  # the failure's own message first
            detail = f"\n(the state could not be read: {e!r})"
    pytest.fail(f"not within {timeout} s: {what}{detail}")


def flow_logs(api: str, flow_run: str, limit: int = 200) -> str:
    logs = call(api, "POST", "/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run]}}, "limit": limit,
                                                   "sort": "TIMESTAMP_DESC"}).json()
    return "\n".join(f"{x['timestamp']} {x['message']}" for x in reversed(logs))


def refresh_runs(api: str, deployment: str) -> list[dict]:
    runs = call(api, "POST", "/flow_runs/filter",
                json={"flow_runs": {"deployment_id": {"any_": [deployment]}}}).json()
    return sorted(runs, key=lambda r: r["name"])  # refresh-step-<N>-try-<k>


class Worker:
    """`prefect worker start` in its own process group, as a machine of its own."""

    def __init__(self, root: Path, env: dict, pool: str, name: str, **extra: str):
        self.log = root / f"{name}-{int(time.time())}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([PREFECT, "worker", "start", "--pool", pool, "--name", name],
                                         env=env | extra, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=REPO)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=60)


def test_refreshes_run_on_the_inferencer_worker_and_survive_its_loss(prefect_server, tiny_scifact, tiny_model,
                                                                      tmp_path):
    api = prefect_server
    env = {k: v for k, v in os.environ.items() if k not in ("ANCE_FAULT", "MLFLOW_TRACKING_URI")}
    env |= {"PREFECT_API_URL": api, "PREFECT_HOME": str(tmp_path / "prefect"), "ANCE_PROJECT_DIR": str(REPO),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "TOKENIZERS_PARALLELISM": "false",
            "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_HEARTBEAT_SECONDS": "5"}
    for pool in ("train", "infer"):
        subprocess.run([PREFECT, "work-pool", "create", pool, "--type", "process"], env=env, check=True,
                       capture_output=True, timeout=300)
    for name, pool in (("ance-train", "train"), ("refresh-negatives", "infer")):
        proc = subprocess.run([PREFECT, "--no-prompt", "deploy", "--name", name, "--pool", pool], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, failure_report(proc)
    with temporary_settings({PREFECT_API_URL: api}), pytest.raises(AnceError, match="is not deployed on"):
        check_deployment(InferencerConfig(mode="deployment", deployment="refresh-negatives/nope"))  # a clear error
    refresh_deployment = call(api, "GET", "/deployments/name/refresh-negatives/refresh-negatives").json()
    assert refresh_deployment["work_pool_name"] == "infer"
    trainer_deployment = call(api, "GET", "/deployments/name/ance-train/ance-train").json()["id"]

    signal_file = tmp_path / "hung"  # the first refresh hangs in its corpus encoding: the worker is killed there
    workers = [Worker(tmp_path, env, "train", "train-1"),
               Worker(tmp_path, env, "infer", "infer-1", ANCE_FAULT="encode-corpus:hang",
                      ANCE_FAULT_SIGNAL=str(signal_file))]
    try:
        work = tmp_path / "work"
        config = tiny_pipeline_config(tiny_scifact, tiny_model, work, steps=6) | {
            "warmup": {"max_steps": 3, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3,
                       "checkpoint_every": 2},
            "refresh": "async", "max_staleness": 7,  # 6 steps a round: the trainer waits at step 8 at the latest
            "inferencer": {"mode": "deployment", "poll_seconds": 1}}
        trainer = call(api, "POST", f"/deployments/{trainer_deployment}/create_flow_run",
                       json={"parameters": {"config": config}}).json()["id"]

        def explain() -> str:
            """The trainer's and the refreshes' states, the trainer's last logs and the workers' last lines."""
            run = call(api, "GET", f"/flow_runs/{trainer}").json()
            lines = [f"trainer {run['state_type']}: {run['state'].get('message')}"]
            lines += [f"{r['name']} {r['state_type']} on {r['labels'].get('prefect.worker.name')}: "
                      f"{r['state'].get('message')}" for r in refresh_runs(api, refresh_deployment["id"])]
            lines += ["trainer's logs:", flow_logs(api, trainer)[-6000:]]
            for worker in workers:
                lines += [f"{worker.log.name}:", worker.log.read_text(errors="replace")[-3000:]]
            return "\n".join(lines)

        until("the refresh hung in its flow run on the infer worker", signal_file.exists, timeout=900)
        first = refresh_runs(api, refresh_deployment["id"])[0]
        assert first["state_type"] == "RUNNING" and first["labels"]["prefect.worker.name"] == "infer-1"
        workers[1].kill()  # the worker and the flow run process it started
        if first.get("infrastructure_pid"):  # a flow run process outside the worker's group: the machine is gone
            pid = int(first["infrastructure_pid"].rsplit(":", 1)[-1])
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

        # the trainer notices the lost worker from its missed heartbeats and starts the refresh again
        runs = until("a second refresh flow run after the first was marked crashed", lambda: (
            runs if len(runs := refresh_runs(api, refresh_deployment["id"])) == 2
            and runs[0]["state_type"] == "CRASHED" else None), timeout=300, explain=explain)
        message = runs[0]["state"]["message"]  # the trainer's count of missed heartbeats, or Prefect's own verdict
        assert "infer-1" in message and ("heartbeat" in message or "offline" in message), message
        assert runs[1]["state_type"] in ("SCHEDULED", "PENDING")  # waiting for a worker of pool `infer`
        workers.append(Worker(tmp_path, env, "infer", "infer-1"))  # the worker returns (without the fault)

        final = until("the trainer's flow run to finish", lambda: (
            run if (run := call(api, "GET", f"/flow_runs/{trainer}").json())["state_type"] in TERMINAL else None),
            timeout=900, every=2, explain=explain)
        assert final["state_type"] == "COMPLETED", explain()
    finally:
        for worker in workers:
            worker.kill()

    # the pipeline ran on the train worker, each refresh as a flow run of its own on the infer worker
    assert final["work_pool_name"] == "train" and final["labels"]["prefect.worker.name"] == "train-1"
    runs = refresh_runs(api, refresh_deployment["id"])
    assert [(r["name"], r["state_type"], r["work_pool_name"], r["labels"]["prefect.worker.name"]) for r in runs] == [
        ("refresh-step-6-try-0", "CRASHED", "infer", "infer-1"), ("refresh-step-6-try-1", "COMPLETED", "infer",
                                                                   "infer-1")]
    for run in runs:  # subflows of the trainer's flow run in the UI
        parent = call(api, "GET", f"/task_runs/{run['parent_task_run_id']}").json()
        assert parent["flow_run_id"] == trainer

    # the trainer trained on its old negatives while the inferencer was gone, then swapped in the refresh's
    (folder,) = [p.parent for p in (work / "train-async").glob("*/async_refresh.json")]
    refresh = json.loads((folder / "async_refresh.json").read_text())
    mined = json.loads((folder / "inferencer" / "step-6.json").read_text())["mine"]
    assert [(s["checkpoint_step"], s["swapped_at_step"], s["negatives"]) for s in refresh["swaps"]] == [(6, 8, mined)]
    assert Path(mined, "manifest.json").is_file() and not refresh["refresh_errors"]
    assert [w["step"] for w in refresh["waits"]] == [8]  # max_staleness 7: the step-8 wait outlasted the lost worker
    staleness = read_refresh_state(folder)["staleness"]
    assert staleness == [[s, s] for s in range(8)] + [[s, s - 6] for s in range(8, 12)]
    assert refresh["rounds"] == [{"round": 1, "mean_staleness": 2.5, "max_staleness": 5},
                                 {"round": 2, "mean_staleness": 4.5, "max_staleness": 7}]
