"""MLflow tracking of a pipeline run, which never slows or stops the pipeline.

Embedded default: a SQLite store `<work_dir>/mlflow.db` with artifacts in `<work_dir>/mlartifacts/`, so a run logs
everything with no server; `MLFLOW_TRACKING_URI` points it at a server instead (`make up` starts one).

- `Tracker`: every MLflow call goes through `attempt`/`_safe`. When the store or server fails, a warning is printed
  once, calls go straight to the spool for PROBE_SECONDS before MLflow is tried again, and each call that was not
  delivered is appended to `<work_dir>/mlflow-undelivered.jsonl` (one JSON object per call, with its payload).
- `LiveMetrics`: training steps streamed from a background thread while a stage trains; failed batches are retried.
- `PipelineTracking`: the parent run and a nested run per model, opened at flow start and completed at flow end
  (metrics, negatives statistics, checkpoints, evaluations, plots, results table, registry and champion alias).
- `champion_checkpoint`: `models:/ance-<dataset>@champion` downloaded for `retrain`.
"""

import contextlib
import contextvars
import json
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
# a dead tracking server costs seconds, not MLflow's default of 7 retries with 120 s timeouts
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")

import pandas as pd  # noqa: E402
from filelock import FileLock  # noqa: E402
from mlflow.entities import Metric, Param, RunTag  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from ance_core.analysis import negatives_sample  # noqa: E402
from ance_core.artifacts import ArtifactRef  # noqa: E402
from ance_core.data import read_tables  # noqa: E402
from ance_core.errors import AnceError  # noqa: E402
from ance_core.model import model_files  # noqa: E402
from ance_core.plots import plot_curves, plot_quality_over_time, quality_over_time  # noqa: E402
from ance_core.report import DEV_KEY  # noqa: E402
from tasks.analysis import read_stats  # noqa: E402

UNDELIVERED = "mlflow-undelivered.jsonl"
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
BATCH = 1000  # MLflow accepts at most 1000 metrics per log_batch call
PROBE_SECONDS = 20.0  # after a failure, how long calls go straight to the spool before MLflow is tried again


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


def resolve_tracking_uri(work_dir: str | Path, explicit: str | None = None) -> str:
    """An explicit URI, else $MLFLOW_TRACKING_URI, else the embedded store <work_dir>/mlflow.db."""
    return explicit or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path(work_dir).resolve() / 'mlflow.db'}"


def store_lock(uri: str) -> contextlib.AbstractContextManager:
    """A file lock beside an embedded SQLite store while it is opened. Concurrent runs on one work folder would
    otherwise race to create its tables (MLflow's schema migrations fail when two run at once: "table ... already
    exists") and its experiment; a tracking server needs none."""
    if not uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    db = Path(uri.removeprefix("sqlite:///"))
    db.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(db.parent / f".{db.name}.lock")


class Tracker:
    def __init__(self, work_dir: str | Path, experiment: str, tracking_uri: str | None = None):
        self.work_dir = Path(work_dir).resolve()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.uri = resolve_tracking_uri(self.work_dir, tracking_uri)
        self.spool = self.work_dir / UNDELIVERED
        self.undelivered: dict[str, int] = {}  # call -> count kept in the spool
        self.delivered_late = 0
        self.failed_since: float | None = None  # while set, calls go straight to the spool until the next probe
        self._next_probe = 0.0
        self._warned = False
        self._lock = threading.Lock()
        self.context: dict[str, str] = {}  # added to every spooled call (e.g. the Prefect flow run id)
        with store_lock(self.uri):
            self.client = MlflowClient(self.uri)
            self.experiment_id = self._safe("get_experiment", self._experiment, experiment,
                                            payload={"name": experiment})

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            location = None if self.uri.startswith("http") else (self.work_dir / "mlartifacts").as_uri()
            experiment_id = self.client.create_experiment(name, artifact_location=location)
        if found is None or EXPERIMENT_KIND[0] not in found.tags:  # the UI opens it on its runs, not on GenAI traces
            self.client.set_experiment_tag(experiment_id, *EXPERIMENT_KIND)
        return experiment_id

    def attempt(self, fn: Callable, *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """Call MLflow; (False, error) instead of raising. After a failure, calls are not tried (they fail at once)
        until PROBE_SECONDS have passed, so a dead server costs one timeout, not one per call."""
        if self.failed_since is not None and time.time() < self._next_probe:
            return False, "tracking server unreachable (not retried yet)"
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # tracking must never stop training
            with self._lock:
                if self.failed_since is None:
                    self.failed_since = time.time()
                self._next_probe = time.time() + PROBE_SECONDS
                if not self._warned:
                    self._warned = True
                    warnings.warn(f"MLflow at {self.uri} failed ({type(e).__name__}: {e}); the pipeline goes on, "
                                  f"retries later and keeps what cannot be delivered in {self.spool}", stacklevel=3)
            return False, e
        if self.failed_since is not None:
            with self._lock:
                self.failed_since = None
            print(f"MLflow at {self.uri} reachable again")
        return True, result

    def keep(self, what: str, payload: Any, error: Any) -> None:
        """Append an undelivered call to the spool (one JSON object per line: enough to replay it)."""
        with self._lock:
            self.undelivered[what] = self.undelivered.get(what, 0) + 1
            with open(self.spool, "a") as f:
                f.write(json.dumps({"call": what, "payload": payload, "error": str(error),
                                    "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")} | self.context, default=str) + "\n")

    def _safe(self, what: str, fn: Callable, *args: Any, payload: Any = None, **kwargs: Any) -> Any:
        ok, result = self.attempt(fn, *args, **kwargs)
        if ok:
            return result
        self.keep(what, payload, result)
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
            ok, error = self.attempt(self.client.log_batch, run_id, metrics=chunk)
            if not ok:
                points = [(m.key, m.value, m.step) for m in chunk]
                self.keep("log_metrics", {"run_id": run_id, "metrics": points}, error)

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

    def summary(self) -> dict:
        """What did not reach MLflow, and where it is kept (printed and returned by the flow)."""
        return {"tracking_uri": self.uri, "undelivered": dict(self.undelivered),
                "undelivered_calls": sum(self.undelivered.values()), "delivered_late": self.delivered_late,
                "kept_in": str(self.spool) if self.undelivered else None}


class LiveMetrics:
    """Streams training steps to MLflow while a stage trains, without slowing it down.

    The training loop only appends to a list (`__call__`); a background thread sends what has accumulated every
    `interval` seconds in one batch per run. A batch that fails stays queued and is retried at the next flush
    (delivered late when the server comes back); what is still queued at `close` is left to the pipeline's final
    logging, which sends it from train_log.jsonl or keeps it in the spool. `delivered` lists the steps that arrived.
    """

    def __init__(self, tracker: Tracker, runs: dict[str, list[str]], step_offset: int, interval: float = 5.0):
        self.tracker, self.runs, self.offset, self.interval = tracker, runs, step_offset, interval
        self.queue: list[dict] = []
        self.pending: dict[str, list[Metric]] = {run: [] for run in runs}
        self.delivered: dict[str, set[int]] = {run: set() for run in runs}
        self.busy_s = 0.0  # wall time spent sending (in the background thread, and in close)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="mlflow-live", daemon=True)
        self._thread.start()

    def __call__(self, record: dict) -> None:
        with self._lock:
            self.queue.append(record)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.flush()

    def flush(self) -> None:
        started = time.perf_counter()
        with self._lock:
            records, self.queue = self.queue, []
        now = int(time.time() * 1000)
        for run, keys in self.runs.items():
            carried = len(self.pending[run])  # points a failed flush left queued
            self.pending[run] += [Metric(metric_key(k), float(r[k]), now, int(r["step"]) + self.offset)
                                  for r in records for k in keys if k in r]
            if not self.pending[run]:
                continue
            sent = self.pending[run]
            ok = all(self.tracker.attempt(self.tracker.client.log_batch, run, metrics=sent[i:i + BATCH])[0]
                     for i in range(0, len(sent), BATCH))
            if ok:
                self.tracker.delivered_late += carried
                self.delivered[run] |= {m.step - self.offset for m in sent}
                self.pending[run] = []
        self.busy_s += time.perf_counter() - started

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.flush()


LIVE: contextvars.ContextVar[LiveMetrics | None] = contextvars.ContextVar("ance_live_metrics", default=None)


def live_callbacks() -> list[Callable[[dict], None]]:
    """The training callback of the current pipeline's live logging, if one is active in this context."""
    live = LIVE.get()
    return [live] if live is not None else []


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def log_checkpoint(tracker: Tracker, run_id: str | None, folder: str | Path) -> None:
    """A checkpoint's model files (weights, head, config, tokenizer) under `checkpoint/`, not its training state."""
    for path in model_files(folder):
        tracker.log_artifact(run_id, path, "checkpoint")


def register_models(tracker: Tracker, name: str, versions: list[tuple[str, str, dict]], dataset: str,
                    split: str, candidate: str | None = None, dev_setting: str | None = None) -> dict:
    """Register each (label, run_id, metrics) checkpoint as a version of `name`, its metrics (evaluation and dev
    split) as tags. The alias `champion` moves to the version of `candidate` (the run's result, chosen on the dev
    split) only if its dev nDCG@10 beats the current champion's on the same dataset and dev split (`dev_setting`), or
    if the current champion has no such score. Without a candidate (no dev split, a comparison run) no alias moves:
    the evaluation split never decides."""
    client = tracker.client
    if tracker._safe("get_registered_model", _ensure_registered_model, client, name, payload={"name": name}) is None:
        return {}
    chosen, registered = None, []
    for label, run_id, metrics in versions:
        tags = {"label": label, "dataset": dataset, "split": split} | {k: f"{v:.6f}" for k, v in metrics.items()}
        tags |= {"dev_split": dev_setting} if dev_setting else {}
        version = tracker._safe("create_model_version", client.create_model_version, name,
                                f"runs:/{run_id}/checkpoint", run_id, tags=tags, payload={"name": name, "tags": tags})
        if version is not None:
            registered.append(version.version)
            if label == candidate:
                chosen = (version.version, metrics)
    if chosen is None or DEV_KEY not in chosen[1] or not dev_setting:
        return {"versions": registered} if registered else {}
    try:
        current = client.get_model_version_by_alias(name, "champion")
    except Exception:
        current = None
    comparable = (current is not None and current.tags.get("dataset") == dataset
                  and current.tags.get("dev_split") == dev_setting and DEV_KEY in current.tags)
    current_score = float(current.tags[DEV_KEY]) if comparable else None
    # compared at the precision the tags keep: an equal model (an identical re-run) does not take the alias
    promote = current_score is None or round(chosen[1][DEV_KEY], 6) > current_score
    if promote:
        tracker._safe("set_alias", client.set_registered_model_alias, name, "champion", chosen[0],
                      payload={"name": name, "version": chosen[0]})
    return {"versions": registered, "candidate": candidate, "candidate_version": chosen[0],
            "candidate_dev_ndcg_at_10": chosen[1][DEV_KEY],
            "champion_version": chosen[0] if promote else current.version,
            "champion_dev_ndcg_at_10_before": current_score, "promoted": promote,
            "reason": ("no champion with a dev score on the same dev split" if current_score is None else
                       "higher dev nDCG@10" if promote else "the current champion's dev nDCG@10 is not lower")}


def _ensure_registered_model(client: MlflowClient, name: str):
    try:
        return client.get_registered_model(name)
    except Exception:
        return client.create_registered_model(name)


STEP_KEYS = ["loss", "lr", "grad_norm", "grad_norm_bottom", "grad_norm_middle", "grad_norm_top", "examples_per_s"]
PARENT_KEYS = STEP_KEYS[:-1]  # the parent run's curves span all stages on one global step axis
LIVE_INTERVAL = float(os.environ.get("ANCE_MLFLOW_LIVE_INTERVAL", "5"))


def train_log(folder: str | Path) -> list[dict]:
    log = Path(folder) / "train_log.jsonl"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []


class PipelineTracking:
    """The MLflow record of one pipeline run.

    Opened when the flow starts: the parent run (tags, every config value as a param), so the run is visible at
    once. While a stage trains, `live(label, ...)` streams its steps to the model's nested run and to the parent
    (LiveMetrics). `finish` logs the rest when the flow ends: metrics per model, stage times, negatives statistics,
    staleness, the steps not delivered live, checkpoints, evaluations, negatives samples, plots, the results table,
    and the model registry with its champion decision.
    """

    def __init__(self, config: BaseModel, flow_tags: dict[str, str], experiment: str = "ance-train",
                 tracker: Tracker | None = None):
        self.config = config
        self.tracker = tracker or Tracker(config.work_dir, experiment)
        self.tracker.context = {k: v for k, v in flow_tags.items() if k == "prefect.flow_run_id"}
        self.tags = {k: v for k, v in flow_tags.items() if v} | {
            "git_commit": _git_commit(), "dataset": config.data.dataset, "model": config.model.name}
        name = f"{experiment} {flow_tags.get('prefect.flow_run_name', '')}".strip()
        self.parent = self.tracker.start_run(name, tags=self.tags)
        self.tracker.log_params(self.parent, flatten(config))
        self.children: dict[str, str | None] = {}
        self.delivered: dict[tuple[str, str], set[int]] = {}  # (run id, stage label) -> steps that arrived live

    def run_url(self, run_id: str | None) -> str | None:
        if run_id is None or not self.tracker.uri.startswith("http"):
            return None
        return f"{self.tracker.uri.rstrip('/')}/#/experiments/{self.tracker.experiment_id}/runs/{run_id}"

    def child(self, label: str) -> str | None:
        if label not in self.children:
            self.children[label] = self.tracker.start_run(label, parent_id=self.parent, tags=self.tags | {
                "stage": label})
        return self.children[label]

    def set_dataset(self, digest: str) -> None:
        self.tracker.set_tags(self.parent, {"dataset_digest": digest})

    @staticmethod
    def steps_before(timings: list) -> int:
        """The global step a training stage starts at: the steps of the training stages before it."""
        return sum(len(train_log(t.ref.path)) for t in timings if t.stage == "train")

    @contextlib.contextmanager
    def live(self, label: str, timings: list):
        """Stream the steps of the training stage run inside this block (see LiveMetrics)."""
        runs = {run: keys for run, keys in ((self.child(label), STEP_KEYS), (self.parent, PARENT_KEYS)) if run}
        if not runs:
            yield
            return
        live = LiveMetrics(self.tracker, runs, self.steps_before(timings), LIVE_INTERVAL)
        token = LIVE.set(live)
        try:
            yield
        finally:
            LIVE.reset(token)
            live.close()
            for run, steps in live.delivered.items():
                self.delivered.setdefault((run, label), set()).update(steps)

    def finish_safely(self, *args: Any, **kwargs: Any) -> dict:
        """`finish`, timed; a bug in what is logged warns instead of failing a pipeline that trained fine."""
        started = time.perf_counter()
        try:
            tracked = self.finish(*args, **kwargs)
        except Exception as e:
            warnings.warn(f"MLflow logging at the end of the run failed ({type(e).__name__}: {e}); the results are "
                          "in the run's report folder", stacklevel=2)
            tracked = self.tracker.summary() | {"run_id": self.parent, "run_url": self.run_url(self.parent),
                                                "champion": {}, "error": f"{type(e).__name__}: {e}"}
        return tracked | {"final_logging_s": round(time.perf_counter() - started, 1)}

    def finish(self, report: dict, timings: list, evaluations: list, data_path: str, stats: dict | None = None,
               async_refresh: dict | None = None, extra_plots: Iterable[Path] = (),
               plots_dir: Path | None = None, selected: tuple[str, ArtifactRef] | None = None,
               dev: dict[str, ArtifactRef] | None = None, dev_setting: str | None = None) -> dict:
        """Log the rest of the run (see the class docstring). `selected`: the run's result (label, checkpoint), the
        champion candidate; `dev`: each model's evaluation on the dev split, logged beside the other; `dev_setting`:
        the dev split's name and content digest (a champion's dev score is compared only on the same one)."""
        tracker, parent = self.tracker, self.parent
        stats = {label: read_stats(ref) for label, ref in (stats or {}).items()}
        per_model: dict[str, dict[str, float]] = {}
        for t in timings:
            key, times = f"time_{t.stage.replace('-', '_')}_s", per_model.setdefault(t.label, {})
            times[key] = times.get(key, 0.0) + t.ref.seconds
        curve, global_step, versions = [], 0, []
        results = {row["model"]: {k: v for k, v in row.items() if k != "model"} for row in report["results"]}
        last_train = next((t for t in reversed(timings) if t.stage == "train"), None)
        for t in timings:
            if t.stage != "train":
                continue
            child, records = self.child(t.label), train_log(t.ref.path)
            for run, keys in ((child, STEP_KEYS), (parent, PARENT_KEYS)):
                done = self.delivered.get((run, t.label), set())
                tracker.log_history(run, [r for r in records if r["step"] not in done], keys, global_step)
            curve += [r | {"step": r["step"] + global_step, "stage": t.label} for r in records]
            if async_refresh is not None and Path(t.ref.path, "async_state.json").is_file():
                state = json.loads(Path(t.ref.path, "async_state.json").read_text())
                # recorded before each step (0-based, as the trainer asks for negatives); logged at the step it trained
                tracker.log_history(child, [{"step": s + 1, "staleness": v} for s, v in state["staleness"]],
                                    ["staleness"], global_step)
            global_step += len(records)
            log_checkpoint(tracker, child, t.ref.path)
            if t.label in results:
                versions.append((t.label, child, results[t.label]))
            elif t is last_train:  # the asynchronous trainer: its final checkpoint is the last model evaluated
                versions.append((t.label, child, results[report["results"][-1]["model"]]))
                if selected is not None and selected[0] == report["results"][-1]["model"]:
                    selected = (t.label, selected[1])
        if selected is not None and selected[0] not in {label for label, _, _ in versions}:
            label = selected[0]  # the starting model, or an asynchronous round's snapshot, is the run's result
            log_checkpoint(tracker, self.child(label), selected[1].path)
            versions.append((label, self.child(label), results[label]))
        samples = [(t.label, t.ref.path) for t in timings if t.stage == "mine"]
        evaluation_of = dict(evaluations)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            if samples:
                tables = read_tables(data_path)
                for label, folder in samples:
                    page = negatives_sample(pd.read_parquet(Path(folder, "negatives.parquet")), tables.corpus,
                                            tables.queries)
                    (tmp / "negatives_sample.md").write_text(page)
                    tracker.log_artifact(self.child(label), tmp / "negatives_sample.md", "negatives")
            for k, row in enumerate((async_refresh or {}).get("rounds", []), 1):
                per_model.setdefault(f"ANCE round {k}", {}).update(
                    {"staleness_mean": row["mean_staleness"], "staleness_max": row["max_staleness"]})
            table = []
            trained = [t.label for t in timings if t.stage == "train"]
            for label in [x for x in per_model if x not in results and x not in trained]:  # e.g. data preparation
                tracker.log_metrics(parent, {f"{label}_{k}": v for k, v in per_model[label].items()})
            for label in dict.fromkeys([*results, *trained]):
                neg = stats.get(label, {})
                ranks = {f"neg_{k}": v for k, v in neg.items()
                         if k in ("mean_negative_rank", "median_negative_rank") and v is not None}
                overlap = {"neg_overlap_top100": neg["overlap"]} if "overlap" in neg else {}
                counts = {f"neg_{k}": neg[k] for k in ("fallback_queries", "fallback_negatives", "above_positive")
                          if neg.get(k) is not None}
                metrics = results.get(label, {}) | per_model.get(label, {}) | ranks | overlap | counts
                child = self.child(label)
                tracker.log_metrics(child, metrics)
                if label in evaluation_of:
                    tracker.log_artifacts(child, evaluation_of[label].path, "evaluation")
                if label in (dev or {}):
                    tracker.log_artifacts(child, dev[label].path, "evaluation-dev")
                tracker.end_run(child)
                table.append({"model": label, **metrics})
            result_label = report.get("selected") or report["results"][-1]["model"]
            tracker.log_metrics(parent, results[result_label])
            tracker.set_tags(parent, {"result_model": result_label} | (
                {"warnings": "\n".join(report["warnings"])[:5000]} if report.get("warnings") else {}))
            curves = plot_curves(curve, report["results"], stats, async_refresh, plots_dir or tmp)
            curves.append(plot_quality_over_time(quality_over_time(report["results"], timings), report["split"],
                                                 report.get("dev_split"), plots_dir or tmp))
            for path in [*curves, *extra_plots]:
                tracker.log_artifact(parent, path, "plots")
            (tmp / "results.md").write_text(report["markdown"])
            pd.DataFrame(table).to_csv(tmp / "results.csv", index=False)
            for name in ("results.md", "results.csv"):
                tracker.log_artifact(parent, tmp / name, "report")
        decision = register_models(tracker, model_name(report["dataset"]), versions, report["dataset"],
                                   report["split"], selected[0] if selected is not None and dev_setting else None,
                                   dev_setting)
        if decision:
            tracker.set_tags(parent, {f"champion.{k}": v for k, v in decision.items()})
        if tracker.undelivered:
            tracker.set_tags(parent, {"tracking.undelivered_calls": sum(tracker.undelivered.values()),
                                      "tracking.kept_in": str(tracker.spool)})
        tracker.end_run(parent)
        return tracker.summary() | {"run_id": parent, "run_url": self.run_url(parent), "champion": decision,
                                    "experiment_id": tracker.experiment_id}


def closing_lines(summary: dict, selected: str | None = None, warnings: Iterable[str] = (),
                  on_dev: bool = True) -> list[str]:
    """What the flow prints (and puts in its Prefect artifact) when it ends: its warnings, its result, and tracking."""
    lines = [f"WARNING: {w}" for w in warnings]
    if selected is not None:
        lines.append(f"Result: {selected} " + ("(the best dev nDCG@10 of the run's models, the starting one included)"
                                              if on_dev else "(the last model: there is no dev split to choose on)"))
    where = summary["run_url"] or f"{summary['tracking_uri']} (run {summary['run_id']})"
    lines += [f"MLflow: parent run {where}" + (f" (final logging took {summary['final_logging_s']} s)"
                                               if "final_logging_s" in summary else "")]
    if (c := summary.get("champion")) and "promoted" in c:
        lines.append(f"MLflow: champion is version {c['champion_version']} "
                     f"({'promoted now' if c['promoted'] else 'kept'}: {c['reason']})")
    elif c and c.get("versions"):
        lines.append(f"MLflow: registered versions {', '.join(map(str, c['versions']))}; the champion alias did not "
                     "move (only a pipeline run's result, chosen on its dev split, can take it)")
    if versions := summary.get("compression", summary).get("registered", {}).get("versions"):
        lines.append(f"MLflow: ConAE compressed models registered as versions {', '.join(map(str, versions))}")
    if summary["delivered_late"]:
        lines.append(f"MLflow: {summary['delivered_late']} metric points were delivered late, after the tracking "
                     f"server came back")
    if summary["undelivered_calls"]:
        what = ", ".join(f"{n} {call}" for call, n in summary["undelivered"].items())
        lines.append(f"MLflow: NOT delivered: {what} calls; kept in {summary['kept_in']} (one JSON line per call; "
                     f"the metrics are also in each training stage's train_log.jsonl)")
        lines.append("MLflow: to deliver everything once the tracking server is back, run the same pipeline again: "
                     "its stages are cached, and the new run logs all of them")
    return lines


def model_name(dataset: str) -> str:
    """The registered model a dataset's pipeline runs register their rounds under."""
    return f"ance-{Path(dataset).name}"


def champion_checkpoint(work_dir: str | Path, dataset: str, tracking_uri: str | None = None) -> tuple[str | None, str]:
    """Download `models:/ance-<dataset>@champion` into <work_dir>/champion/<name>-v<version>/ (once; atomically).

    Returns (checkpoint folder, "models:/<name>@champion (version N)"), or (None, why) when there is none."""
    uri = resolve_tracking_uri(work_dir, tracking_uri)
    name = model_name(dataset)
    try:
        with store_lock(uri):
            client = MlflowClient(uri, registry_uri=uri)
            version = client.get_model_version_by_alias(name, "champion")
    except Exception as e:  # no such model or alias, or the tracking server is unreachable
        return None, f"models:/{name}@champion not found at {uri} ({type(e).__name__}: {str(e)[:200]})"
    final = Path(work_dir).resolve() / "champion" / f"{name}-v{version.version}"
    if not (final / "ance_model.json").is_file():
        tmp = final.parent / f".partial-{final.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        # the version's source is runs:/<run id>/checkpoint (register_models)
        folder = client.download_artifacts(version.run_id, version.source.split("/", 3)[-1], str(tmp))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(folder, final)
        shutil.rmtree(tmp, ignore_errors=True)
    return str(final), f"models:/{name}@champion (version {version.version})"


LATEST = "latest.json"


def trained_checkpoint(work_dir: str | Path, dataset: str, explicit: str | None = None) -> tuple[str, str]:
    """(checkpoint folder, where it came from): `explicit`, else the champion `models:/ance-<dataset>@champion`, else
    the newest model of the work folder (<work_dir>/latest.json, written by every pipeline run); an AnceError when
    there is none of them."""
    if explicit is not None:
        return explicit, "the given checkpoint"
    start, source = champion_checkpoint(work_dir, dataset)
    if start is not None:
        return start, source
    latest = Path(work_dir) / LATEST
    if not latest.is_file():
        raise AnceError(f"{source}, and {latest} does not exist: no trained model yet; run the ance-train deployment "
                        "first or name a checkpoint")
    print(f"{source}; using the newest model of the work folder instead")
    return json.loads(latest.read_text())["checkpoint"], str(latest)
