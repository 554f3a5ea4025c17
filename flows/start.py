"""Where a flow that needs a trained model starts (`retrain`, `compress`): a given checkpoint, else the registry's
champion, else the newest model of the work folder, which every pipeline run records in <work_dir>/latest.json."""

import json
import time
from pathlib import Path

from prefect.runtime import flow_run

from ance_core.artifacts import ArtifactRef, hold_refs, write_json
from ance_core.errors import AnceError, warn
from ance_core.modeling.model import checkpoint_ref
from tracking.registry import champion_checkpoint, registered_checkpoint

LATEST = "latest.json"


def record_latest(work_dir: str, checkpoint: ArtifactRef, label: str, metrics: dict, fusion: dict | None = None,
                  dev_setting: str | None = None, collection: str | None = None) -> None:
    """<work_dir>/latest.json names the newest run's result (its model chosen on the dev split): where `retrain` starts
    from when the registry has no champion. A hybrid result's `fusion` (method, weight) is what `ance search --hybrid`
    fuses the checkpoint's ranking with BM25's by; `dev_setting` the dev split it was chosen on (its training left
    those queries out)."""
    run = flow_run.get_id()
    write_json(Path(work_dir) / LATEST, {"checkpoint": checkpoint.path, "digest": checkpoint.digest, "model": label,
                                        "metrics": metrics, "flow_run_id": run,
                                        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
               | ({"fusion": fusion} if fusion is not None else {})
               | ({"dev_setting": dev_setting} if dev_setting else {})
               | ({"collection": collection} if collection else {}))


def start_dev_setting(work_dir: str | Path, start: str) -> str | None:
    """The dev split the model a run starts from was chosen on, where it is known: a champion downloaded for
    retraining (its version's tag) or the work folder's newest model (latest.json); None for any other checkpoint."""
    champion = Path(start).parent / f"{Path(start).name}.json"
    if Path(start).parent.name == "champion" and champion.is_file():
        return json.loads(champion.read_text()).get("dev_setting")
    latest = Path(work_dir) / LATEST
    if latest.is_file() and (record := json.loads(latest.read_text())).get("checkpoint") == str(start):
        return record.get("dev_setting")
    return None


REGISTERED = "models:/"


def local_checkpoint(work_dir: str | Path, checkpoint: str, named: str = "") -> str:
    """A checkpoint as a folder: a registered model's URI (`models:/<name>@<alias>`, `models:/<name>/<version>`, in
    the work folder's MLflow store or MLFLOW_TRACKING_URI's) downloaded once into <work_dir>/champion/ (said on
    stdout), any other value as it is. `named`: what a message calls it (e.g. "start_checkpoint ")."""
    if not str(checkpoint).startswith(REGISTERED):
        return checkpoint
    try:
        folder, source = registered_checkpoint(work_dir, str(checkpoint))
    except AnceError as e:
        raise AnceError(f"{named}{e}") from None
    print(f"{named or 'checkpoint '}{source}: {folder}")
    return folder


def with_local_start(config):
    """A pipeline config whose `start_checkpoint` is a registered model's URI, with its downloaded folder instead."""
    if not (start := config.start_checkpoint):
        return config
    return config.model_copy(update={"start_checkpoint": local_checkpoint(config.work_dir, start, "start_checkpoint ")})


def trained_checkpoint(work_dir: str | Path, collection: str, explicit: str | None = None,
                       setting: str = "--checkpoint") -> tuple[str, str]:
    """(checkpoint folder, where it came from): `explicit`, else the champion `models:/ance-<collection>@champion`
    (`DataConfig.collection`), else
    the newest model of the work folder (<work_dir>/latest.json, written by every pipeline run); an AnceError when
    there is none of them. `setting`: what the caller's user sets `explicit` with (a flag, a form's field), as its
    messages name it."""
    if explicit is not None:
        return local_checkpoint(work_dir, explicit, f"{setting} "), "the given checkpoint"
    start, source = champion_checkpoint(work_dir, collection)
    if start is not None:
        return start, source
    latest = Path(work_dir) / LATEST
    if not latest.is_file():
        raise AnceError(f"{source}, and {latest} does not exist: no trained model yet; train one first (ance run, or "
                        f"the ance-train deployment) or name a checkpoint ({setting})")
    record = json.loads(latest.read_text())
    if record.get("collection", collection) != collection:  # (a record from before it was written: as before)
        raise AnceError(f"{source}, and the newest model of the work folder ({latest}) was trained on "
                        f"'{record['collection']}', not '{collection}': name the checkpoint to start from "
                        f"({setting}), or train one on this collection first")
    print(f"{source}; using the newest model of the work folder instead")
    return record["checkpoint"], str(latest)


def warn_other_dev_split(work_dir: str | Path, start: str, setting: str) -> None:
    """A warning when the model a run starts from was chosen on a dev split other than this run's `setting`: a run
    leaves its own dev queries out of training, but not another split's, so the starting model may have trained on
    some of this run's dev queries (its dev score then reads high, and dev selection may keep it)."""
    chosen_on = start_dev_setting(work_dir, start)
    if chosen_on and chosen_on.split(" ")[:2] != setting.split(" ")[:2]:
        warn(f"the starting model {start} was chosen on another dev split ({chosen_on!r}; this run's: {setting!r}): it "
             "may have trained on some of this run's dev queries, so its dev score can read high and the run may keep "
             "it over a better model; keep the dev split fixed across retrains (data.dev_fraction, data.dev_seed), or "
             "start from a model of this dev split")


def held_checkpoint(path: str | Path, named: str = "") -> ArtifactRef:
    """The checkpoint folder `path` as a stage input (`checkpoint_ref`), recorded as used by the live run, so that a
    garbage collection meanwhile leaves it and `gc --keep-runs` keeps it with what the run builds from it; refused when
    it is incomplete or was removed. `named`: what the message calls it before its path (e.g. the config field)."""
    ref = checkpoint_ref(path)
    if not hold_refs(ref):
        raise AnceError(f"{named}{path}: the folder is incomplete or was removed (by a garbage collection?); train it "
                        "again or give another checkpoint")
    return ref
