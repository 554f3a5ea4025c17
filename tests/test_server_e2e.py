"""The real local stack (no mocks): `scripts/stack.sh up` starts `prefect server` and `mlflow server` on free 127.0.0.1
ports and a process worker; `scripts/stack.sh deploy` registers prefect.yaml's deployments. Runs are triggered through
the REST API, as the UI's "Run" button does; what they tracked is read back through MLflow's REST API; both UIs are
checked in headless Chromium (Debian's package, `make system-deps`)."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from mlflow.tracking import MlflowClient

from flows.publish import artifact_key
from tests.tiny import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("server-e2e")]  # one stack for the module
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("ANCE_TEST_ARTIFACTS", REPO / "artifacts"))
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("stack")
    port, mlflow_port = free_port(), free_port()
    env = os.environ | {"STACK_DIR": str(root), "PREFECT_PORT": str(port), "VENV": str(Path(sys.executable).parents[1]),
                        "MLFLOW_PORT": str(mlflow_port), "MLFLOW_STORE_DIR": str(root / "mlflow")}
    env.pop("PREFECT_API_URL", None)
    env.pop("MLFLOW_TRACKING_URI", None)

    def script(action: str, **extra: str) -> str:
        proc = subprocess.run([str(REPO / "scripts" / "stack.sh"), action], env=env | extra, capture_output=True,
                              text=True, timeout=300)
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in (root / "logs").glob("*.log"))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
        return proc.stdout

    try:
        script("up")
        # `make deploy` after `PREFECT_PORT=... make up` gets make's default port: it registers on the one `up` started
        assert f"on http://127.0.0.1:{port}/api" in script("deploy", PREFECT_PORT=str(free_port()))
        yield {"api": f"http://127.0.0.1:{port}/api", "ui": f"http://127.0.0.1:{port}", "root": root,
               "mlflow": f"http://127.0.0.1:{mlflow_port}"}
    finally:
        script("down")
    assert "stopped" in script("status")


def api(stack, method: str, path: str, **kwargs) -> httpx.Response:
    """One REST call; 503/429 (SQLite busy under load) are retried with backoff, as Prefect's own client does."""
    for attempt in range(6):
        response = httpx.request(method, stack["api"] + path, timeout=30, **kwargs)
        if response.status_code not in (429, 503):
            return response
        time.sleep(2**attempt)
    return response


def deployment_id(stack, name: str) -> str:
    flow_name = {"ance-train": "ance-train", "bm25-warmup": "bm25-warmup", "refresh-negatives": "refresh-negatives",
                 "evaluate": "evaluate", "retrain": "retrain"}[name]
    response = api(stack, "GET", f"/deployments/name/{flow_name}/{name}")
    assert response.status_code == 200, response.text
    return response.json()["id"]


def trigger(stack, name: str, parameters: dict) -> str:
    response = api(stack, "POST", f"/deployments/{deployment_id(stack, name)}/create_flow_run",
                   json={"parameters": parameters})
    assert response.status_code in (200, 201), response.text
    return response.json()["id"]


def wait(stack, flow_run_id: str, timeout: float = 900, while_running=None) -> dict:
    """Poll until the flow run ends; `while_running(run)` is called on each poll before that."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        run = api(stack, "GET", f"/flow_runs/{flow_run_id}").json()
        if run["state_type"] == "RUNNING" and while_running is not None:
            while_running(run)
        if run["state_type"] in TERMINAL:
            if run["state_type"] != "COMPLETED":
                logs = api(stack, "POST", "/logs/filter",
                           json={"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}).json()
                worker = (stack["root"] / "logs" / "worker-cpu.log").read_text()[-3000:]
                pytest.fail(f"flow run {run['state_type']}: " + "\n".join(x["message"] for x in logs) + worker)
            return run
        time.sleep(2)
    pytest.fail(f"flow run {flow_run_id} not finished after {timeout} s")


def task_states(stack, flow_run_id: str, timeout: float = 120) -> dict[str, str]:
    """Task run states of a flow run ("<name> <id>": state), once they have settled: Prefect 3 records task-run
    states through its event pipeline, so they can trail the flow run's own state by a few seconds."""
    deadline = time.time() + timeout
    while True:
        runs = api(stack, "POST", "/task_runs/filter",
                   json={"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200}).json()
        # names repeat (encode-shard-<k>); a task run the event pipeline has recorded before its state has none yet
        states = {f'{r["name"]} {r["id"]}': (r["state"] or {}).get("name") for r in runs}
        if all((r["state"] or {}).get("type") in TERMINAL for r in runs) or time.time() > deadline:
            return states
        time.sleep(2)


@pytest.fixture(scope="module")
def tiny(tiny_scifact, tiny_model, tmp_path_factory):
    work = tmp_path_factory.mktemp("stack-work")
    train = {"max_steps": 3, "batch_size": 4, "passage_max_length": 48, "learning_rate": 1e-3}
    return {"data": {"dataset": str(tiny_scifact)}, "model": {"name": str(tiny_model), "passage_max_length": 48},
            "warmup": train, "ance": train, "mining": {"top_k": 50}, "encode": {"batch_size": 32}, "rounds": 1,
            "work_dir": str(work)}


@contextlib.contextmanager
def browser_page():
    """A page of headless Debian chromium (Playwright drives it; no browser download)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        try:
            yield browser.new_page(viewport={"width": 1400, "height": 1000})
        finally:
            browser.close()


def mlflow_api(stack, method: str, path: str, **kwargs) -> dict:
    response = httpx.request(method, f"{stack['mlflow']}/api/2.0/mlflow/{path}", timeout=30, **kwargs)
    assert response.status_code == 200, f"{path}: {response.status_code} {response.text[:500]}"
    return response.json()


def mlflow_runs(stack, flow_run_id: str) -> list[dict]:
    """The MLflow runs tagged with a Prefect flow run id (the parent and its nested runs); none yet while the flow
    run has not created its experiment (MLflow answers 404 until then: "not there yet", not a failure)."""
    response = httpx.get(f"{stack['mlflow']}/api/2.0/mlflow/experiments/get-by-name",
                         params={"experiment_name": "ance-train"}, timeout=30)
    if response.status_code == 404:
        return []
    assert response.status_code == 200, f"experiments/get-by-name: {response.status_code} {response.text[:500]}"
    found = mlflow_api(stack, "POST", "runs/search", json={
        "experiment_ids": [response.json()["experiment"]["experiment_id"]], "max_results": 200,
        "filter": f"tags.`prefect.flow_run_id` = '{flow_run_id}'"})
    return found.get("runs", [])


def mlflow_parent(stack, flow_run_id: str) -> dict:
    parents = [r for r in mlflow_runs(stack, flow_run_id) if "mlflow.parentRunId" not in tags_of(r)]
    assert parents, f"no MLflow parent run is tagged with flow run {flow_run_id}"
    return parents[0]


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def loss_points(stack, run_id: str) -> list[int]:
    history = mlflow_api(stack, "GET", "metrics/get-history", params={"run_id": run_id, "metric_key": "loss"})
    return sorted(m["step"] for m in history.get("metrics", []))


@pytest.fixture(scope="module")
def trained(stack, tiny):
    """One ance-train run through the deployment; while it runs, MLflow is polled for streamed training steps."""
    flow_run_id = trigger(stack, "ance-train", {"config": tiny})
    seen_while_running: list[int] = []

    def look(_run):
        if not seen_while_running:
            for run in mlflow_runs(stack, flow_run_id):
                if tags_of(run).get("stage") == "warmup":
                    seen_while_running.extend(loss_points(stack, run["info"]["run_id"]))

    return flow_run_id, wait(stack, flow_run_id, while_running=look), seen_while_running


def test_deployments_are_registered_with_pools_and_schedule(stack):
    for name in ("ance-train", "bm25-warmup", "refresh-negatives", "evaluate", "retrain"):
        deployment = api(stack, "GET", f"/deployments/{deployment_id(stack, name)}").json()
        assert deployment["work_pool_name"] == ("infer" if name == "refresh-negatives" else "cpu")
        assert "config" in json.dumps(deployment["parameter_openapi_schema"]) or name in ("refresh-negatives",
                                                                                           "evaluate")
    retrain = api(stack, "GET", f"/deployments/{deployment_id(stack, 'retrain')}").json()
    assert [s["schedule"]["cron"] for s in retrain["schedules"]] == ["0 3 * * 1"]
    gpu = api(stack, "GET", "/deployments/name/ance-train/ance-train-gpu").json()
    assert gpu["work_pool_name"] == "gpu" and gpu["job_variables"]["image"]
    pools = {p["name"]: p["type"] for p in api(stack, "POST", "/work_pools/filter", json={}).json()}
    assert pools["cpu"] == pools["infer"] == "process" and pools["gpu"] == "docker"


def test_bad_parameters_are_refused_before_any_work(stack):
    response = api(stack, "POST", f"/deployments/{deployment_id(stack, 'ance-train')}/create_flow_run",
                   json={"parameters": {"config": {"rounds": -1, "ance": {"learning_rate": 0}}}})
    assert response.status_code == 409
    assert "config.rounds" in response.json()["detail"]
    response = api(stack, "POST", f"/deployments/{deployment_id(stack, 'ance-train')}/create_flow_run",
                   json={"parameters": {"config": {"warmpu": {}}}})
    assert response.status_code == 409 and "warmpu" in response.json()["detail"]


def test_ui_triggered_run_completes_with_artifacts(stack, trained, tiny):
    flow_run_id, run, _ = trained
    states = task_states(stack, flow_run_id)
    assert len(states) >= 15 and set(states.values()) <= {"Completed", "Cached"}, states
    # the only reuse in a first run: a round's mining asks for the corpus encoding and index of the model it starts
    # from, which that model's evaluation has just built
    assert all(name.startswith(("encode-corpus (", "build-index (")) for name, state in states.items()
               if state == "Cached"), states
    # each task run named after the model and split it ran for (not Prefect's `evaluate-4`)
    names = {name.rsplit(" ", 1)[0] for name in states}
    assert {"train (warmup)", "train (ANCE round 1)", "evaluate (warmup, dev)", "evaluate (zero-shot, test)",
            "encode-corpus (negatives for ANCE round 1)"} <= names, names
    work = Path(tiny["work_dir"])
    latest = json.loads((work / "latest.json").read_text())
    assert latest["flow_run_id"] == flow_run_id and Path(latest["checkpoint"], "model.safetensors").is_file()
    report = next((work / "reports").glob("*/results.json"))
    models = [r["model"] for r in json.loads(report.read_text())["results"]]
    assert models[:4] == ["BM25", "zero-shot", "warmup", "ANCE round 1"] and models[4].endswith(" + BM25")
    # in the Prefect UI: the results table and the stage times as keyed table artifacts of the flow run, and each
    # training stage's progress as a progress artifact that reached 100
    results, times = (artifact_key("ance-train", Path(tiny["data"]["dataset"]).name, kind)
                      for kind in ("results", "stage-times"))  # (its flow's and collection's history)
    assert results.startswith("ance-train-") and results.endswith("-results")
    tables = {a["key"]: a for a in api(stack, "POST", "/artifacts/filter", json={"artifacts": {
        "key": {"any_": [results, times]}, "flow_run_id": {"any_": [flow_run_id]}}}).json()}
    assert set(tables) == {results, times} and {a["type"] for a in tables.values()} == {"table"}
    rows = json.loads(tables[results]["data"]) if isinstance(tables[results]["data"], str) else tables[results]["data"]
    assert [r["model"] for r in rows] == models and all("nDCG@10" in r for r in rows)
    assert "warmup" in json.dumps(tables[times]["data"])
    progress = api(stack, "POST", "/artifacts/filter", json={"artifacts": {
        "type": {"any_": ["progress"]}, "flow_run_id": {"any_": [flow_run_id]}}}).json()
    assert len(progress) >= 2 and {a["data"] for a in progress} == {100.0}, progress  # the warm-up, the round


def test_second_run_with_same_parameters_is_all_cached(stack, trained, tiny):
    flow_run_id = trigger(stack, "ance-train", {"config": tiny})
    wait(stack, flow_run_id)
    states = task_states(stack, flow_run_id)
    assert states and set(states.values()) == {"Cached"}, states
    # its models' checkpoints are the first run's, pointed at through the server, not uploaded again
    from tracking.uploads import HELD_IN_TAG

    def children(flow_run: str) -> dict[str, dict]:
        pid = mlflow_parent(stack, flow_run)["info"]["run_id"]
        return {r["info"]["run_name"]: r for r in mlflow_runs(stack, flow_run)
                if tags_of(r).get("mlflow.parentRunId") == pid}

    first, again = children(trained[0]), children(flow_run_id)
    for name in ("warmup", "ANCE round 1"):
        assert tags_of(again[name]).get(HELD_IN_TAG) == first[name]["info"]["run_id"], name
        listed = mlflow_api(stack, "GET", "artifacts/list", params={"run_id": again[name]["info"]["run_id"],
                                                                     "path": "checkpoint"})
        assert not listed.get("files"), listed


def test_the_run_is_tracked_on_the_mlflow_server(stack, trained, tiny, tmp_path):
    flow_run_id, _, seen_while_running = trained
    runs = mlflow_runs(stack, flow_run_id)
    parent = mlflow_parent(stack, flow_run_id)
    pid, tags = parent["info"]["run_id"], tags_of(parent)
    children = {r["info"]["run_name"]: r for r in runs if tags_of(r).get("mlflow.parentRunId") == pid}
    hybrid = next(c for c in children if c.endswith(" + BM25"))  # the hybrid row's run
    assert set(children) == {"BM25", "zero-shot", "warmup", "ANCE round 1", hybrid}
    assert {r["info"]["status"] for r in runs} == {"FINISHED"}
    assert tags["prefect.deployment"] == "ance-train" and tags["dataset_digest"] and tags["git_commit"]
    # the worker's flow runs: scripts/stack.sh preloads mimalloc (allocator.py), unless ANCE_ALLOCATOR=system
    assert tags["allocator"] == ("system" if os.environ.get("ANCE_ALLOCATOR", "").strip().lower() == "system"
                                 else "mimalloc")
    assert tags["prefect.flow_run_url"] == f"{stack['ui']}/flow-runs/flow-run/{flow_run_id}"
    # the Dataset column: the data it trained, chose and was evaluated on, as dataset inputs of every run
    name = Path(tiny["data"]["dataset"]).name
    for run in [parent, *children.values()]:
        inputs = {i["dataset"]["name"]: i for i in run["inputs"]["dataset_inputs"]}
        assert set(inputs) == {f"{name}/train", f"{name}/dev", f"{name}/test"}
        contexts = {n: {t["key"]: t["value"] for t in i["tags"]}["mlflow.data.context"] for n, i in inputs.items()}
        assert contexts == {f"{name}/train": "training", f"{name}/dev": "dev", f"{name}/test": "evaluation"}
        assert len({i["dataset"]["digest"] for i in inputs.values()}) == 3  # each split's own content digest
    # one loss point per training step: the parent's on one global step axis (warm-up steps 1-3, round 1 steps
    # 4-6), each stage's own run from its step 1
    assert loss_points(stack, pid) == [1, 2, 3, 4, 5, 6]
    assert loss_points(stack, children["warmup"]["info"]["run_id"]) == [1, 2, 3]
    assert loss_points(stack, children["ANCE round 1"]["info"]["run_id"]) == [1, 2, 3]
    assert seen_while_running  # streamed while the flow was still running, not only logged at its end
    metrics = {m["key"]: m["value"] for m in children["ANCE round 1"]["data"]["metrics"]}
    for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100", "recall_at_1000", "time_train_s", "time_mine_s",
                "neg_overlap_top100", "neg_mean_negative_rank"):
        assert key in metrics, key
    # system metrics (the run's System metrics tab): sampled while each model's training and encoding ran, with the
    # wall time of each sample; the parent holds all of them on one axis
    ended = parent["info"]["end_time"]
    for run_id in (children["warmup"]["info"]["run_id"], children["zero-shot"]["info"]["run_id"], pid):
        for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes",
                    "system/process_memory_rss_megabytes"):
            history = mlflow_api(stack, "GET", "metrics/get-history", params={"run_id": run_id, "metric_key": key})
            points = history.get("metrics", [])
            assert points, f"{key} not logged to run {run_id}"
            assert all(ended - 3_600_000 < int(m["timestamp"]) <= ended for m in points)  # real times, not 0
            assert sorted(m["step"] for m in points) == list(range(len(points)))

    def files(run_id: str, path: str) -> set[str]:
        listed = mlflow_api(stack, "GET", "artifacts/list", params={"run_id": run_id, "path": path})
        return {f["path"] for f in listed.get("files", [])}

    assert {"checkpoint/model.safetensors", "checkpoint/tokenizer.json"} <= files(
        children["ANCE round 1"]["info"]["run_id"], "checkpoint")
    assert {"plots/loss.png", "plots/grad_norms.png", "plots/negatives_overlap.png"} <= files(pid, "plots")
    assert {"report/results.md", "report/results.csv"} <= files(pid, "report")
    champion = mlflow_api(stack, "GET", "registered-models/alias",
                          params={"name": f"ance-{Path(tiny['data']['dataset']).name}", "alias": "champion"})
    assert champion["model_version"]["run_id"] in {r["info"]["run_id"] for r in children.values()}
    # the stack's store read without its server (`ance run` after `make down`, `mlflow models serve` or `ance export`
    # on its sqlite URI): the artifacts lie where an embedded client reads them, not behind the server's proxy
    local = MlflowClient(f"sqlite:///{stack['root']}/mlflow/mlflow.db")
    assert local.get_experiment(parent["info"]["experiment_id"]).artifact_location.startswith("file://")
    got = local.download_artifacts(champion["model_version"]["run_id"], "checkpoint/ance_model.json", str(tmp_path))
    assert json.loads(Path(got).read_text())
    # the Prefect run links back to the MLflow run
    link = artifact_key("ance-train", Path(tiny["data"]["dataset"]).name, "mlflow-run")
    artifacts = api(stack, "POST", "/artifacts/filter", json={"artifacts": {
        "key": {"any_": [link]}, "flow_run_id": {"any_": [flow_run_id]}}}).json()
    assert artifacts and any(f"{stack['mlflow']}/#/experiments/" in a["data"] and pid in a["data"] for a in artifacts)


def test_mlflow_ui_lists_the_experiment_and_the_run(stack, trained):
    flow_run_id = trained[0]
    parent = mlflow_parent(stack, flow_run_id)
    experiment_id, name = parent["info"]["experiment_id"], parent["info"]["run_name"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with browser_page() as page:
        page.goto(f"{stack['mlflow']}/#/experiments/{experiment_id}/runs", wait_until="load")
        page.get_by_text(name, exact=True).first.wait_for(timeout=60_000)
        body = page.inner_text("body")
        page.screenshot(path=str(ARTIFACTS / "mlflow-ui-experiment.png"), full_page=True)
        page.goto(f"{stack['mlflow']}/#/experiments/{experiment_id}/runs/{parent['info']['run_id']}",
                  wait_until="load")
        page.get_by_text("ndcg_at_10", exact=True).first.wait_for(timeout=60_000)
        run_page = page.inner_text("body")
        page.screenshot(path=str(ARTIFACTS / "mlflow-ui-run.png"), full_page=True)
    assert "ance-train" in body and "Training runs" in body
    assert name in run_page and "ndcg_at_10" in run_page


def test_stage_deployments_and_retrain(stack, trained, tiny, tiny_scifact):
    work = Path(tiny["work_dir"])
    first = json.loads((work / "latest.json").read_text())["checkpoint"]
    data = {"dataset": str(tiny_scifact)}
    runs = {
        "evaluate": trigger(stack, "evaluate", {"checkpoint": first, "data": data, "work_dir": str(work)}),
        "refresh-negatives": trigger(stack, "refresh-negatives", {"checkpoint": first, "data": data,
                                                                  "mining": {"top_k": 50}, "work_dir": str(work)}),
        "retrain": trigger(stack, "retrain", {"config": tiny}),
    }
    for name, flow_run_id in runs.items():
        wait(stack, flow_run_id)
        assert set(task_states(stack, flow_run_id).values()) <= {"Completed", "Cached"}, name
    latest = json.loads((work / "latest.json").read_text())
    assert latest["checkpoint"] != first  # trained further, by the ance-train subflow of the retrain run
    subflow = api(stack, "GET", f"/flow_runs/{latest['flow_run_id']}").json()
    assert api(stack, "GET", f"/task_runs/{subflow['parent_task_run_id']}").json()["flow_run_id"] == runs["retrain"]
    # it started from the registry's champion, downloaded into the work folder
    parent = mlflow_parent(stack, latest["flow_run_id"])
    start = {p["key"]: p["value"] for p in parent["data"]["params"]}["start_checkpoint"]
    assert Path(start).parent == work / "champion" and Path(start).name.startswith(
        f"ance-{Path(tiny_scifact).name}-v")


def test_prefect_ui_shows_the_completed_run(stack, trained):
    flow_run_id, run, _ = trained
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with browser_page() as page:
        page.goto(f"{stack['ui']}/runs/flow-run/{flow_run_id}", wait_until="networkidle")
        page.get_by_text(run["name"], exact=True).first.wait_for(timeout=60_000)
        for text in ("Completed", "ance-train"):  # the state badge and the flow's name load after the run's name
            page.get_by_text(text, exact=False).first.wait_for(timeout=60_000)
        header = page.inner_text("body")
        assert "Completed" in header and "ance-train" in header
        page.get_by_text("Task Runs", exact=True).first.click()
        page.get_by_text("train (warmup)", exact=False).first.wait_for(timeout=60_000)
        page.wait_for_load_state("networkidle")
        body = page.inner_text("body")
        page.screenshot(path=str(ARTIFACTS / "prefect-ui-flow-run.png"), full_page=True)
    count = len(task_states(stack, flow_run_id))
    assert f"{count} Task runs" in body and f"({count} Completed)" in body
    for task in ("prepare-data", "bm25-run", "encode-corpus", "build-index", "mine-negatives", "train", "evaluate"):
        assert f"{task} (" in body, task
