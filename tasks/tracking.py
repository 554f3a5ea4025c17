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

    def log_artifact(self, run_id: str | None, path: str | Path, artifact_path: str | None = None) -> None:
        self._safe("log_artifact", self.client.log_artifact, run_id, str(path), artifact_path,
                   payload={"run_id": run_id, "file": str(path), "artifact_path": artifact_path})

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


TRAINING_STATE = {"optimizer.safetensors", "rng.safetensors", "trainer_state.json", "train_log.jsonl", "manifest.json",
                  "async_state.json", "async_refresh.json"}


def log_checkpoint(tracker: Tracker, run_id: str | None, folder: str | Path) -> None:
    """A checkpoint's model files (weights, head, config, tokenizer) under `checkpoint/`, not its training state."""
    for path in sorted(Path(folder).iterdir()):
        if path.is_file() and path.name not in TRAINING_STATE:
            tracker.log_artifact(run_id, path, "checkpoint")


def plot_curves(records: list[dict], results: list[dict], out: Path) -> list[Path]:
    """loss.png, grad_norm.png (global step) and metrics.png (per model) with matplotlib's Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, title in (("loss", "training loss"), ("grad_norm", "pre-clip gradient norm")):
        if records:
            fig, ax = plt.subplots(figsize=(7, 3.5))
            ax.plot([r["step"] for r in records], [r[key] for r in records], lw=0.8)
            ax.set_xlabel("global step"), ax.set_title(title)
            fig.tight_layout(), fig.savefig(out / f"{key}.png", dpi=110), plt.close(fig)
            paths.append(out / f"{key}.png")
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for key in ("ndcg_at_10", "mrr_at_10", "recall_at_100"):
        ax.plot([r["model"] for r in results], [r[key] for r in results], marker="o", label=key)
    ax.legend(), ax.set_title("metrics per model"), ax.tick_params(axis="x", rotation=20)
    fig.tight_layout(), fig.savefig(out / "metrics.png", dpi=110), plt.close(fig)
    return [*paths, out / "metrics.png"]


def register_models(tracker: Tracker, name: str, versions: list[tuple[str, str, dict]], dataset: str,
                    split: str) -> dict:
    """Register each (label, run_id, metrics) checkpoint as a version of `name`; move the alias `champion` to the best
    new version only if it beats the current champion on the same dataset and split (nDCG@10)."""
    client = tracker.client
    if tracker._safe("get_registered_model", _ensure_registered_model, client, name, payload={"name": name}) is None:
        return {}
    best = None
    for label, run_id, metrics in versions:
        tags = {"label": label, "dataset": dataset, "split": split} | {k: f"{v:.6f}" for k, v in metrics.items()}
        version = tracker._safe("create_model_version", client.create_model_version, name,
                                f"runs:/{run_id}/checkpoint", run_id, tags=tags, payload={"name": name, "tags": tags})
        if version is not None and (best is None or metrics["ndcg_at_10"] > best[1]["ndcg_at_10"]):
            best = (version.version, metrics)
    if best is None:
        return {}
    try:
        current = client.get_model_version_by_alias(name, "champion")
    except Exception:
        current = None
    same_setting = current is not None and current.tags.get("dataset") == dataset and current.tags.get("split") == split
    current_score = float(current.tags["ndcg_at_10"]) if same_setting else None
    # compared at the precision the tags keep: an equal model (an identical re-run) does not take the alias
    promote = current_score is None or round(best[1]["ndcg_at_10"], 6) > current_score
    if promote:
        tracker._safe("set_alias", client.set_registered_model_alias, name, "champion", best[0],
                      payload={"name": name, "version": best[0]})
    return {"candidate_version": best[0], "candidate_ndcg_at_10": best[1]["ndcg_at_10"],
            "champion_version": best[0] if promote else current.version, "champion_ndcg_at_10_before": current_score,
            "promoted": promote}


def _ensure_registered_model(client: MlflowClient, name: str):
    try:
        return client.get_registered_model(name)
    except Exception:
        return client.create_registered_model(name)


def log_pipeline(tracker: Tracker, config: BaseModel, report: dict, stage_refs: list, flow_tags: dict[str, str],
                 dataset_digest: str, evaluations: list | None = None) -> str | None:
    """One parent run per pipeline run, a nested run per model (BM25, zero-shot, warm-up, each round): params,
    metrics, stage wall times, and the training curves with a global step across stages."""
    tags = flow_tags | {"git_commit": _git_commit(), "dataset": report["dataset"], "dataset_digest": dataset_digest,
                        "model": getattr(getattr(config, "model", None), "name", "")}
    parent = tracker.start_run(f"ance-train {flow_tags.get('prefect.flow_run_name', '')}".strip(), tags=tags)
    tracker.log_params(parent, flatten(config))
    global_step, curve = 0, []
    folders = dict(evaluations or [])
    versions = []
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
                    curve += [r | {"step": r["step"] + global_step} for r in records]
                    global_step += len(records)
                if timing.stage == "train":
                    log_checkpoint(tracker, child, timing.ref.path)
                    versions.append((label, child, {k: v for k, v in row.items() if k != "model"}))
        if label in folders:
            tracker.log_artifacts(child, folders[label].path, "evaluation")
        tracker.log_metrics(child, metrics)
        tracker.end_run(child)
    tracker.log_metrics(parent, {k: v for k, v in report["results"][-1].items() if k != "model"})
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for path in plot_curves(curve, report["results"], Path(tmp)):
            tracker.log_artifact(parent, path, "plots")
        (Path(tmp) / "results.md").write_text(report["markdown"])
        tracker.log_artifact(parent, Path(tmp) / "results.md", "report")
    decision = register_models(tracker, f"ance-{Path(report['dataset']).name}", versions, report["dataset"],
                               report["split"])
    if decision:
        tracker.set_tags(parent, {f"champion.{k}": v for k, v in decision.items()})
    tracker.end_run(parent)
    return parent
