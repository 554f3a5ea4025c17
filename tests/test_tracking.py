"""The tracker against the embedded SQLite store (real MLflow, no server), and against a dead server."""

import json

import pytest
from mlflow.tracking import MlflowClient

from ance_core.config import PipelineConfig
from tasks.tracking import UNDELIVERED, Tracker, flatten, metric_key


def test_flatten_and_metric_names():
    params = flatten(PipelineConfig())
    assert params["ance.learning_rate"] == "2e-05" and params["rounds"] == "2" and params["data.dataset"] == "scifact"
    assert metric_key("nDCG@10") == "ndcg_at_10"


def test_runs_params_and_step_history_in_the_embedded_store(tmp_path):
    tracker = Tracker(tmp_path, "ance-test")
    parent = tracker.start_run("pipeline", tags={"dataset": "scifact"})
    child = tracker.start_run("warmup", parent_id=parent)
    tracker.log_params(parent, flatten(PipelineConfig()))
    records = [{"step": s, "loss": 1.0 / s, "lr": 1e-5, "grad_norm": 2.0} for s in range(1, 2501)]
    tracker.log_history(child, records, ["loss", "lr", "grad_norm"])
    tracker.log_metrics(child, {"nDCG@10": 0.5})
    tracker.end_run(child)
    tracker.end_run(parent)
    client = MlflowClient(tracker.uri)
    assert client.get_run(child).data.tags["mlflow.parentRunId"] == parent
    history = client.get_metric_history(child, "loss")
    assert [m.step for m in history] == list(range(1, 2501))  # one point per step, across batches of 1000
    assert client.get_run(child).data.metrics["ndcg_at_10"] == 0.5
    assert client.get_run(parent).data.params["ance.learning_rate"] == "2e-05"
    assert tracker.undelivered == 0 and not (tmp_path / UNDELIVERED).exists()


def test_a_dead_server_warns_once_and_keeps_what_was_not_delivered(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with pytest.warns(UserWarning, match="the pipeline goes on"):
        tracker = Tracker(tmp_path, "ance-test", tracking_uri="http://127.0.0.1:9")
    tracker.log_metrics("some-run", {"loss": 1.0}, step=3)
    lines = [json.loads(x) for x in (tmp_path / UNDELIVERED).read_text().splitlines()]
    assert [x["call"] for x in lines] == ["get_experiment", "log_metrics"]
    assert lines[1]["payload"]["metrics"] == [["loss", 1.0, 3]]
    assert tracker.undelivered == 2
