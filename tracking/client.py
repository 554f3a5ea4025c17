"""The MLflow client of a run, which never slows or stops the pipeline.

Every MLflow call goes through `Tracker.attempt`/`_safe`. When the store or server fails, a warning is printed once,
calls go straight to the spool for PROBE_SECONDS before MLflow is tried again, and each call that was not delivered
is appended to `<work_dir>/mlflow-undelivered.jsonl` (one JSON object per call, with its payload).
"""

import contextlib
import json
import os
import socket
import textwrap
import threading
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from ance_core.errors import AnceError, AnceWarning
from tracking.stores import check_sqlite_store, file_store_problem, resolve_tracking_uri, store_lock

UNDELIVERED = "mlflow-undelivered.jsonl"
HOST_TAG, PID_TAG = "process_host", "process_pid"  # a top-level run's process (`Tracker._end_orphans`)
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
BATCH = 1000  # MLflow accepts at most 1000 metrics per log_batch call
PROBE_SECONDS = 20.0  # after a failure, how long calls go straight to the spool before MLflow is tried again
# MLflow's answers to a call it refuses, not signs of a server that is gone: the next calls are tried as usual
REFUSED = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "BAD_REQUEST",
           "INVALID_STATE"}

# MLflow (3.17) reads MLFLOW_DISABLE_TELEMETRY when `mlflow` is first imported (mlflow/__init__.py creates its
# telemetry client then, which writes an installation id under ~/.config/mlflow) and again at every tracked call; the
# two HTTP settings are read at each request (mlflow/utils/rest_utils.py). So nothing in this package imports mlflow
# at module level: `mlflow_client` imports it after configure_mlflow(), and the other functions that import it run
# only once a client exists.
MLFLOW_DEFAULTS = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    # a dead tracking server costs seconds, not MLflow's default of 7 retries with 120 s timeouts
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
    # MLflow's INFO lines (creating the store's tables, validating each model's input example, a link per ended
    # run) between the pipeline's own: the run's MLflow lines at its end say where everything is
    "MLFLOW_LOGGING_LEVEL": "WARNING",
}


def configure_mlflow() -> None:
    """MLflow's settings for the pipeline (MLFLOW_DEFAULTS), unless the environment sets them already."""
    for name, value in MLFLOW_DEFAULTS.items():
        os.environ.setdefault(name, value)


def mlflow_client(uri: str, registry_uri: str | None = None):
    """An MlflowClient for `uri`, MLflow configured first (see MLFLOW_DEFAULTS); a URI MLflow cannot use (a typo in
    its scheme, `localhost:5000` without one) is an AnceError naming where it came from."""
    from ance_core.errors import AnceError

    configure_mlflow()
    from mlflow.tracking import MlflowClient

    where = "MLFLOW_TRACKING_URI" if os.environ.get("MLFLOW_TRACKING_URI") == uri else "the tracking URI"
    if problem := file_store_problem(uri):
        raise AnceError(f"{where} '{uri}' {problem}")
    check_sqlite_store(uri, where)
    if registry_uri and registry_uri != uri:
        check_sqlite_store(registry_uri, "the registry URI")
    try:
        return MlflowClient(uri, registry_uri=registry_uri)
    except Exception as e:  # (an unsupported scheme: MLflow's registry store lookup raises)
        # (SQLAlchemy's errors go on with the SQL: the first line, cut at a word; it was cut mid-list at 150 characters)
        said = textwrap.shorten(str(e).splitlines()[0], 400, placeholder=" ...") if str(e).strip() else ""
        raise AnceError(f"{where} '{uri}' cannot be used by MLflow ({type(e).__name__}: {said}); give a "
                        "tracking server as http(s)://host:port, or sqlite:///<path>.db (unset: the work folder's "
                        "own store)") from None


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


PROXIED = "mlflow-artifacts:"  # an artifact location that only a tracking server serving artifacts can write


def proxied_only(experiment, uri: str) -> str | None:
    """Why an experiment cannot take a run from this store (None: it can). One whose artifacts a tracking server keeps
    behind its proxy (`mlflow-artifacts:/1`: made by a server started with --artifacts-destination and no
    --default-artifact-root, as `make up`'s was before session 34) cannot take a run from an embedded store: every
    artifact, and so the model, would be lost."""
    if uri.startswith("http") or not str(experiment.artifact_location).startswith(PROXIED):
        return None
    return (f"the MLflow experiment '{experiment.name}' in {uri} keeps its artifacts behind a tracking server "
            f"({experiment.artifact_location}): log through the server that made it (`make up`, then export the "
            "MLFLOW_TRACKING_URI it prints), or move that store aside to start a new one")


def stopped_by_signal(error: BaseException) -> bool:
    """Whether a stop ended the block, not a failure: Ctrl-C (KeyboardInterrupt), a stop signal the `ance` command
    turns into SystemExit(128 + signal) (ance_cli/guard.py), or one Prefect's engine raises in a flow run's process
    (its TerminationSignal, an ExternalSignal: the SIGTERM of a cancelled flow run, or of a stopped worker)."""
    if isinstance(error, KeyboardInterrupt):
        return True
    if isinstance(error, SystemExit):
        return isinstance(error.code, int) and error.code > 128
    return any(kind.__name__ == "ExternalSignal" for kind in type(error).__mro__)  # (prefect.exceptions': tracking
    # names it rather than import the orchestrator)


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
        self._refusals: set[str] = set()  # the refusals warned of (each once)
        self._lock = threading.Lock()
        self._reaped = False  # runs of dead processes ended (`_end_orphans`, at the first top-level run)
        self.context: dict[str, str] = {}  # added to every spooled call (e.g. the Prefect flow run id)
        with store_lock(self.uri):
            self.client = mlflow_client(self.uri)
            self._proxied: str | None = None
            self.experiment_id = self._safe("get_experiment", self._experiment, experiment,
                                            payload={"name": experiment})
        if self._proxied:  # refused before any stage runs, not a run whose artifacts all go missing
            raise AnceError(self._proxied)

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None and found.lifecycle_stage == "deleted":  # deleted in the UI: no run can be logged to it
            self.client.restore_experiment(found.experiment_id)
            warnings.warn(f"the MLflow experiment '{name}' at {self.uri} had been deleted; it is restored to log this "
                          "run (to remove it for good: `mlflow gc`, then its name is free)", AnceWarning,
                          stacklevel=3)
        if found is not None:
            self._proxied = proxied_only(found, self.uri)
            experiment_id = found.experiment_id
        else:
            location = None if self.uri.startswith("http") else (self.work_dir / "mlartifacts").as_uri()
            experiment_id = self.client.create_experiment(name, artifact_location=location)
        if found is None or EXPERIMENT_KIND[0] not in found.tags:  # the UI opens it on its runs, not on GenAI traces
            self.client.set_experiment_tag(experiment_id, *EXPERIMENT_KIND)
        return experiment_id

    def attempt(self, fn: Callable, *args: Any, kept: bool = True, **kwargs: Any) -> tuple[bool, Any]:
        """Call MLflow; (False, error) instead of raising. After a failure, calls are not tried (they fail at once)
        until PROBE_SECONDS have passed, so a dead server costs one timeout, not one per call. `kept`: a refused call
        is said to be kept in the spool (the caller keeps it; not the champion alias's move)."""
        if self.failed_since is not None and time.time() < self._next_probe:
            return False, "tracking server unreachable (not retried yet)"
        try:
            result = fn(*args, **kwargs)
        except Exception as e:  # tracking must never stop training
            # refused by the server, or a call for a run that was never created (its id None: a TypeError or
            # AttributeError inside MLflow's client): not an outage, so the calls after it are tried as usual
            if getattr(e, "error_code", None) in REFUSED or isinstance(e, (TypeError, AttributeError)):
                with self._lock:
                    if (said := f"{type(e).__name__}: {str(e)[:200]}") not in self._refusals:
                        self._refusals.add(said)
                        warnings.warn(f"MLflow at {self.uri} did not take a call ({said})"
                                      + (f"; it is kept in {self.spool}" if kept else ""), AnceWarning,
                                      stacklevel=3)
                return False, e
            with self._lock:
                if self.failed_since is None:
                    self.failed_since = time.time()
                self._next_probe = time.time() + PROBE_SECONDS
                if not self._warned:
                    self._warned = True
                    warnings.warn(f"MLflow at {self.uri} failed ({type(e).__name__}: {e}); the pipeline goes on, "
                                  f"retries later and keeps what cannot be delivered in {self.spool}", AnceWarning,
                                  stacklevel=3)
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
        else:  # a top-level run says which process holds it, so that a later run can end it if that process died
            tags |= {HOST_TAG: _host(), PID_TAG: str(os.getpid())}
            if not self._reaped:
                self._reaped = True
                try:  # (not through `attempt`: a failure here must not send the run's own calls to the spool)
                    self._end_orphans()
                except Exception:  # tidying only: the next run tries again
                    pass
        run = self._safe("create_run", self.client.create_run, self.experiment_id, tags=tags,
                         payload={"name": name, "tags": tags})
        return run.info.run_id if run is not None else None

    def log_params(self, run_id: str | None, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        items = [Param(k, v[:6000]) for k, v in params.items()]
        for start in range(0, len(items), 100):
            self._safe("log_params", self.client.log_batch, run_id, params=items[start:start + 100],
                       payload={"run_id": run_id, "params": dict(list(params.items())[start:start + 100])})

    def log_metrics(self, run_id: str | None, metrics: dict[str, float], step: int = 0) -> None:
        self.log_history(run_id, [{"step": step, **metrics}], keys=list(metrics))

    def log_history(self, run_id: str | None, records: Iterable[dict], keys: list[str], step_offset: int = 0) -> None:
        """Per-step records (e.g. train_log.jsonl) as metric histories, batched (no per-step round trips); a record's
        "timestamp" (ms since the epoch), where it has one, is its points' time; else the time they are logged (not
        1970: MLflow's charts by wall time would start there)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(metric_key(k), float(r[k]), int(r.get("timestamp", now)), int(r["step"]) + step_offset)
                   for r in records for k in keys if k in r]
        for start in range(0, len(metrics), BATCH):
            chunk = metrics[start:start + BATCH]
            ok, error = self.attempt(self.client.log_batch, run_id, metrics=chunk)
            if not ok:
                points = [(m.key, m.value, m.step) for m in chunk]
                self.keep("log_metrics", {"run_id": run_id, "metrics": points}, error)

    def log_inputs(self, run_id: str | None, datasets: list) -> None:
        """Dataset inputs (mlflow.entities.DatasetInput): the runs table's Dataset column."""
        self._safe("log_inputs", self.client.log_inputs, run_id, datasets,
                   payload={"run_id": run_id, "datasets": [(d.dataset.name, d.dataset.digest) for d in datasets]})

    def set_tags(self, run_id: str | None, tags: dict[str, str]) -> None:
        from mlflow.entities import RunTag

        self._safe("set_tags", self.client.log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()],
                   payload={"run_id": run_id, "tags": tags})

    def _delivered(self, what: str, fn: Callable, *args: Any, payload: Any = None) -> bool:
        """`_safe` for a call whose result says nothing (a file logged): whether it was delivered (else it is kept in
        the spool)."""
        ok, result = self.attempt(fn, *args)
        if not ok:
            self.keep(what, payload, result)
        return ok

    def log_artifact(self, run_id: str | None, path: str | Path, artifact_path: str | None = None) -> bool:
        """True when delivered; else the call is kept in the spool."""
        return self._delivered("log_artifact", self.client.log_artifact, run_id, str(path), artifact_path,
                               payload={"run_id": run_id, "file": str(path), "artifact_path": artifact_path})

    def log_artifacts(self, run_id: str | None, folder: str | Path, artifact_path: str | None = None) -> bool:
        """True when delivered; else the call is kept to replay, naming `folder` (which must then stay)."""
        return self._delivered("log_artifacts", self.client.log_artifacts, run_id, str(folder), artifact_path,
                               payload={"run_id": run_id, "folder": str(folder), "artifact_path": artifact_path})

    def end_run(self, run_id: str | None, status: str = "FINISHED") -> None:
        if run_id is not None:
            self._safe("end_run", self.client.set_terminated, run_id, status, payload={"run_id": run_id})

    @contextlib.contextmanager
    def ended_on_failure(self, runs: Callable[[], Iterable[str | None]]):
        """Runs the block raises out of are ended FAILED (KILLED when a stop ended it: `stopped_by_signal`), not left
        RUNNING in MLflow's runs table forever; `runs()` names them when it happens (e.g. the nested runs opened so
        far, then their parent). A block that ends normally ends its runs itself."""
        try:
            yield
        except BaseException as e:
            status = "KILLED" if stopped_by_signal(e) else "FAILED"
            for run_id in runs():
                if run_id is not None and self._running(run_id):  # (one the block ended itself keeps its status)
                    self.end_run(run_id, status)
            raise

    def _end_orphans(self) -> None:
        """Runs left RUNNING by a process of this host and pid namespace that is gone (killed with SIGKILL, or the
        machine lost power: nothing in it could end them), with their nested runs, ended KILLED when the next run
        starts, so that MLflow's table does not show them running forever. A process that is alive (or a pid reused
        since) is left alone."""
        host = _host()
        running = self.client.search_runs([self.experiment_id], "attributes.status = 'RUNNING'", max_results=5000)
        children: dict[str, list[str]] = {}
        for run in running:
            children.setdefault(run.data.tags.get("mlflow.parentRunId", ""), []).append(run.info.run_id)
        for run in running:
            pid = run.data.tags.get(PID_TAG, "")
            if run.data.tags.get(HOST_TAG) != host or not pid.isdigit() or _alive(int(pid)):
                continue
            ended, todo = [], [run.info.run_id]
            while todo:
                ended.append(todo.pop())
                todo += children.get(ended[-1], [])
            for run_id in ended:
                self.client.set_terminated(run_id, "KILLED")
                self.client.set_tag(run_id, "ended_by", f"a later run: process {pid} on {host} had died")

    def _running(self, run_id: str) -> bool:
        try:
            return self.client.get_run(run_id).info.status == "RUNNING"
        except Exception:  # the server unreachable: end it (the call is spooled like any other)
            return True

    def summary(self) -> dict:
        """What did not reach MLflow, and where it is kept (printed and returned by the flow)."""
        return {"tracking_uri": self.uri, "undelivered": dict(self.undelivered),
                "undelivered_calls": sum(self.undelivered.values()), "delivered_late": self.delivered_late,
                "kept_in": str(self.spool) if self.undelivered else None}


def _host() -> str:
    """This machine and process-id namespace (a container on the host's network has the host's name and pids of its
    own): where a run's pid means one process."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return f"{socket.gethostname()}/pid-ns-{namespace}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's process)
        return True
    return True
