"""A real `mlflow server` (SQLite) that dies in the middle of a pipeline run: training goes on, the run completes, and
the closing report says what was not delivered and where it was kept (no mocks)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from tests.tiny import free_port, wait_answering

pytestmark = pytest.mark.slow


def start_mlflow(store: Path, port: int) -> subprocess.Popen:
    env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1", "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
         "--artifacts-destination", str(store / "mlartifacts")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_answering(f"http://127.0.0.1:{port}/health", server, "mlflow server", 120)
    return server


def runs_named(url: str, name: str) -> list[dict]:
    try:
        experiment = httpx.get(f"{url}/api/2.0/mlflow/experiments/get-by-name",
                               params={"experiment_name": "ance-train"}, timeout=5)
        if experiment.status_code != 200:
            return []
        found = httpx.post(f"{url}/api/2.0/mlflow/runs/search", timeout=5, json={
            "experiment_ids": [experiment.json()["experiment"]["experiment_id"]],
            "filter": f"attributes.run_name = '{name}'"}).json()
        return found.get("runs", [])
    except httpx.HTTPError:
        return []


def test_the_tracking_server_dies_mid_run_and_the_pipeline_completes(tiny_scifact, tiny_model, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    store = tmp_path / "mlflow"
    store.mkdir()
    work = tmp_path / "work"
    train = {"max_steps": 6, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3}
    config = {"data": {"dataset": str(tiny_scifact)}, "model": {"name": str(tiny_model), "passage_max_length": 48},
              "warmup": train, "ance": train, "mining": {"top_k": 50}, "encode": {"batch_size": 32}, "rounds": 1,
              "work_dir": str(work)}
    (tmp_path / "tiny.yaml").write_text(json.dumps(config))
    env = os.environ | {"MLFLOW_TRACKING_URI": url, "PREFECT_HOME": str(tmp_path / "prefect"),
                        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "ANCE_MLFLOW_LIVE_INTERVAL": "0.5"}
    server = start_mlflow(store, port)
    try:
        proc = subprocess.Popen([sys.executable, "-m", "ance_cli", "run", "--config", str(tmp_path / "tiny.yaml"),
                                 "--json"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while not runs_named(url, "warmup"):  # the warm-up has started training and streaming to the server
            assert proc.poll() is None and time.time() < deadline, "the pipeline ended before the warm-up trained"
            time.sleep(0.2)
        os.killpg(server.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=600)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    tracking = result["tracking"]
    spool = work / "mlflow-undelivered.jsonl"
    assert tracking["undelivered_calls"] > 0 and tracking["kept_in"] == str(spool)
    assert "MLflow: NOT delivered" in out and str(spool) in out  # the closing report says what and where
    assert "failed" in err and "keeps what cannot be delivered" in err  # the warning, printed once
    kept = [json.loads(line) for line in spool.read_text().splitlines()]
    assert sum(tracking["undelivered"].values()) == len(kept)
    losses = {step for entry in kept if entry["call"] == "log_metrics"
              for key, _, step in entry["payload"]["metrics"] if key == "loss"}
    assert {7, 8, 9, 10, 11, 12} <= losses  # round 1's steps (global 7-12) were all kept, none dropped
    assert all(entry["prefect.flow_run_id"] for entry in kept)
    # training itself was not disturbed: every step of both stages ran and the pipeline evaluated its models
    assert [r["model"] for r in result["results"]][:4] == ["BM25", "zero-shot", "warmup", "ANCE round 1"]
    assert "run the same pipeline again" in out

    # delivered later: with the server back, the same command recomputes nothing and logs the whole run
    server = start_mlflow(store, port)
    try:
        again = subprocess.run([sys.executable, "-m", "ance_cli", "run", "--config", str(tmp_path / "tiny.yaml"),
                                "--json"], env=env, capture_output=True, text=True, timeout=600)
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        second = json.loads(again.stdout.strip().splitlines()[-1])
        client = MlflowClient(url)
        history = client.get_metric_history(second["mlflow_run_id"], "loss")
        champion = client.get_model_version_by_alias(f"ance-{tiny_scifact.name}", "champion")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    assert all(stage["cached"] for stage in second["stages"]) and second["results"] == result["results"]
    assert second["tracking"]["undelivered_calls"] == 0
    assert [m.step for m in history] == list(range(1, 13)) and champion.tags["dataset"] == str(tiny_scifact)
