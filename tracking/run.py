"""The MLflow record of a pipeline run: the parent run and a nested run per model, opened when the flow starts and
completed when it ends (metrics, negatives statistics, checkpoints, evaluations, plots, results table, registry and
champion alias).
"""

import contextlib
import gzip
import json
import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from ance_core.allocator import in_use as allocator_in_use
from ance_core.artifacts import RUN_TREC, ArtifactRef
from ance_core.data.corpus import read_corpus_rows
from ance_core.data.dataset import read_tables
from ance_core.errors import AnceWarning
from ance_core.negatives.analysis import negatives_sample, negatives_sample_docs, read_stats
from ance_core.negatives.refresh_state import read_refresh_state
from ance_core.pipeline.plots import plot_curves, plot_quality_over_time, quality_over_time
from ance_core.pipeline.report import DEV_KEY, last_dense
from ance_core.system_metrics import read_system_metrics
from tracking.client import Tracker, flatten
from tracking.live import LIVE, LIVE_INTERVAL, PARENT_KEYS, STEP_KEYS, LiveMetrics
from tracking.registry import dataset_source, model_name, register_models
from tracking.uploads import log_checkpoint

MLFLOW_UI_URL = "ANCE_MLFLOW_UI_URL"  # the tracking server's address as a browser reaches it, where the flow runs
# reach it by another (a compose network's http://mlflow:5000, which no browser on the host resolves)


def run_url(tracker: Tracker, run_id: str | None) -> str | None:
    """The run's page in the MLflow UI of a tracking server (None for the embedded store, which has no UI of its
    own), at `ANCE_MLFLOW_UI_URL` when set."""
    if run_id is None or not tracker.uri.startswith("http"):
        return None
    base = os.environ.get(MLFLOW_UI_URL) or tracker.uri
    return f"{base.rstrip('/')}/#/experiments/{tracker.experiment_id}/runs/{run_id}"


def _git_commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parents[1]).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def train_log(folder: str | Path) -> list[dict]:
    log = Path(folder) / "train_log.jsonl"
    return [json.loads(x) for x in log.read_text().splitlines()] if log.is_file() else []


def dataset_inputs(name: str, folder: str, summary: dict, splits: dict[str, str]) -> list:
    """MLflow dataset inputs, one per split ({context: split}) that the prepared dataset has: name <name>/<split>,
    digest the split's content digest, source the prepared tables' folder, profile the split's query-relevance
    count and the corpus size; tagged with its context (training, dev, evaluation)."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    out = []
    for context, split in splits.items():
        if split not in summary.get("split_digests", {}):
            continue
        profile = {"documents": summary.get("documents"), "qrels": summary.get(f"qrels_{split}")}
        dataset = Dataset(f"{name}/{split}", summary["split_digests"][split], "local",
                          json.dumps({"uri": str(Path(folder).resolve())}), profile=json.dumps(profile))
        out.append(DatasetInput(dataset, [InputTag("mlflow.data.context", context)]))
    return out


class PipelineTracking:
    """The MLflow record of one pipeline run.

    Opened when the flow starts: the parent run (tags, every config value as a param), so the run is visible at
    once. While a stage trains, `live(label, ...)` streams its steps to the model's nested run and to the parent
    (LiveMetrics). `finish` logs the rest when the flow ends: metrics per model, stage times, negatives statistics,
    staleness, the steps not delivered live, checkpoints, evaluations, negatives samples, plots, the results table,
    and the model registry with its champion decision.
    """

    def __init__(self, config: BaseModel, flow_tags: dict[str, str], experiment: str = "ance-train",
                 tracker: Tracker | None = None, trial: bool = False, trial_of: str | None = None,
                 name: str | None = None):
        """`trial`: the run is a trial of a recipe search (`ance tune`): its checkpoints are not logged nor
        registered; nested under the search's run `trial_of` (an id of `experiment`'s) when there is one."""
        self.config = config
        self.tracker = tracker or Tracker(config.work_dir, experiment)
        self.tracker.context = {k: v for k, v in flow_tags.items() if k == "prefect.flow_run_id"}
        self.tags = {k: v for k, v in flow_tags.items() if v} | {
            "git_commit": _git_commit(), "dataset": config.data.dataset, "model": config.model.name,
            "allocator": allocator_in_use()}  # (stage times depend on it: ance_core/allocator.py)
        self.trial = trial
        name = name or f"{experiment} {flow_tags.get('prefect.flow_run_name', '')}".strip()
        self.parent = self.tracker.start_run(name, parent_id=trial_of, tags=self.tags | (
            {"trial": "true"} if self.trial else {}))
        self.tracker.log_params(self.parent, flatten(config))
        self.children: dict[str, str | None] = {}
        self.inputs: list = []  # the run's datasets (set_dataset), logged on every run of the record
        self.delivered: dict[tuple[str, str], set[int]] = {}  # (run id, stage label) -> steps that arrived live

    def child(self, label: str) -> str | None:
        if self.children.get(label) is None:  # (a run the server could not create is tried again, not kept as None)
            self.children[label] = self.tracker.start_run(label, parent_id=self.parent, tags=self.tags | {
                "stage": label})
            if self.inputs and self.children[label]:
                self.tracker.log_inputs(self.children[label], self.inputs)
        return self.children[label]

    def set_dataset(self, digest: str, folder: str, summary: dict, splits: dict[str, str]) -> None:
        """The prepared dataset (its digest, its folder and its manifest's summary) as a tag and as MLflow dataset
        inputs of the parent and every nested run: one per split in `splits` ({context: split}, e.g. training ->
        train), named <dataset>/<split>, with the split's content digest, so that runs on different data are told
        apart in the runs table's Dataset column."""
        self.tracker.set_tags(self.parent, {"dataset_digest": digest})
        self.inputs = dataset_inputs(self.config.data.collection, folder, summary, splits)
        self.tracker.log_inputs(self.parent, self.inputs)

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
        live = LiveMetrics(self.tracker, runs, {self.parent: self.steps_before(timings)}, LIVE_INTERVAL)
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
                          "in the run's report folder", AnceWarning, stacklevel=2)
            for run in [*self.children.values(), self.parent]:  # not left RUNNING in the runs table forever
                if run is not None and self._running(run):
                    self.tracker.end_run(run, "FAILED")
            tracked = self.tracker.summary() | {"run_id": self.parent, "run_url": run_url(self.tracker, self.parent),
                                                "champion": {}, "error": f"{type(e).__name__}: {e}"}
        return tracked | {"final_logging_s": round(time.perf_counter() - started, 1)}

    def _running(self, run_id: str) -> bool:
        try:
            return self.tracker.client.get_run(run_id).info.status == "RUNNING"
        except Exception:  # noqa: BLE001 (unreachable: ending it is tried, and spooled, anyway)
            return True

    def log_system_metrics(self, timings: list) -> None:
        """The system metrics sampled while each training and encoding stage ran (ance_core/system_metrics.py): to the
        model's run (its System metrics tab) and, on one axis for the whole run, to the parent run."""
        steps: dict[str, int] = {}
        for t in timings:
            if t.stage not in ("train", "encode") or not (samples := read_system_metrics(t.ref.path)):
                continue
            keys = sorted({k for s in samples for k in s if k.startswith("system/")})
            for run in dict.fromkeys((self.child(t.label), self.parent)):
                if run is None:
                    continue
                start = steps.get(run, 0)
                self.tracker.log_history(run, [s | {"step": start + k} for k, s in enumerate(samples)], keys)
                steps[run] = start + len(samples)

    def finish(self, report: dict, timings: list, evaluations: list, data_path: str, stats: dict | None = None,
               async_refresh: dict | None = None, extra_plots: Iterable[Path] = (),
               plots_dir: Path | None = None, selected: tuple[str, ArtifactRef] | None = None,
               dev: dict[str, ArtifactRef] | None = None, dev_setting: str | None = None,
               retrieval: Path | None = None, end: bool = True) -> dict:
        """Log the rest of the run (see the class docstring). `selected`: the run's result (label, checkpoint), the
        champion candidate (None: a run with no result, a comparison of samplers, whose parent gets no result's tag
        nor metrics); `dev`: each model's evaluation on the dev split, logged beside the other; `dev_setting`:
        the dev split's name and content digest (a champion's dev score is compared only on the same one);
        `retrieval`: the retrieval package logged with the selected checkpoint (a hybrid result's); `end`: False
        leaves the parent running, for work logged to it after (the pipeline's compression), which ends it."""
        tracker, parent = self.tracker, self.parent
        stats = {label: read_stats(ref) for label, ref in (stats or {}).items()}
        per_model: dict[str, dict[str, float]] = {}
        for t in timings:
            key, times = f"time_{t.stage.replace('-', '_')}_s", per_model.setdefault(t.label, {})
            times[key] = times.get(key, 0.0) + t.ref.seconds
        curve, global_step, versions = [], 0, []
        digests = {t.label: t.ref.digest for t in timings if t.stage == "train"}  # (a version per checkpoint)
        results = {row["model"]: {k: v for k, v in row.items() if k != "model"} for row in report["results"]}
        last_train = next((t for t in reversed(timings) if t.stage == "train"), None)
        for t in timings:
            if t.stage != "train":
                continue
            child, records = self.child(t.label), train_log(t.ref.path)
            for run, keys in ((child, STEP_KEYS), (parent, PARENT_KEYS)):
                done = self.delivered.get((run, t.label), set())
                tracker.log_history(run, [r for r in records if r["step"] not in done], keys,
                                    global_step if run == parent else 0)  # (a stage's own run: from its step 1)
            curve += [r | {"step": r["step"] + global_step, "stage": t.label} for r in records]
            if async_refresh is not None and (state := read_refresh_state(Path(t.ref.path)))["staleness"]:
                # recorded before each step (0-based, as the trainer asks for negatives); logged at the step it trained
                tracker.log_history(child, [{"step": s + 1, "staleness": v} for s, v in state["staleness"]],
                                    ["staleness"])
            global_step += len(records)
            holder = child  # the run that holds the checkpoint's files: its own, or an earlier run's with the same
            if not self.trial:
                # the result's checkpoint (an asynchronous trainer's final one is its last round's) gets the package
                last_round = t is last_train and t.label not in results
                result = selected is not None and (t.label == selected[0] or (
                    last_round and selected[0] == last_dense(report["results"])))
                holder = log_checkpoint(tracker, child, t.ref.path, retrieval if result else None)
            # (a checkpoint whose files did not reach MLflow is not registered: it would download as an empty folder)
            if holder and t.label in results:
                versions.append((t.label, holder, results[t.label]))
            elif holder and t is last_train:  # the asynchronous trainer: its final checkpoint is the last evaluated
                versions.append((t.label, holder, results[last_dense(report["results"])]))
                if selected is not None and selected[0] == last_dense(report["results"]):
                    selected = (t.label, selected[1])
        self.log_system_metrics(timings)
        if self.trial:  # a trial's models are compared, not kept: nothing is registered
            versions, selected = [], None
        if selected is not None and selected[0] not in {label for label, _, _ in versions}:
            label = selected[0]  # the starting model, or an asynchronous round's snapshot, is the run's result
            if holder := log_checkpoint(tracker, self.child(label), selected[1].path, retrieval):
                versions.append((label, holder, results[label]))
                digests[label] = selected[1].digest
        samples = [(t.label, t.ref.path) for t in timings if t.stage == "mine"]
        evaluation_of = dict(evaluations)
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            if samples:
                tables = read_tables(data_path, corpus_columns=[])  # the passages shown are read on their own
                for label, folder in samples:
                    negatives = pd.read_parquet(Path(folder, "negatives.parquet"))
                    shown = read_corpus_rows(data_path, negatives_sample_docs(negatives))
                    page = negatives_sample(negatives, shown, tables.queries)
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
                    log_evaluation(tracker, child, evaluation_of[label].path, "evaluation")
                if label in (dev or {}):
                    log_evaluation(tracker, child, dev[label].path, "evaluation-dev")
                tracker.end_run(child)
                table.append({"model": label, **metrics})
            result_label = report.get("selected") or (last_dense(report["results"]) if selected else None)
            if result_label is not None:
                tracker.log_metrics(parent, results[result_label])
            tracker.set_tags(parent, ({"result_model": result_label} if result_label is not None else {}) | (
                {"best_on_dev": report["best_on_dev"], "selection": report["selection"]}
                if report.get("selection") else {}) | (
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
        # a retrain's: its `start` row scores that model on this dev split (a comparison of samplers has none)
        start = getattr(self.config, "start_checkpoint", None)
        rescored = (start, results["start"][DEV_KEY]) if start and DEV_KEY in results.get("start", {}) else None
        decision = {} if self.trial else register_models(
            tracker, model_name(self.config.data.collection), versions, report["dataset"], report["split"],
            selected[0] if selected is not None and dev_setting else None, dev_setting,
            dataset_source(self.config.data), rescored, digests,
            {label: self.children[label] for label, _, _ in versions})  # (a version's card: its model's run)
        if decision:
            tracker.set_tags(parent, {f"champion.{k}": v for k, v in decision.items() if v is not None})
        if tracker.undelivered:
            tracker.set_tags(parent, {"tracking.undelivered_calls": sum(tracker.undelivered.values()),
                                      "tracking.kept_in": str(tracker.spool)})
        if end:
            tracker.end_run(parent)
        return tracker.summary() | {"run_id": parent, "run_url": run_url(tracker, parent), "champion": decision,
                                    "experiment_id": tracker.experiment_id}


def log_evaluation(tracker: Tracker, run_id: str | None, folder: str | Path, artifact_path: str) -> None:
    """An evaluation stage's files as MLflow artifacts, its TREC run gzipped (`run.trec.gz`: at 2,000 dev queries x
    1,000 hits the plain file is 72-90 MB, most of the MLflow store; gzipped 23 MB, `bench/mlflow_store.py`);
    `ance evaluate --run` reads it as it is. The files
    are gathered in the work folder's `mlflow-pending/` and removed once delivered (an undelivered call is kept to
    replay, and its folder with it)."""
    if run_id is None:  # no MLflow run to hold them (the server was down when it was to be created): nothing kept
        return
    pending = Path(tracker.work_dir) / PENDING / uuid.uuid4().hex[:16]
    pending.mkdir(parents=True)
    for path in Path(folder).iterdir():
        if path.name == RUN_TREC:
            with open(path, "rb") as src, gzip.open(pending / f"{RUN_TREC}.gz", "wb", compresslevel=1) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)  # level 1: 4.6x faster than 6 for 8% more bytes (BENCHMARKS)
        elif path.is_file():
            shutil.copy2(path, pending)
    if tracker.log_artifacts(run_id, pending, artifact_path):
        shutil.rmtree(pending, ignore_errors=True)


PENDING = "mlflow-pending"  # <work_dir>/mlflow-pending/<id>/: files gathered for MLflow until it has them
