"""The tracker against the embedded SQLite store (real MLflow, no server), and against a dead server."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.exceptions import TerminationSignal

from ance_core.errors import AnceError
from ance_core.pipeline.config import PipelineConfig
from tracking.client import UNDELIVERED, Tracker, configure_mlflow, flatten, metric_key
from tracking.live import LiveMetrics

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_tracking_package_changes_no_setting():
    """MLflow's settings (tracking.client.configure_mlflow) are applied where a client is made, not on import; mlflow
    itself is imported only then, so that its telemetry setting is in place before its first import."""
    modules = ["tracking", *(f"tracking.{p.stem}" for p in (ROOT / "tracking").glob("*.py") if p.stem != "__init__")]
    code = ("import json, os, sys\n"
            "before = dict(os.environ)\n"
            f"import {', '.join(modules)}\n"
            "print(json.dumps([os.environ == before, sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow')]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [True, []], out.stdout


def test_configure_mlflow_keeps_what_the_environment_sets(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    configure_mlflow()
    configure_mlflow()
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "3" and os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "2"


def test_a_runs_link_names_the_ui_as_a_browser_reaches_it(monkeypatch):
    """In the compose stack the flow runs reach MLflow as http://mlflow:5000, which no browser on the host resolves:
    ANCE_MLFLOW_UI_URL names the UI for the links (the flow run's MLflow-run artifact, the closing lines)."""
    from types import SimpleNamespace

    from tracking.run import MLFLOW_UI_URL, run_url

    tracker = SimpleNamespace(uri="http://mlflow:5000", experiment_id="3")
    monkeypatch.delenv(MLFLOW_UI_URL, raising=False)
    assert run_url(tracker, "abc") == "http://mlflow:5000/#/experiments/3/runs/abc"
    monkeypatch.setenv(MLFLOW_UI_URL, "http://127.0.0.1:5000/")
    assert run_url(tracker, "abc") == "http://127.0.0.1:5000/#/experiments/3/runs/abc"
    assert run_url(SimpleNamespace(uri="sqlite:///w/mlflow.db", experiment_id="1"), "abc") is None  # (no UI)


def test_flatten_and_metric_names():
    params = flatten(PipelineConfig())
    assert params["ance.learning_rate"] == "2e-05" and params["rounds"] == "1" and params["data.dataset"] == "scifact"
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
    assert tracker.undelivered == {} and not (tmp_path / UNDELIVERED).exists()


def test_an_experiment_whose_artifacts_a_server_proxies_is_refused_by_an_embedded_run(tmp_path):
    """A store a tracking server made with proxied artifacts (`mlflow-artifacts:/1`, as `make up`'s server did) took
    an embedded run's metrics and lost every artifact and the model; it is refused before any run, saying what to
    do."""
    uri = Tracker(tmp_path, "ance-fine").uri  # (an experiment of the embedded default is fine)
    MlflowClient(uri).create_experiment("ance-proxied", artifact_location="mlflow-artifacts:/1")
    with pytest.raises(AnceError, match=r"'ance-proxied' in sqlite:.* keeps its artifacts behind a tracking server "
                                        r"\(mlflow-artifacts:/1\): log through the server that made it"):
        Tracker(tmp_path, "ance-proxied")
    assert not (tmp_path / UNDELIVERED).exists()


def test_a_dead_server_warns_once_and_keeps_what_was_not_delivered(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with pytest.warns(UserWarning, match="the pipeline goes on"):
        tracker = Tracker(tmp_path, "ance-test", tracking_uri="http://127.0.0.1:9")
    tracker.log_metrics("some-run", {"loss": 1.0}, step=3)
    lines = [json.loads(x) for x in (tmp_path / UNDELIVERED).read_text().splitlines()]
    assert [x["call"] for x in lines] == ["get_experiment", "log_metrics"]
    assert lines[1]["payload"]["metrics"] == [["loss", 1.0, 3]]
    assert tracker.undelivered == {"get_experiment": 1, "log_metrics": 1}
    summary = tracker.summary()
    assert summary["undelivered_calls"] == 2 and summary["kept_in"] == str(tmp_path / UNDELIVERED)


class FlakyClient:
    """An MlflowClient whose log_batch fails while `down` is set (a server that goes away and comes back)."""

    def __init__(self, client):
        self.client, self.down, self.calls = client, False, 0

    def log_batch(self, run_id, **kwargs):
        self.calls += 1
        if self.down:
            raise ConnectionError("connection refused")
        return self.client.log_batch(run_id, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_live_metrics_are_retried_and_delivered_late_when_the_server_comes_back(tmp_path, monkeypatch):
    monkeypatch.setattr("tracking.client.PROBE_SECONDS", 0.0)
    tracker = Tracker(tmp_path, "ance-test")
    run = tracker.start_run("train")
    tracker.client = flaky = FlakyClient(tracker.client)
    live = LiveMetrics(tracker, {run: ["loss", "grad_norm_top"]}, step_offset=100, interval=3600)  # flushed by hand
    for step in (1, 2):
        live({"step": step, "loss": 1.0 / step, "grad_norm_top": 0.5})
    live.flush()
    flaky.down = True
    with pytest.warns(UserWarning, match="retries later"):
        live({"step": 3, "loss": 0.3})
        live.flush()
    assert live.pending[run] and live.delivered[run] == {1, 2}
    flaky.down = False
    live({"step": 4, "loss": 0.25})
    live.close()
    history = MlflowClient(tracker.uri).get_metric_history(run, "loss")
    assert [m.step for m in history] == [101, 102, 103, 104]  # global steps, none lost, none twice
    tracker.log_metrics(run, {"ndcg_at_10": 0.5})  # (a record without a time: logged now, not dated 1970)
    assert MlflowClient(tracker.uri).get_metric_history(run, "ndcg_at_10")[0].timestamp > 1.7e12
    assert live.delivered[run] == {1, 2, 3, 4} and tracker.delivered_late == 1 and tracker.undelivered == {}


def test_a_flush_whose_later_batch_fails_does_not_send_its_delivered_batches_again(tmp_path, monkeypatch):
    """After an outage more than a batch of points waits; a review found the flush all or nothing: batch 1 arrived,
    batch 2 failed, and the next flush sent batch 1 again (300 steps, 443 points)."""
    import tracking.live

    monkeypatch.setattr("tracking.client.PROBE_SECONDS", 0.0)
    monkeypatch.setattr(tracking.live, "BATCH", 10)
    tracker = Tracker(tmp_path, "ance-test")
    run = tracker.start_run("train")
    tracker.client = flaky = FlakyClient(tracker.client)
    live = LiveMetrics(tracker, {run: ["loss"]}, step_offset=0, interval=3600)
    for step in range(1, 26):
        live({"step": step, "loss": 1.0 / step})
    real = flaky.log_batch
    flaky.log_batch = lambda run_id, **kw: (_ for _ in ()).throw(ConnectionError("reset")) if flaky.calls >= 1 \
        else real(run_id, **kw)  # the first batch arrives, the second fails
    with pytest.warns(UserWarning, match="retries later"):
        live.flush()
    assert live.delivered[run] == set(range(1, 11)) and len(live.pending[run]) == 15
    flaky.log_batch = real
    live.close()
    steps = [m.step for m in MlflowClient(tracker.uri).get_metric_history(run, "loss")]
    assert sorted(steps) == list(range(1, 26))  # each once


def test_after_a_failure_calls_go_to_the_spool_until_the_next_probe(tmp_path):
    tracker = Tracker(tmp_path, "ance-test")
    run = tracker.start_run("train")
    tracker.client = flaky = FlakyClient(tracker.client)
    flaky.down = True
    with pytest.warns(UserWarning):
        for step in range(5):
            tracker.log_metrics(run, {"loss": 1.0}, step=step)
    assert flaky.calls == 1 and tracker.undelivered == {"log_metrics": 5}  # one timeout, not five


def test_a_call_mlflow_refuses_or_for_a_run_never_created_is_no_outage(tmp_path):
    """Found by a review: any failure counted as a dead server, so a call for a parent run that could not be created
    (the server down when the flow began, back since) sent every call of the next 20 s to the spool: the rounds'
    metrics, the registration and end_run, and the runs stayed RUNNING."""
    tracker = Tracker(tmp_path, "ance-test")
    run = tracker.start_run("train")
    with pytest.warns(UserWarning, match="did not take a call"):
        tracker.log_history(None, [{"step": 1, "loss": 0.5}], ["loss"])  # (the parent that was never created)
        tracker.set_tags("no-such-run", {"a": "b"})  # refused: RESOURCE_DOES_NOT_EXIST
        tracker.log_artifact(None, tmp_path / UNDELIVERED)
    assert tracker.failed_since is None
    tracker.log_metrics(run, {"ndcg_at_10": 0.7})
    tracker.end_run(run)
    got = MlflowClient(tracker.uri).get_run(run)
    assert got.data.metrics == {"ndcg_at_10": 0.7} and got.info.status == "FINISHED"
    assert tracker.undelivered == {"log_metrics": 1, "set_tags": 1, "log_artifact": 1}  # (kept, as before)


def test_a_retried_stage_streams_each_step_once(tmp_path):
    """A retried training stage resumes from its last checkpoint and trains the steps after it again, in the same
    live block: MLflow kept two points of each such step."""
    tracker = Tracker(tmp_path, "ance-test")
    run = tracker.start_run("train")
    live = LiveMetrics(tracker, {run: ["loss", "examples_per_s"]}, step_offset=0, interval=3600)
    for step in range(1, 7):  # the first try: a checkpoint at step 4, then it fails after step 6
        live({"step": step, "loss": 1.0 / step, "examples_per_s": 100.0})
    live.flush()
    for step in range(5, 9):  # the retry, from step 4's checkpoint
        live({"step": step, "loss": 1.0 / step, "examples_per_s": 90.0})
    live.close()
    history = MlflowClient(tracker.uri).get_metric_history(run, "examples_per_s")
    assert sorted(m.step for m in history) == list(range(1, 9)) and live.delivered[run] == set(range(1, 9))


def test_live_callbacks_only_inside_a_live_block(tmp_path):
    from tracking.live import LIVE, live_callbacks

    assert live_callbacks() == []
    tracker = Tracker(tmp_path, "ance-test")
    live = LiveMetrics(tracker, {tracker.start_run("train"): ["loss"]}, 0, interval=3600)
    token = LIVE.set(live)
    try:
        assert live_callbacks() == [live]
    finally:
        LIVE.reset(token)
        live.close()


def test_concurrent_runs_open_one_new_embedded_store(tmp_path):
    """Four processes open the same new embedded store at the same moment (four runs started together on one work
    folder): one creates its tables and the experiment, the others wait for it; every one gets that experiment."""
    script = ("import sys, time\n"
              "from pathlib import Path\n"
              "from tracking.client import Tracker\n"
              "while not Path(sys.argv[2]).exists(): time.sleep(0.01)\n"
              "tracker = Tracker(sys.argv[1], 'ance-train')\n"
              "print(tracker.experiment_id, tracker.failed_since is None and not tracker.undelivered)\n")
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "work"), str(go)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    time.sleep(8)  # all four have imported mlflow and wait
    go.touch()
    outputs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outputs]
    answers = {out.strip() for out, _ in outputs}
    assert len(answers) == 1 and answers.pop().endswith(" True"), outputs  # one experiment, nothing failed


@pytest.mark.parametrize("error, status", [
    (ValueError("a stage failed"), "FAILED"), (KeyboardInterrupt(), "KILLED"), (SystemExit(143), "KILLED"),
    (TerminationSignal(15), "KILLED"), (SystemExit(1), "FAILED")])  # (a cancelled flow run: Prefect's SIGTERM)
def test_runs_a_failed_block_raises_out_of_end_failed_not_running(tmp_path, error, status):
    """A flow that fails (or is interrupted) ends its MLflow runs, nested ones included, instead of leaving them
    RUNNING in the runs table; a block that ends normally leaves them to the caller."""
    tracker = Tracker(tmp_path, "ance-test")
    parent = tracker.start_run("pipeline")
    children = []
    with pytest.raises(type(error)), tracker.ended_on_failure(lambda: [*children, parent]):
        children.append(tracker.start_run("warmup", parent_id=parent))  # opened inside the block: ended too
        raise error
    client = MlflowClient(tracker.uri)
    assert [client.get_run(r).info.status for r in (parent, *children)] == [status, status]
    ended = tracker.start_run("pipeline")  # a run the block ended itself before failing keeps its status
    with pytest.raises(ValueError), tracker.ended_on_failure(lambda: [ended]):
        tracker.end_run(ended)
        raise ValueError("compression failed after the run was logged")
    assert client.get_run(ended).info.status == "FINISHED"
    fine = tracker.start_run("pipeline")
    with tracker.ended_on_failure(lambda: [fine]):
        pass
    assert client.get_run(fine).info.status == "RUNNING"


def test_a_tracking_uri_mlflow_cannot_use_is_one_clear_error(tmp_path, monkeypatch):
    """A typo in the scheme gave MLflow's traceback (the store lookup raises in MlflowClient's constructor)."""
    from ance_core.errors import AnceError

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "htp://localhost:5000")
    with pytest.raises(AnceError, match=r"MLFLOW_TRACKING_URI 'htp://localhost:5000' cannot be used by MLflow") as e:
        Tracker(tmp_path / "work", "ance-train")
    assert "'http', 'https'" in str(e.value)  # MLflow's list of schemes whole (a probe: cut mid-list at 150)


@pytest.mark.parametrize("uri", ["./mlruns", "file:///tmp/mlruns", "http//localhost:5000", r"C:\\mlruns"])
def test_a_tracking_uri_that_mlflow_reads_as_its_file_store_says_so(tmp_path, monkeypatch, uri):
    """MLflow 3 refuses its file store with a paragraph on migrating; a URI typed without "://" is one."""
    from ance_core.errors import AnceError
    from tracking.stores import file_store_problem

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with pytest.raises(AnceError, match=r"^MLFLOW_TRACKING_URI '.*' is a folder to MLflow \(its file store") as e:
        Tracker(tmp_path / "work", "ance-train")
    assert "migrate" not in str(e.value)
    for fine in ("http://127.0.0.1:5000", "https://mlflow.example.com", "sqlite:///x.db", "postgresql://h/db",
                 "databricks", "databricks-uc", "uc", "databricks://profile"):  # (bare: MLflow's Databricks stores)
        assert file_store_problem(fine) is None, fine
    assert file_store_problem("http://[::1:5000") is None  # (urlsplit refuses it: MLflow's own error says why)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow's own opt-in: the store is the user's choice
    assert file_store_problem(uri) is None


def test_a_work_folder_store_that_is_not_a_database_is_one_line_naming_it(tmp_path):
    """A damaged mlflow.db (or another file of that name) was MLflow's SQLAlchemy error, SQL included, and `ance
    compress` / retrain said it as "no champion"."""
    from ance_core.errors import AnceError
    from tracking.registry import champion_checkpoint

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "mlflow.db").write_text("not a database\n")
    for call in (lambda: Tracker(tmp_path / "work", "ance-train"),
                 lambda: champion_checkpoint(tmp_path / "work", "corpus")):
        with pytest.raises(AnceError, match=r"work/mlflow.db is not an SQLite database .* move it aside") as said:
            call()
        assert "\n" not in str(said.value) and "SQL" not in str(said.value).replace("SQLite", "")
    (tmp_path / "work" / "mlflow.db").write_text("")  # (an empty file: SQLite makes a new database in it)
    assert Tracker(tmp_path / "work", "ance-train").experiment_id


def test_an_experiment_deleted_in_the_ui_is_restored_and_logged_to(tmp_path):
    """MLflow refuses runs in a deleted experiment: every call went to the spool with "server unreachable"."""
    first = Tracker(tmp_path / "work", "ance-train")
    first.client.delete_experiment(first.experiment_id)
    with pytest.warns(UserWarning, match="had been deleted; it is restored"):
        tracker = Tracker(tmp_path / "work", "ance-train")
    run = tracker.start_run("after")
    assert run is not None and tracker.experiment_id == first.experiment_id and not tracker.undelivered


def test_an_evaluation_with_no_mlflow_run_keeps_no_pending_copy(tmp_path):
    """With the tracking server down from the start (no run id), every evaluation gzipped its TREC run into a new
    mlflow-pending folder that nothing could ever deliver (a review counted them piling up)."""
    from tracking.run import PENDING, log_evaluation

    tracker = Tracker(tmp_path / "work", "ance-test")
    stage = tmp_path / "evaluate"
    stage.mkdir()
    (stage / "metrics.json").write_text("{}")
    log_evaluation(tracker, None, stage, "evaluation")
    assert not (tmp_path / "work" / PENDING).exists() or not any((tmp_path / "work" / PENDING).iterdir())


def test_runs_a_killed_process_left_running_are_ended_when_the_next_run_starts(tmp_path):
    """A search or pipeline killed with SIGKILL left its run and its nested runs RUNNING in MLflow forever (a review
    found them after `kill -9` of `ance tune`). The next top-level run of the experiment on this host ends them
    KILLED; a run whose process is alive is left alone."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    tracker = Tracker(tmp_path / "work", "ance-tune")
    orphan = tracker.start_run("search")
    trial = tracker.start_run("trial", parent_id=orphan)
    fold = tracker.start_run("fold", parent_id=trial)
    tracker.client.set_tag(orphan, "process_pid", str(dead.pid))  # (as the killed process had tagged it)
    alive = tracker.start_run("another search, running")  # (this process's: alive)
    client = MlflowClient(tracker.uri)
    assert client.get_run(orphan).data.tags["process_host"] and client.get_run(alive).data.tags["process_pid"] == str(
        os.getpid())
    Tracker(tmp_path / "work", "ance-tune").start_run("the next search")
    for run_id in (orphan, trial, fold):
        run = client.get_run(run_id)
        assert run.info.status == "KILLED" and f"process {dead.pid}" in run.data.tags["ended_by"]
    assert client.get_run(alive).info.status == "RUNNING"


def test_a_failed_tidy_up_of_dead_runs_does_not_lose_the_new_run(tmp_path):
    """Ending a dead process's runs went through the Tracker's failure state: a 'database is locked' there sent the new
    run's own create_run to the spool, and the whole run's MLflow record was lost."""
    tracker = Tracker(tmp_path / "work", "ance-train")

    def locked(*args, **kwargs):
        raise RuntimeError("database is locked")

    tracker.client.search_runs = locked
    run_id = tracker.start_run("run")
    assert run_id is not None and not tracker.undelivered
    assert MlflowClient(tracker.uri).get_run(run_id).info.status == "RUNNING"
