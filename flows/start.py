"""Where a flow that needs a trained model starts (`retrain`, `compress`): a given checkpoint, else the registry's
champion, else the newest model of the work folder, which every pipeline run records in <work_dir>/latest.json."""

import json
import time
from pathlib import Path

from prefect.runtime import flow_run

from ance_core.artifacts import ArtifactRef, write_json
from ance_core.errors import AnceError
from tracking.registry import champion_checkpoint

LATEST = "latest.json"


def record_latest(work_dir: str, checkpoint: ArtifactRef, label: str, metrics: dict, fusion: dict | None = None
                  ) -> None:
    """<work_dir>/latest.json names the newest run's result (its model chosen on the dev split): where `retrain` starts
    from when the registry has no champion. A hybrid result's `fusion` (method, weight) is what `ance search --hybrid`
    fuses the checkpoint's ranking with BM25's by."""
    run = flow_run.get_id()
    write_json(Path(work_dir) / LATEST, {"checkpoint": checkpoint.path, "digest": checkpoint.digest, "model": label,
                                        "metrics": metrics, "flow_run_id": run,
                                        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
               | ({"fusion": fusion} if fusion is not None else {}))


def trained_checkpoint(work_dir: str | Path, collection: str, explicit: str | None = None) -> tuple[str, str]:
    """(checkpoint folder, where it came from): `explicit`, else the champion `models:/ance-<collection>@champion`
    (`DataConfig.collection`), else
    the newest model of the work folder (<work_dir>/latest.json, written by every pipeline run); an AnceError when
    there is none of them."""
    if explicit is not None:
        return explicit, "the given checkpoint"
    start, source = champion_checkpoint(work_dir, collection)
    if start is not None:
        return start, source
    latest = Path(work_dir) / LATEST
    if not latest.is_file():
        raise AnceError(f"{source}, and {latest} does not exist: no trained model yet; train one first (ance run, or "
                        "the ance-train deployment) or name a checkpoint (--checkpoint)")
    print(f"{source}; using the newest model of the work folder instead")
    return json.loads(latest.read_text())["checkpoint"], str(latest)
