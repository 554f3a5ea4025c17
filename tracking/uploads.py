"""A checkpoint logged to MLflow as a model that encodes text (and searches, with a retrieval package), uploaded
once per experiment: a run whose checkpoint an earlier run holds already points at that run.
"""

from pathlib import Path

from ance_core.artifacts import MANIFEST, digest_of, file_digest
from ance_core.errors import DamagedCheckpoint, warn
from ance_core.modeling.model import model_files
from tracking.client import Tracker

MLFLOW_MODELS = "mlflow-models"  # <work_dir>/mlflow-models/<checkpoint digest>-<signature>/: MLflow model descriptions
LOGGED_TAG = "checkpoint_logged"  # on a run whose checkpoint/ received every file: the digest of what it holds
HELD_IN_TAG = "checkpoint_in_run"  # on a run whose checkpoint an earlier run of the experiment holds already


def log_checkpoint(tracker: Tracker, run_id: str | None, folder: str | Path, retrieval: str | Path | None = None
                   ) -> str | None:
    """A checkpoint's model files (weights, head, config, tokenizer) under `checkpoint/`, not its training state, and
    the files that make `checkpoint/` an MLflow model that encodes text (tracking/pyfunc.py): a registered version
    loads with `mlflow.pyfunc.load_model` and serves with `mlflow models serve`. `retrieval`: a retrieval package
    (ance_core/export/hybrid.py) logged as `checkpoint/retrieval/`, with which the served model searches.

    The run that holds the checkpoint, once every file arrived (a version is registered only then: one whose files
    are in the spool would download as an empty folder); None otherwise. An earlier run of the experiment that holds
    the same files (a run again whose stages were reused, a flow run retried after a late failure) is that run: the
    files are not uploaded again (a checkpoint is ~90 MB, a retrieval package up to 512 MB), and `run_id` is tagged
    `checkpoint_in_run` with its id."""
    from ance_core.export.hybrid import RETRIEVAL
    from tracking.pyfunc import mlflow_model_files

    files, described = model_files(folder), []
    try:
        described = mlflow_model_files(folder, tracker.work_dir / MLFLOW_MODELS)
    except DamagedCheckpoint as e:  # (a cached stage's files cut short): a version of it would not load
        stage = (Path(folder) / MANIFEST).is_file()
        warn(f"{e}; it is not logged to MLflow nor registered"
             + (" (a stage of the work folder: remove the folder, and the next run builds it again)" if stage else ""))
        return None
    except Exception as e:  # tracking never stops the pipeline: the checkpoint is still logged and registered
        warn(f"{folder}: logged without its MLflow model description ({type(e).__name__}: {e}); mlflow.pyfunc "
             "cannot load this version")
    if run_id is None:  # no MLflow run to hold them (the server was down when it was to be created)
        tracker.log_artifact(run_id, files[0], "checkpoint")  # (refused: said once, as every call for such a run)
        return None
    held = uploaded_files(files, [p.name for p in described], retrieval)
    files += described
    if (earlier := holder(tracker, held, [p.name for p in files])) is not None:
        tracker.set_tags(run_id, {HELD_IN_TAG: earlier})
        return earlier
    if not all([tracker.log_artifact(run_id, path, "checkpoint") for path in files]):
        return None
    if retrieval is None or tracker.log_artifacts(run_id, retrieval, f"checkpoint/{RETRIEVAL}"):
        tracker.set_tags(run_id, {LOGGED_TAG: held})  # (a package kept in the spool: a version that encodes only)
    return run_id


def uploaded_files(files: list[Path], described: list[str], retrieval: str | Path | None) -> str:
    """The digest of what `log_checkpoint` uploads: the model files' names and contents, the names of its MLflow
    description's files and their version (`SIGNATURE`: their contents hold a uuid and a time of their own, so that
    another work folder's description of the same model differs), the retrieval package's names and contents."""
    from tracking.pyfunc import SIGNATURE

    package = sorted(p for p in Path(retrieval).rglob("*") if p.is_file()) if retrieval is not None else []
    return digest_of({"checkpoint": {p.name: file_digest(p) for p in files}, "described": [SIGNATURE, *described],
                      "retrieval": {p.relative_to(retrieval).as_posix(): file_digest(p) for p in package}})


def holder(tracker: Tracker, held: str, names: list[str]) -> str | None:
    """An active run of the tracker's experiment tagged as holding `held` whose `checkpoint/` still lists `names` (and
    that is still active once listed: a run deleted meanwhile lists its files until MLflow's gc removes them)."""
    if tracker.experiment_id is None:
        return None
    ok, runs = tracker.attempt(tracker.client.search_runs, [tracker.experiment_id], f"tags.{LOGGED_TAG} = '{held}'",
                               max_results=5, kept=False)
    for run in runs if ok else []:
        ok, listed = tracker.attempt(tracker.client.list_artifacts, run.info.run_id, "checkpoint", kept=False)
        if ok and set(names) <= {Path(f.path).name for f in listed}:
            ok, now = tracker.attempt(tracker.client.get_run, run.info.run_id, kept=False)
            if ok and now.info.lifecycle_stage == "active":
                return run.info.run_id
    return None
