"""The model registry: each run's checkpoints registered as versions of `ance-<dataset>`, the `champion` alias moved
only on the dev split, the champion downloaded for `retrain`, and any version downloaded for `ance export`.
"""

import contextlib
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock

from ance_core.artifacts import write_json
from ance_core.errors import AnceError
from ance_core.modeling.model import checkpoint_files
from ance_core.pipeline.report import COLUMNS, DEV_KEY
from tracking.client import Tracker, mlflow_client
from tracking.stores import check_sqlite_store, resolve_tracking_uri, sqlite_file, store_lock

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

    from ance_core.data.config import DataConfig


# the collection that first registered a model under its name: its folder and its content digest
SOURCE_TAGS = {"folder": "dataset_folder", "content": "dataset_content"}


DIGEST_TAG = "checkpoint_digest"
RUN_TAG = "registered_by_run"  # the model's run that registered a version (its files may be an earlier run's)


def same_version(tracker: Tracker, name: str, tags: dict[str, str]):
    """The registered version of `name` of the same checkpoint (`DIGEST_TAG`) with the same tags (the run that
    registered it aside), if any."""
    if DIGEST_TAG not in tags:
        return None
    ok, found = tracker.attempt(tracker.client.search_model_versions,  # (a read: nothing to keep if it fails)
                                f"name = '{name}' and tags.{DIGEST_TAG} = '{tags[DIGEST_TAG]}'", kept=False)
    return next((v for v in found if {k: t for k, t in v.tags.items() if k != RUN_TAG} == tags), None) if ok else None


def register_models(tracker: Tracker, name: str, versions: list[tuple[str, str, dict]], dataset: str,
                    split: str, candidate: str | None = None, dev_setting: str | None = None,
                    source: dict[str, str] | None = None, start: tuple[str, float] | None = None,
                    digests: dict[str, str] | None = None, logged_by: dict[str, str] | None = None) -> dict:
    """Register each (label, run_id, metrics) checkpoint as a version of `name`, its metrics (evaluation and dev
    split) as tags. The alias `champion` moves to the version of `candidate` (the run's result, chosen on the dev
    split) only if its dev nDCG@10 beats the current champion's on the same dataset and dev split (`dev_setting`), or
    if the current champion has no such score; a run that started from the champion (`start`: its checkpoint folder
    and its dev nDCG@10 in this run) compares with the champion's score in this run instead. Without a candidate (no
    dev split, a comparison run) no alias moves: the evaluation split never decides.

    `source` (`dataset_source`: the dataset's folder and content digest) becomes the registered model's tags the
    first time one is given; a later run whose dataset differs in both, folder and content, is told (`shared_with`):
    two collections whose folders have the same name share one registered model, and its champion, until one is
    given a `data.name`. (The same collection read at another path, by a worker of another machine, has the same
    content; one whose files changed, at the same path, the same folder: neither is told.)

    `digests` (label -> the checkpoint's digest, its stage's): a version of the same checkpoint with the same tags (a
    run again of the same config, every stage reused) is that version, not a new one.

    `run_id` is the run that holds the checkpoint's files (tracking/uploads.py: an earlier run's, where it holds the
    same ones); `logged_by` (label -> the model's own run, where that is another) is tagged `registered_by_run` on a
    new version, the run a model card describes."""
    client = tracker.client
    model = tracker._safe("get_registered_model", _ensure_registered_model, client, name, payload={"name": name})
    if model is None:
        return {}
    owner = {k: v for k, v in (model.tags or {}).items() if k in SOURCE_TAGS.values()}
    if source is not None and not owner:
        for field, tag in SOURCE_TAGS.items():
            tracker._safe("set_registered_model_tag", client.set_registered_model_tag, name, tag, source[field],
                          payload={"name": name, "key": tag, "value": source[field]})
    other = source is not None and owner and all(owner.get(tag) != source[f] for f, tag in SOURCE_TAGS.items())
    shared = {"shared_with": owner.get(SOURCE_TAGS["folder"]), "name": name} if other else {}
    chosen, registered = None, []
    for label, run_id, metrics in versions:
        if run_id is None:  # its MLflow run was never created (the server down): no checkpoint to point at
            continue
        tags = {"label": label, "dataset": dataset, "split": split} | {k: f"{v:.6f}" if isinstance(v, float) else str(v)
                                                                         for k, v in metrics.items()}
        tags |= {"dev_split": dev_setting} if dev_setting else {}
        tags |= {DIGEST_TAG: digests[label]} if label in (digests or {}) else {}
        own = {RUN_TAG: logged_by[label]} if (logged_by or {}).get(label, run_id) != run_id else {}
        version = same_version(tracker, name, tags) or tracker._safe(
            "create_model_version", client.create_model_version, name, f"runs:/{run_id}/checkpoint", run_id,
            tags=tags | own, payload={"name": name, "tags": tags | own})
        if version is not None:
            registered.append(version.version)
            if label == candidate:
                chosen = (version.version, metrics)
    if chosen is None or DEV_KEY not in chosen[1] or not dev_setting:
        return shared | ({"versions": registered} if registered else {})
    # runs of one work folder ending at once: each reads the champion and moves the alias in turn (else the last to
    # write would win, better or not)
    locks = Path(tracker.work_dir) / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    with FileLock(locks / f"champion-{name}.lock"):
        return _move_champion(tracker, name, chosen, candidate, dev_setting, start, shared | {"versions": registered})


def _move_champion(tracker: Tracker, name: str, chosen: tuple, candidate: str, dev_setting: str,
                   start: tuple[str, float] | None, said: dict) -> dict:
    """`register_models`' decision: the alias moved to the `chosen` (version, metrics) or not, and why; `said`: what
    the answer holds already."""
    client = tracker.client
    try:
        current = client.get_model_version_by_alias(name, "champion")
    except Exception as e:
        if not _not_found(e):  # (a timeout, a 5xx: the champion may be better; it is not replaced unseen)
            return said | {"candidate": candidate, "candidate_version": chosen[0], "promoted": False,
                           "reason": f"the current champion could not be read ({type(e).__name__}: {str(e)[:120]}); "
                           "the alias was not moved"}
        current = None
    # the same dev queries and labels (dev_setting holds the split's digest): the dataset's path may differ (another
    # machine's worker, `scifact` against `data/scifact`) for the same collection, under the same registered model
    comparable = current is not None and current.tags.get("dev_split") == dev_setting and DEV_KEY in current.tags
    current_score = float(current.tags[DEV_KEY]) if comparable else None
    # a run that started from the champion scored it again on this run's corpus and dev split (its `start` row): the
    # candidate is compared with that score, not with the tag, measured on the data of its own day (a corpus grown
    # since, or training queries added, some of them carved into the dev split)
    rescored = current is not None and start is not None and Path(start[0]).name == champion_folder(name, current)
    if rescored:
        comparable, current_score = True, round(start[1], 6)
    # a champion scored on other dev queries (another dev_fraction, dev_seed or dataset version) is not compared: two
    # configs would take the alias from each other in turn, each unseen by the other's dev split
    elsewhere = current is not None and not comparable and DEV_KEY in current.tags
    # compared at the precision the tags keep: an equal model (an identical re-run) does not take the alias
    promote = not elsewhere and (current_score is None or round(chosen[1][DEV_KEY], 6) > current_score)
    failed = None
    if promote:
        moved, error = tracker.attempt(client.set_registered_model_alias, name, "champion", chosen[0], kept=False)
        if not moved:  # (not spooled to be sent later: a better model may take the alias meanwhile)
            promote = False
            failed = error if isinstance(error, str) else f"{type(error).__name__}: {str(error)[:120]}"
    return said | {
            "candidate": candidate, "candidate_version": chosen[0], "candidate_dev_ndcg_at_10": chosen[1][DEV_KEY],
            "champion_version": chosen[0] if promote else current.version if current is not None else None,
            "champion_dev_ndcg_at_10_before": current_score, "promoted": promote,
            "reason": (f"higher dev nDCG@10, but moving the alias failed ({failed}): the champion is unchanged"
                       if failed else
                       f"the champion (version {current.version}) was chosen on another dev split "
                       f"({current.tags.get('dev_split')!r}, this run's {dev_setting!r}): not comparable, the alias "
                       "stays (move it in MLflow's UI to change it)" if elsewhere else
                       "no champion with a dev score" if current_score is None else
                       ("higher dev nDCG@10" if promote else "the current champion's dev nDCG@10 is not lower")
                       + (" (the champion scored again on this run's dev split, as its starting model)"
                          if rescored else ""))}


def _not_found(error: Exception) -> bool:
    """Whether an MLflow error says the thing asked for does not exist (an alias not set yet: INVALID_PARAMETER_VALUE
    "... not found"; a model or version: RESOURCE_DOES_NOT_EXIST), not that the store could not answer."""
    code = getattr(error, "error_code", None)
    return code == "RESOURCE_DOES_NOT_EXIST" or (code == "INVALID_PARAMETER_VALUE" and "not found" in str(error))


def _ensure_registered_model(client: "MlflowClient", name: str):
    try:
        return client.get_registered_model(name)
    except Exception:
        return client.create_registered_model(name)


def dataset_source(data) -> dict[str, str] | None:
    """The absolute folder a `DataConfig` reads and its content digest (the data stage's, memoised: no second read
    in the run that prepared it); None when it cannot be found (nothing to compare then)."""
    from ance_core.data.sources import dataset_digest, resolve_dataset

    try:
        folder = resolve_dataset(data.dataset, data.data_home, download=False).resolve()
        return {"folder": str(folder), "content": dataset_digest(folder)}
    except Exception:
        return None


def check_model_name(data: "DataConfig", set_by: str = "data.name") -> None:
    """A run that registers its models refuses, before any work, a collection name MLflow would refuse in a
    registered model's name (a dataset folder's name with ':'; `set_by`: how the user names it otherwise)."""
    if ":" in data.collection:
        raise AnceError(f"the dataset folder's name '{data.collection}' cannot name the collection's registered model "
                        f"(MLflow refuses ':'); set {set_by}")


def model_name(collection: str) -> str:
    """The registered model a collection's pipeline runs register their rounds under (`DataConfig.collection`: its
    `name`, else its folder's name)."""
    return f"ance-{Path(collection).name}"


def champion_checkpoint(work_dir: str | Path, collection: str, tracking_uri: str | None = None
                        ) -> tuple[str | None, str]:
    """`models:/ance-<dataset>@champion` as a local checkpoint folder (`registered_checkpoint`): (its folder,
    "models:/<name>@champion (version N)"), or (None, why) when there is none; a damaged store is an AnceError."""
    uri = f"models:/{model_name(collection)}@champion"
    store = resolve_tracking_uri(work_dir, tracking_uri)
    if (embedded := sqlite_file(store)) is not None and embedded.is_file():
        check_sqlite_store(store)  # (said as such, not as "no champion")
    try:
        return registered_checkpoint(work_dir, uri, tracking_uri)
    except AnceError as e:
        return None, str(e)


def registered_checkpoint(work_dir: str | Path, uri: str, tracking_uri: str | None = None) -> tuple[str, str]:
    """A registered version, `models:/<name>@<alias>` or `models:/<name>/<version>`, downloaded into
    <work_dir>/champion/<name>-v<version>-<run id>/ (once, atomically, under a lock: two runs starting from it get one
    whole copy), for a run to start from or evaluate. Returns (checkpoint folder, "<uri> (version N)"); an AnceError
    naming the URI when it is malformed, or the store, the version or its checkpoint is not there."""
    match = MODEL_URI.fullmatch(uri)
    if match is None:
        raise AnceError(f"{uri}: not a registered model URI; use models:/<name>@<alias> or models:/<name>/<version>")
    store = resolve_tracking_uri(work_dir, tracking_uri)
    # (a store that does not exist: opening it would create it, and the work folder)
    if (embedded := sqlite_file(store)) is not None and not embedded.is_file():
        raise AnceError(f"{uri}: not found ({embedded} does not exist: no run tracked to it yet)")
    check_sqlite_store(store)  # (a damaged store is said as such, not as "no such model")
    client, version = _find_version(uri, store, match["name"], match["alias"], match["version"])
    said = f"{uri} (version {version.version})"
    root = Path(work_dir).resolve() / "champion"
    # a version's number names another model once the registry is made anew (mlflow.db removed, another tracking
    # store on this work folder): its run names it too
    final = root / champion_folder(match["name"], version)
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(root / f".{final.name}.lock"):  # two runs starting from one version: one downloads it
        for left in root.glob(f".partial-{final.name}-*"):  # a download killed outright (none runs: the lock)
            shutil.rmtree(left, ignore_errors=True)
        if not _whole_checkpoint(final):
            tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".partial-{final.name}-"))  # (each download its own)
            try:
                folder = _download(client, version, uri, tmp)
                if not _whole_checkpoint(folder):  # registered while its files were spooled, or removed since
                    raise AnceError(f"{said} holds no whole checkpoint (run {version.run_id} logged none, the "
                                    "tracking server unreachable then, or its files were removed since)")
                shutil.rmtree(final, ignore_errors=True)  # (an incomplete copy: no run started from it)
                os.replace(folder, final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        if setting := (version.tags or {}).get("dev_split"):  # beside the checkpoint, not in it (its digest stays)
            write_json(final.parent / f"{final.name}.json", {"dev_setting": setting})
        with contextlib.suppress(OSError):  # (another user's copy in a shared work folder: read, not touched)
            os.utime(final)  # used now: `ance gc` keeps a copy used in the last hour (ance_core/retention.py)
    return str(final), said


def champion_folder(name: str, version) -> str:
    """The name of a registered version's copy in <work_dir>/champion/ (`champion_checkpoint`)."""
    return f"{name}-v{version.version}-{(version.run_id or 'norun')[:8]}"


def _whole_checkpoint(folder: str | Path) -> bool:
    """Whether `folder` holds every file a checkpoint computes with."""
    try:
        checkpoint_files(folder)  # (ance_model.json among them)
    except AnceError:
        return False
    return True


MODEL_URI = re.compile(r"models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>[0-9]+))")


def download_registered_model(uri: str, dest: str | Path, work_dir: str | Path = "work",
                              tracking_uri: str | None = None) -> tuple[str, dict[str, Any]]:
    """Download a registered version, `models:/<name>@<alias>` or `models:/<name>/<version>`, into `dest`.

    Returns (its checkpoint folder, provenance for the model card of ance_core/export/sentence_transformers.py):
    `source`, and what the registry and the run that trained it hold: `label`, `dataset`, `split`, `dev_split`,
    `metrics` (the version's tags, `register_models`), `params` and `results_markdown` (the pipeline run's parameters
    and results table). An AnceError when the URI is malformed or the store, the model or the version is not there."""
    match = MODEL_URI.fullmatch(uri)
    if match is None:
        raise AnceError(f"{uri}: not a registered model URI; use models:/<name>@<alias> or models:/<name>/<version>")
    store = resolve_tracking_uri(work_dir, tracking_uri)
    if (db := sqlite_file(store)) is not None and not db.is_file():
        raise AnceError(f"{uri}: no MLflow store at {db}; pass the --work-dir of the run that registered it, or set "
                        "MLFLOW_TRACKING_URI to its tracking server")
    client, version = _find_version(uri, store, match["name"], match["alias"], match["version"])
    folder = _download(client, version, uri, dest)
    tags = dict(version.tags)
    info: dict[str, Any] = {"source": f"{uri} (version {version.version}, run {version.run_id})"}
    info |= {k: tags[k] for k in ("label", "dataset", "split", "dev_split") if k in tags}
    info["metrics"] = {k: float(v) for k, v in tags.items() if k.removeprefix("dev_") in COLUMNS}
    return folder, info | _pipeline_run(client, tags.get(RUN_TAG, version.run_id))


def _find_version(uri: str, store: str, name: str, alias: str | None = None, number: str | None = None):
    """(client, model version) of `name` by alias or number; an AnceError naming `uri` when it is not there."""
    try:
        with store_lock(store):
            client = mlflow_client(store, registry_uri=store)
            version = (client.get_model_version_by_alias(name, alias) if alias
                       else client.get_model_version(name, number))
    except Exception as e:  # no such model, alias or version, or the tracking server is unreachable
        raise AnceError(f"{uri}: not found at {store} ({type(e).__name__}: {str(e)[:200]})") from None
    if not (version.source or "").startswith("runs:/"):
        raise AnceError(f"{uri}: version {version.version}'s files are at {version.source}, not a run's artifacts; "
                        "not a version this pipeline registered")
    return client, version


def _download(client: "MlflowClient", version, uri: str, dest: str | Path) -> str:
    """The version's checkpoint files (its source is runs:/<run id>/checkpoint, `register_models`) downloaded into
    `dest`: the model and its MLflow description, not a retrieval package (retraining and exporting use neither)."""
    from ance_core.export.hybrid import RETRIEVAL

    path = version.source.split("/", 3)[-1]
    try:
        folder = Path(dest) / path
        folder.mkdir(parents=True, exist_ok=True)
        for item in client.list_artifacts(version.run_id, path):
            if Path(item.path).name != RETRIEVAL:
                client.download_artifacts(version.run_id, item.path, str(folder))  # into folder/<its name>
        return str(folder)
    except Exception as e:
        raise AnceError(f"{uri}: downloading version {version.version} failed ({type(e).__name__}: "
                        f"{str(e)[:200]})") from None


def _pipeline_run(client: "MlflowClient", run_id: str) -> dict[str, Any]:
    """The parameters and results table of the pipeline run (the parent of a model's run); {} for what is missing."""
    out: dict[str, Any] = {}
    try:
        run = client.get_run(run_id)
        parent = run.data.tags.get("mlflow.parentRunId")
        pipeline = client.get_run(parent) if parent else run
        if pipeline.data.params:
            out["params"] = dict(pipeline.data.params)
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(client.download_artifacts(pipeline.info.run_id, "report/results.md", tmp)).read_text()
    except Exception:  # an older run, or a version registered by hand: the card says less
        return out
    lines = text.splitlines()
    start = next((k for k, line in enumerate(lines) if line.startswith("|")), None)
    if start is not None:
        end = next((k for k in range(start, len(lines)) if not lines[k].startswith("|")), len(lines))
        out["results_markdown"] = "\n".join(lines[start:end])
    return out


def dev_setting(split: str, digest: str, evaluation) -> str:
    """What a dev score was measured on, so a champion is compared only with a score of the same: the split, its
    content digest, and the evaluation's rule where it is not the default (identical ids kept: ArguAna's and
    Quora's queries then rank themselves first). Evaluation always searches an exact index, so nothing else enters."""
    return f"{split} {digest}" + ("" if evaluation.ignore_identical_ids else " identical ids kept")
