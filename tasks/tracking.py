"""MLflow tracking of a pipeline run, which never stops the pipeline.

Embedded default: a SQLite store `<work_dir>/mlflow.db` with artifacts in `<work_dir>/mlartifacts/`, so a run logs
everything with no server; `MLFLOW_TRACKING_URI` points it at a server instead. Every call goes through `_safe`:
when the store or server fails, a warning is printed once, the call is appended to `<work_dir>/mlflow-undelivered.
jsonl` (one JSON object per call, enough to replay it), and the pipeline goes on. `undelivered` counts them.

Work in progress (issue 4): registry/champion, plots, per-step live logging and replay are still to come.
"""

import json
import os
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

UNDELIVERED = "mlflow-undelivered.jsonl"
BATCH = 1000  # MLflow accepts at most 1000 metrics per log_batch call


def flatten(obj: Any, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"ance.learning_rate": "2e-05", ...} (MLflow params are strings)."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    if isinstance(obj, dict):
        out: dict[str, str] = {}
        for key, value in obj.items():
            out |= flatten(value, f"{prefix}{key}.")
        return out
    return {prefix.rstrip("."): json.dumps(obj) if isinstance(obj, (list, tuple)) else str(obj)}


def metric_key(name: str) -> str:
    """MLflow refuses '@' in metric names: nDCG@10 -> ndcg_at_10."""
    return name.replace("@", "_at_").replace(" ", "_").lower()


class Tracker:
    def __init__(self, work_dir: str | Path, experiment: str, tracking_uri: str | None = None):
        self.work_dir = Path(work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.work_dir / 'mlflow.db'}"
        self.spool = self.work_dir / UNDELIVERED
        self.undelivered = 0
        self._warned = False
        self.client = MlflowClient(self.uri)
        self.experiment_id = self._safe("get_experiment", self._experiment, experiment, payload={"name": experiment})

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        location = None if self.uri.startswith("http") else (self.work_dir / "mlartifacts").as_uri()
        return self.client.create_experiment(name, artifact_location=location)

    def _safe(self, what: str, fn: Callable, *args: Any, payload: Any = None, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # tracking must never stop training
            self.undelivered += 1
            if not self._warned:
                warnings.warn(f"MLflow at {self.uri} failed ({type(e).__name__}: {e}); the pipeline goes on and "
                              f"keeps what was not delivered in {self.spool}", stacklevel=2)
                self._warned = True
            with open(self.spool, "a") as f:
                f.write(json.dumps({"call": what, "payload": payload, "error": str(e)}, default=str) + "\n")
            return None

    def start_run(self, name: str, parent_id: str | None = None, tags: dict[str, str] | None = None) -> str | None:
        if self.experiment_id is None:
            return None
        tags = dict(tags or {}) | {"mlflow.runName": name}
        if parent_id:
            tags["mlflow.parentRunId"] = parent_id
        run = self._safe("create_run", self.client.create_run, self.experiment_id, tags=tags,
                         payload={"name": name, "tags": tags})
        return run.info.run_id if run is not None else None

    def log_params(self, run_id: str | None, params: dict[str, str]) -> None:
        items = [Param(k, v[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self._safe("log_params", self.client.log_batch, run_id, params=items[start:start + 100],
                       payload={"run_id": run_id, "params": dict(list(params.items())[start:start + 100])})

    def log_metrics(self, run_id: str | None, metrics: dict[str, float], step: int = 0) -> None:
        self.log_history(run_id, [{"step": step, **metrics}], keys=list(metrics))

    def log_history(self, run_id: str | None, records: Iterable[dict], keys: list[str], step_offset: int = 0) -> None:
        """Per-step records (e.g. train_log.jsonl) as metric histories, batched (no per-step round trips)."""
        metrics = [Metric(metric_key(k), float(r[k]), 0, int(r["step"]) + step_offset)
                   for r in records for k in keys if k in r]
        for start in range(0, len(metrics), BATCH):
            chunk = metrics[start:start + BATCH]
            self._safe("log_metrics", self.client.log_batch, run_id, metrics=chunk,
                       payload={"run_id": run_id, "metrics": [(m.key, m.value, m.step) for m in chunk]})

    def set_tags(self, run_id: str | None, tags: dict[str, str]) -> None:
        self._safe("set_tags", self.client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()],
                   payload={"run_id": run_id, "tags": tags})

    def log_artifacts(self, run_id: str | None, folder: str | Path, artifact_path: str | None = None) -> None:
        self._safe("log_artifacts", self.client.log_artifacts, run_id, str(folder), artifact_path,
                   payload={"run_id": run_id, "folder": str(folder), "artifact_path": artifact_path})

    def end_run(self, run_id: str | None, status: str = "FINISHED") -> None:
        if run_id is not None:
            self._safe("end_run", self.client.set_terminated, run_id, status, payload={"run_id": run_id})


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def log_pipeline(tracker: Tracker, config: BaseModel, report: dict, stage_refs: list, flow_tags: dict[str, str],
                 dataset_digest: str) -> str | None:
    """One parent run per pipeline run, a nested run per model (BM25, zero-shot, warm-up, each round): params,
    metrics, stage wall times, and the training curves with a global step across stages."""
    tags = flow_tags | {"git_commit": _git_commit(), "dataset": report["dataset"], "dataset_digest": dataset_digest,
                        "model": getattr(getattr(config, "model", None), "name", "")}
    parent = tracker.start_run(f"ance-train {flow_tags.get('prefect.flow_run_name', '')}".strip(), tags=tags)
    tracker.log_params(parent, flatten(config))
    global_step = 0
    for row in report["results"]:
        label = row["model"]
        child = tracker.start_run(label, parent_id=parent, tags=tags | {"stage": label})
        metrics = {k: v for k, v in row.items() if k != "model"}
        for timing in stage_refs:
            if timing.label == label:
                metrics[f"time_{timing.stage.replace('-', '_')}_s"] = timing.ref.seconds
                log = Path(timing.ref.path) / "train_log.jsonl"
                if timing.stage == "train" and log.is_file():
                    records = [json.loads(x) for x in log.read_text().splitlines()]
                    tracker.log_history(child, records, ["loss", "lr", "grad_norm", "examples_per_s"], global_step)
                    tracker.log_history(parent, records, ["loss", "lr", "grad_norm"], global_step)
                    global_step += len(records)
        tracker.log_metrics(child, metrics)
        tracker.end_run(child)
    tracker.log_metrics(parent, {k: v for k, v in report["results"][-1].items() if k != "model"})
    tracker.end_run(parent)
    return parent
