"""What a run started from the Prefect UI shows on its page (found by a review, on a real server here): warnings in
a flow or task run reach that run's logs, not only the process's stderr (a worker's terminal: every AnceWarning of
such a run was invisible, a recipe search's recipe drift, a failed trial, a retrain from another dev split); the
`evaluate` deployment's metrics are in its logs and a table artifact (it showed nothing: a return value is not
shown)."""

import json
import time

import httpx
import pytest
from prefect import flow, task
from prefect.settings import PREFECT_API_URL, temporary_settings

import tasks.common  # noqa: F401  (imported by every flow: it routes warnings to the run's logs)
from ance_core.errors import AnceWarning, warn
from ance_core.retrieval.config import EncodeConfig
from tests.tiny import random_head_checkpoint


@task
def _warns_in_a_task() -> None:
    warn("a task's warning 7f3c")


@flow
def _warns_in_a_flow() -> None:
    warn("a flow's warning 7f3c")
    _warns_in_a_task()


def test_a_warning_is_in_its_runs_logs_on_the_server(prefect_server):
    with temporary_settings({PREFECT_API_URL: prefect_server}), pytest.warns(AnceWarning) as caught:
        state = _warns_in_a_flow(return_state=True)
    assert state.is_completed() and len(caught) == 2  # (still Python warnings: the CLI prints them)
    flow_run = str(state.state_details.flow_run_id)
    deadline, found = time.time() + 120, {}
    while time.time() < deadline and len(found) < 2:  # (logs arrive in batches, late on a busy machine)
        found = {log["message"]: log for log in _logs(prefect_server, flow_run) if "7f3c" in log["message"]}
        time.sleep(1)
    assert set(found) == {"a flow's warning 7f3c", "a task's warning 7f3c"}, found
    assert {log["level"] for log in found.values()} == {30}  # WARNING
    assert found["a task's warning 7f3c"]["task_run_id"] is not None  # on the task run's own logs too
    assert found["a flow's warning 7f3c"]["task_run_id"] is None


KEY = "evaluate-tiny-ui-page-test"  # <flow>-<collection>-<split>


def _logs(api: str, flow_run: str) -> list[dict]:
    answer = httpx.post(f"{api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [flow_run]}}, "limit": 200},
                        timeout=30)
    return answer.json() if answer.status_code == 200 else []


def test_the_evaluate_flow_shows_its_metrics_in_its_logs_and_an_artifact(prefect_server, tiny_model, tiny_scifact,
                                                                          tmp_path):
    from ance_core.data.config import DataConfig
    from flows.evaluate import evaluate_checkpoint

    checkpoint = random_head_checkpoint(tiny_model, tmp_path / "checkpoint")
    for hybrid in (None, {}):  # {}: fused by RRF, which the page says (it showed fused figures as the checkpoint's)
        with temporary_settings({PREFECT_API_URL: prefect_server}):
            state = evaluate_checkpoint(str(checkpoint), DataConfig(dataset=str(tiny_scifact), name="tiny-ui-page"),
                                        EncodeConfig(batch_size=32, shard_size=64), work_dir=str(tmp_path / "work"),
                                        hybrid=hybrid, return_state=True)
        assert state.is_completed()
        metrics, flow_run = state.result(), str(state.state_details.flow_run_id)
        deadline, lines, artifacts = time.time() + 120, [], []
        while time.time() < deadline and not (lines and artifacts):
            lines = [x["message"] for x in _logs(prefect_server, flow_run) if "on tiny-ui-page test: " in x["message"]]
            answer = httpx.post(f"{prefect_server}/artifacts/filter", timeout=30,
                                json={"artifacts": {"flow_run_id": {"any_": [flow_run]}, "key": {"any_": [KEY]}}})
            artifacts = answer.json() if answer.status_code == 200 else []
            time.sleep(1)
        fused = " (+ BM25)" if hybrid is not None else ""
        assert lines == [f"{checkpoint} on tiny-ui-page test: nDCG@10 {metrics['ndcg_at_10']:.4f}, MRR@10 "
                         f"{metrics['mrr_at_10']:.4f}, R@100 {metrics['recall_at_100']:.4f}, R@1000 "
                         f"{metrics['recall_at_1000']:.4f}{fused}"], lines
        (artifact,) = artifacts
        assert artifact["type"] == "table"
        (row,) = json.loads(artifact["data"])
        assert row["checkpoint"] == str(checkpoint) and row["nDCG@10"] == round(metrics["ndcg_at_10"], 4)
        assert row.get("hybrid") == ("+ BM25" if hybrid is not None else None)
